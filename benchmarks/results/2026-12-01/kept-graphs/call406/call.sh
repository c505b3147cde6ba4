#!/usr/bin/env bash
# 1 GPU: keep_cuda_graphs: bits (a shorter last call included); shares of 4 and 8 ranks; the 480p share's kernels when kept
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 200 python3 benchmarks/kept_graphs.py > $OUT/kept_bits.log 2>&1; echo "bits rc=$?"
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 4,8 --cuda-graphs auto,keep,auto,keep --reps 5 > $OUT/kept_720p_4_8.log 2>&1; echo "a rc=$?"
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --cuda-graphs keep --kernel-profile --top 8 --reps 5 > $OUT/kept_480p_kprof.log 2>&1; echo "b rc=$?"
grep -vE "Warning|_warn_once|should be kept" $OUT/kept_bits.log | cut -c1-200
grep -hE "rank\(s\)|Error|error|after release|profiled|GPU idle|largest" $OUT/kept_720p_4_8.log $OUT/kept_480p_kprof.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/' | cut -c1-300
