#!/usr/bin/env bash
# box_conv TMA stores: the 96-channel plan's (now the default) against its rows in registers and the old plan; the 192-channel plan with TMA stores; alone and in the decode interleaved
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=1 timeout 120 python3 benchmarks/conv_kernel.py --box-sweep --residual --only 720p > $OUT/box_sweep_residual.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/conv_kernel.py --box-sweep --only 720p > $OUT/box_sweep.log 2>&1; echo "sweep rc=$? t=$(el)"
wait; echo "sweep residual t=$(el)"
P='vaeshard.box_conv:PLANS={**vaeshard.box_conv.PLANS, 192: vaeshard.box_conv.PLANS[192]._replace(stages=3, tma_out=True)}'
CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_tma192_720p_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_tma192_720p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
P='vaeshard.box_conv:PLANS={**vaeshard.box_conv.PLANS, 96: vaeshard.box_conv.PLANS[96]._replace(a_regs=True)}'
CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_regs96_720p_1gpu.log 2>&1; echo "ab3 rc=$? t=$(el)"
grep -E "box" $OUT/box_sweep*.log | grep -v "head\|Wan 2.2\|/4\|/8" | cut -c1-160
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
exit 0
