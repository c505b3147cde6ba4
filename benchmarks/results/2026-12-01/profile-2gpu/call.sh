#!/usr/bin/env bash
# the current library on 2 GPUs: a whole-decode profile per rank (Wan 2.1 720p) and the per-call timeline at 480p
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 > $OUT/profile2.log 2>&1; echo "profile2 rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-480p --frames 21 --timeline > $OUT/timeline2_480p.log 2>&1; echo "timeline rc=$? t=$(el)"
grep -E "wall|^  [a-z]|^ +0\.[0-9]+ s" $OUT/profile2.log | head -40 | cut -c1-170
grep -E "wall|call" $OUT/timeline2_480p.log | head -30 | cut -c1-170
exit 0
