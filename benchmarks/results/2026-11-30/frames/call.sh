#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 100 torchrun --standalone --nproc_per_node=2 .ab/ab_frames.py --preset wan21-720p --rounds 4 > $OUT/ab_frames_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
[ $(el) -lt 110 ] && { timeout 60 torchrun --standalone --nproc_per_node=2 .ab/ab_frames.py --preset wan21-480p --rounds 4 >> $OUT/ab_frames_2gpu.log 2>&1; echo "ab2-480 rc=$? t=$(el)"; }
grep -v Warn $OUT/ab_frames_2gpu.log | grep -E "(wan|  )" | cut -c1-300
exit 0
