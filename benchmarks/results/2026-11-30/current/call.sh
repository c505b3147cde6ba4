#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
S="bash benchmarks/gpu_scaling.sh"
B=$PWD/.ab/base/src
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
MODES=auto timeout 230 $S wan22-720p $OUT 1,2 > /dev/null; echo "wan22 t=$(el)"
MODES=auto timeout 110 $S wan21-480p $OUT 1,2 > /dev/null; echo "480 t=$(el)"
TAG=head EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 1 > /dev/null; echo "720x1 head t=$(el)"
SRC=$B TAG=base EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 1 > /dev/null; echo "720x1 base t=$(el)"
[ $(el) -lt 450 ] && { TAG=head2 EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 1 > /dev/null; echo "720x1 head2 t=$(el)"; }
[ $(el) -lt 500 ] && { SRC=$B TAG=base2 EXTRA=--no-ref MODES=auto timeout 60 $S wan21-720p $OUT 1 > /dev/null; echo "720x1 base2 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; grep -E "^(auto|diffusers)" $f | cut -c1-150; done
cd $OUT && tar czf scaling.tgz scaling_*.json scaling_*.txt && rm -f scaling_*.json scaling_*.txt
exit 0
