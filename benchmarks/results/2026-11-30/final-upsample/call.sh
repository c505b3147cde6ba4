#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; git log --oneline -1 2>/dev/null; date -u) > $OUT/env.txt 2>&1
ANCHORS=1 MODES=auto timeout 300 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > $OUT/err.log 2>&1; echo "scaling720 t=$(el)"
[ $(el) -lt 400 ] && { MODES=auto EXTRA=--no-ref timeout 70 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1,2 >> $OUT/err.log 2>&1; echo "scaling480 t=$(el)"; }
[ $(el) -lt 430 ] && { MODES=auto EXTRA=--no-ref timeout 130 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1,2 >> $OUT/err.log 2>&1; echo "scaling22 t=$(el)"; }
rm -f $OUT/*.png
grep -E "^(auto|diffusers)" $OUT/scaling_*.txt | cut -c1-160
cut -c1-330 $OUT/anchors_*.jsonl 2>/dev/null | sed 's/"torch".*"median_s"/ ... "median_s"/'
exit 0
