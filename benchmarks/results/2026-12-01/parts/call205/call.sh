#!/usr/bin/env bash
# 1 GPU: a rank's share with the communication stood in: CUDA graphs and the default parts, on and off
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 130 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 1,2 --cuda-graphs auto,on --parts on,off --reps 3 > $OUT/rank_alone_wan21-720p.log 2>&1; echo "720p rc=$?"
timeout 70 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --cuda-graphs auto,off --parts on,off --reps 3 > $OUT/rank_alone_wan21-480p.log 2>&1; echo "480p rc=$?"
for f in $OUT/rank_alone_*.log; do echo "== $f"; grep -E "rank\(s\)|Error" $f | sed 's/, first row.*//'; done
exit 0
