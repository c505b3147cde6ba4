#!/usr/bin/env bash
# vaeshard's 1-GPU decode (Wan 2.1 720p): per-call timeline with the SM clock and power logged
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 20 > $OUT/clocks1.csv 2>&1 & SMI=$!
echo "start $(date -u +%T.%N)" > $OUT/marks1.txt
timeout 100 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard --timeline > $OUT/timeline1_vaeshard.log 2>&1; echo "timeline1 rc=$? t=$(el)"
echo "end $(date -u +%T.%N)" >> $OUT/marks1.txt
kill $SMI
grep -E "wall" $OUT/timeline1_vaeshard.log | cut -c1-200
grep -A24 "^call |" $OUT/timeline1_vaeshard.log | cut -c1-120
exit 0
