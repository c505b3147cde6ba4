#!/usr/bin/env bash
# box_conv reading the cache apart (front-probe/ found it slower alone): the branch alone, or the descriptors' order? Variants in one process
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
python3 .ab/make_variants.py
timeout 300 python3 .ab/front_probe2.py > $OUT/front_probe2.log 2>&1; echo "probe rc=$? t=$(el)"
grep -v Warn $OUT/front_probe2.log
exit 0
