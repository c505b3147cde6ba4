#!/usr/bin/env bash
# 1 GPU: where a share's kernel time does not halve (480p and 720p), and CUDA graphs for rank 1 of 3 at 720p
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; git log -1 --format=%h 2>/dev/null; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 1,2 --kernel-profile --top 25 --reps 3 > $OUT/kprof_480p.log 2>&1; echo "480p rc=$?"
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 1,2 --kernel-profile --top 25 --reps 3 > $OUT/kprof_720p.log 2>&1; echo "720p rc=$?"
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 3 --cuda-graphs auto,on,auto,on --reps 3 > $OUT/share3_graphs.log 2>&1; echo "3 rc=$?"
grep -E "rank\(s\)|Error|profiled|    [a-z]" $OUT/kprof_480p.log | head -40
grep -E "rank\(s\)|Error" $OUT/kprof_720p.log $OUT/share3_graphs.log
