#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 75 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile1 rc=$? t=$(el)"
timeout 75 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 > $OUT/profile2.log 2>&1; echo "profile2 rc=$? t=$(el)"
grep -E "wall|GPU idle" $OUT/profile1.log $OUT/profile2.log | cut -c1-220
grep -A30 "time by kernel class" $OUT/profile1.log | cut -c1-150
grep -A12 "time by kernel class" $OUT/profile2.log | cut -c1-150
exit 0
