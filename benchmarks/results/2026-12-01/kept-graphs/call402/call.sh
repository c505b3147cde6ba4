#!/usr/bin/env bash
# 1 GPU: where the 480p share's GPU waits (graphs auto against off), capture time
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 250 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --cuda-graphs auto,off,auto --kernel-profile --top 6 --debug-log --reps 3 > $OUT/idle_480p.log 2>&1; echo "480p rc=$?"
grep -vE "^     0\.|UserWarning|_warn_once" $OUT/idle_480p.log | cut -c1-250 | head -60
