#!/usr/bin/env bash
# 1 GPU: rank 1 of 3 (neighbours on both sides: two edge norms per part), parts on/off, interleaved
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 3 --parts on,off,on,off --reps 3 > $OUT/share3_720p.log 2>&1; echo "rc=$?"
grep -E "rank\(s\)|Error" $OUT/share3_720p.log
