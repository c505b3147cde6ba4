#!/usr/bin/env bash
# call107's out-of-memory with the cached blocks given back before the capture (graphs.py)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u) > $OUT/env.txt 2>&1
A="--models wan22 --dtypes bf16 --modes auto --frames-per-step 1 --shapes wan22=2,48,5,22,40 --out /tmp/p.jsonl"
timeout 110 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py $A > $OUT/parity_fixed.log 2>&1; echo "fixed rc=$?"
grep -hE "^wan2|OutOfMemory" $OUT/parity_fixed.log | cut -c1-300
exit 0
