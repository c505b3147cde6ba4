#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 150 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 6 --host-profile --timeline --top 45 > $OUT/host2.log 2>&1; echo "host2 rc=$? t=$(el)"
grep -v "^W11\|Warn\|warn" $OUT/host2.log | grep -A200 "timeline per" | head -12 | cut -c1-150
grep -A60 "by tottime" $OUT/host2.log | cut -c1-160 | head -62
exit 0
