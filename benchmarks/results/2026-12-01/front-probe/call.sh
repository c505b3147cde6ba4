#!/usr/bin/env bash
# why box_conv reading the cache apart ran slower alone at 720p on 1 GPU (front.log): variants in one process
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 200 python3 .ab/front_probe.py > $OUT/front_probe.log 2>&1; echo "probe rc=$? t=$(el)"
cat $OUT/front_probe.log | grep -v Warn
exit 0
