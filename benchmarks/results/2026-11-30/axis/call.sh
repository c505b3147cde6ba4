#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 80 torchrun --standalone --nproc_per_node=2 .ab/ab_axis.py --preset wan21-720p --rounds 3 > $OUT/ab_axis.log 2>&1; echo "axis720 rc=$? t=$(el)"
timeout 60 torchrun --standalone --nproc_per_node=2 .ab/ab_axis.py --preset wan21-480p --rounds 3 >> $OUT/ab_axis.log 2>&1; echo "axis480 rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 5 --mode spatial_shard_width > $OUT/profile2_width.log 2>&1; echo "prof w rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 5 --mode spatial_shard_height > $OUT/profile2_height.log 2>&1; echo "prof h rc=$? t=$(el)"
[ $(el) -lt 400 ] && { timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-480p --frames 21 --timeline > $OUT/timeline2_480p.log 2>&1; echo "timeline rc=$? t=$(el)"; }
grep -v Warn $OUT/ab_axis.log | grep -E "^(wan|  )"
for f in $OUT/profile2_width.log $OUT/profile2_height.log; do echo "== $f"; grep -E "^\[rank" $f | cut -c1-250; grep -A7 "time by kernel class" $f | head -16; done
grep -iE "steady|per call|median" $OUT/timeline2_480p.log | head -12
exit 0
