#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
S="bash benchmarks/gpu_scaling.sh"
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())"; date -u) > $OUT/env.txt 2>&1
TAG=head EXTRA=--no-ref MODES=auto timeout 100 $S wan21-480p $OUT 1,2 > /dev/null
rm -f $OUT/*.png
grep -E "^auto" $OUT/scaling_*.txt | cut -c1-150
exit 0
