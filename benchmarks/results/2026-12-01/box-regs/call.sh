#!/usr/bin/env bash
# box_conv with the input rows in registers (a_regs): alone (tilings), in the decode interleaved, Nsight Compute on both
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/conv_kernel.py --box-sweep > $OUT/box_sweep.log 2>&1; echo "sweep rc=$? t=$(el)"
P='vaeshard.box_conv:PLANS={**vaeshard.box_conv.PLANS, 96: vaeshard.box_conv.PLANS[96]._replace(a_regs=True), 192: vaeshard.box_conv.PLANS[192]._replace(a_regs=True)}'
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_regs_720p_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_regs_720p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$P" --rounds 5 > $OUT/ab_regs_480p_2gpu.log 2>&1; echo "ab480 rc=$? t=$(el)"
if command -v ncu >/dev/null && [ $(el) -lt 470 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 90 ncu --clock-control none -k regex:_box_conv_kernel --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 .ab/ncu_box.py > $OUT/ncu_box.txt 2>&1; echo "ncu rc=$? t=$(el)"
fi
grep -E "box" $OUT/box_sweep.log | cut -c1-150
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -E "Shared|Throughput|Pipe|Duration|Issue|L1" $OUT/ncu_box.txt 2>/dev/null | head -40 | cut -c1-150
exit 0
