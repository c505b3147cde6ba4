#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
MODES=auto timeout 240 $S wan22-720p $OUT 1,2 > /dev/null; echo "wan22 t=$(el)"
MODES=auto timeout 150 $S wan21-480p $OUT 1,2 > /dev/null; echo "480 t=$(el)"
timeout 80 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile1 rc=$? t=$(el)"
L=$(( 560 - $(el) ))
[ $L -gt 50 ] && { timeout $L torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-480p --frames 21 --timeline > $OUT/timeline2_480p.log 2>&1; echo "timeline480 rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; grep -E '^(auto|diffusers) ' $f | cut -c1-150; done
grep -E "^\[rank|^  " $OUT/profile1.log | head -14
grep -A25 "^timeline per" $OUT/timeline2_480p.log | tail -8
exit 0
