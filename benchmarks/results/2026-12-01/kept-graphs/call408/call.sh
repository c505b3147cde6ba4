#!/usr/bin/env bash
# 1 GPU: kept graphs with the first call's caches in the steady graph's last frames too: bits, memory, time
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/kept_graphs.py > $OUT/kept_bits.log 2>&1; echo "bits rc=$?"
timeout 120 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --cuda-graphs keep,auto,keep --reps 5 > $OUT/kept_480p_share.log 2>&1; echo "a rc=$?"
grep -vE "Warning|_warn_once|should be kept" $OUT/kept_bits.log | cut -c1-200
grep -hE "rank\(s\)|Error|error|after release" $OUT/kept_480p_share.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/' | cut -c1-300
