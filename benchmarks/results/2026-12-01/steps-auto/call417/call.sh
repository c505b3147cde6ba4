#!/usr/bin/env bash
# 1 GPU, commit 1fc13e2+docs (library as 660c947): kept_graphs.py after its request-11 and baseline fixes; Wan 2.2 720p
# rank 1 of 4 and Wan 2.1 480p rank 1 of 4 with frames_per_step auto against 1, interleaved
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; git rev-parse HEAD; python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/kept_graphs.py > $OUT/kept_graphs.log 2>&1; echo "kept rc=$? t=$SECONDS"
timeout 200 python3 benchmarks/rank_alone.py --preset wan22-720p --ranks 4 --frames-per-step auto,1,auto,1 --reps 3 > $OUT/auto_wan22_4.log 2>&1; echo "wan22 rc=$? t=$SECONDS"
timeout 120 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 4 --frames-per-step auto,1,auto,1 --reps 5 > $OUT/auto_480p_4.log 2>&1; echo "480p/4 rc=$? t=$SECONDS"
grep -vE "Warning|_warn_once|should be kept" $OUT/kept_graphs.log | cut -c1-120
grep -hE "rank\(s\)|Error|error" $OUT/auto_*.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/; s/, default parts on//' | cut -c1-200
exit 0
