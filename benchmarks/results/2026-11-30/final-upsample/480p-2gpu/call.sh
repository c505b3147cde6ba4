#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
TAG=2gpu MODES=auto EXTRA=--no-ref timeout 150 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 2 > $OUT/err.log 2>&1; echo "scaling480 rc=$? t=$(el)"
rm -f $OUT/*.png
grep -E "^(auto|diffusers)" $OUT/scaling_*.txt | cut -c1-160
exit 0
