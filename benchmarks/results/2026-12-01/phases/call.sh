#!/usr/bin/env bash
# The upsamplers' 3x3 convolution by phases (upsample.py): per-shape timings against the upsampled copy + cuDNN and the Triton kernel; Wan 2.2 and Wan 2.1 720p decodes interleaved with and without it; GPU parity; Wan 2.2 720p with diffusers in the same call
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u; git log -1 --format=%H 2>/dev/null) > $OUT/env.txt 2>&1
timeout 90 python3 benchmarks/upsample_phases.py > $OUT/upsample_phases.log 2>&1; echo "micro rc=$? t=$(el)"
timeout 120 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting patch --values off,on --patch "vaeshard.fast:upsample_by_phases=lambda x: False" --rounds 3 > $OUT/ab_phases_wan22_1gpu.log 2>&1; echo "ab wan22 rc=$? t=$(el)"
timeout 80 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "vaeshard.fast:upsample_kernel_available=lambda x: False" --rounds 3 > $OUT/ab_phases_vs_kernel_wan21_1gpu.log 2>&1; echo "ab wan21 rc=$? t=$(el)"
[ $(el) -lt 330 ] && { timeout 70 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22,wan21 --dtypes bf16 --modes auto --out /tmp/p.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity rc=$? t=$(el)"; }
[ $(el) -lt 400 ] && { MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan22 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt 2>/dev/null; rm -f $OUT/scaling_*.txt
cat $OUT/upsample_phases.log | grep -v Warn | cut -c1-170
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -hE "^wan2" $OUT/parity_*.log | cut -c1-160
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-170
exit 0
