#!/usr/bin/env bash
# The out-of-memory of call104 again (Wan 2.2 two samples, fast tier, first variant), with and without the upsamplers by phases
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u) > $OUT/env.txt 2>&1
A="--models wan22 --dtypes bf16 --modes auto --frames-per-step 1 --shapes wan22=2,48,5,22,40 --out /tmp/p.jsonl"
timeout 85 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py $A > $OUT/parity_phases.log 2>&1; echo "phases rc=$?"
timeout 85 torchrun --standalone --nproc_per_node=1 .ab/parity_nophases.py $A > $OUT/parity_nophases.log 2>&1; echo "nophases rc=$?"
for f in $OUT/parity_*.log; do echo "== $f"; grep -hE "^wan2|OutOfMemory" $f | cut -c1-330; done
exit 0
