#!/usr/bin/env bash
# 1 GPU: parts at smaller frames (the half-resolution levels; the 480p share), interleaved
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --parts-from-pixels 393216,131072,32768,393216,131072,32768 --reps 5 > $OUT/thr_480p_share.log 2>&1; echo "a rc=$?"
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 1 --parts-from-pixels 262144,32768,262144,32768 --reps 3 > $OUT/thr_480p_1.log 2>&1; echo "b rc=$?"
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 2 --parts-from-pixels 393216,65536,393216,65536 --reps 3 > $OUT/thr_720p_share.log 2>&1; echo "c rc=$?"
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 1 --parts-from-pixels 262144,65536,262144,65536 --reps 3 > $OUT/thr_720p_1.log 2>&1; echo "d rc=$?"
grep -hE "rank\(s\)|Error" $OUT/thr_*.log | sed -E 's/ \(its thread[^)]*\)//; s/, first row.*//' | cut -c1-230
