#!/usr/bin/env bash
# The upsamplers by phases everywhere (the Triton upsampling kernel removed): Wan 2.1 720p with diffusers in the same call, 480p, GPU parity (one and two samples), profiles of Wan 2.1 and Wan 2.2 720p
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan21 t=$(el)"
MODES=auto EXTRA=--no-ref timeout 60 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1 >> $OUT/err.log 2>&1; echo "scaling 480p t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21,wan22 --dtypes bf16,fp32 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity rc=$? t=$(el)"
timeout 60 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=2,16,5,30,64" --out /tmp/p2.jsonl > $OUT/parity_batch2_1gpu.log 2>&1; echo "parity batch2 rc=$? t=$(el)"
[ $(el) -lt 380 ] && { timeout 70 python3 benchmarks/profile_decode.py --preset wan22-720p --frames 31 --vaeshard --memory --top 16 > $OUT/profile1_wan22.log 2>&1; echo "profile wan22 t=$(el)"; }
[ $(el) -lt 470 ] && { timeout 60 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard --memory --top 16 > $OUT/profile1_wan21.log 2>&1; echo "profile wan21 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt 2>/dev/null; rm -f $OUT/scaling_*.txt
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-170
grep -hE "^wan2" $OUT/parity_*.log | cut -c1-160
for p in $OUT/profile1_*.log; do echo "== $(basename $p)"; grep -E "wall|^  [a-z]|peak" $p | cut -c1-200 | head -14; done
exit 0
