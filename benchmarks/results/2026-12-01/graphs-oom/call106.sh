#!/usr/bin/env bash
# A graphed request after other work left the default pool holding most of the GPU cached: out of memory without releasing it first, decoded with graphs.release_cached_memory
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; date -u) > $OUT/env.txt 2>&1
timeout 60 python3 .ab/oom_repro.py off > $OUT/repro_off.log 2>&1; echo "off rc=$?"
timeout 60 python3 .ab/oom_repro.py on > $OUT/repro_on.log 2>&1; echo "on rc=$?"
timeout 60 python3 .ab/oom_repro.py eager > $OUT/repro_eager.log 2>&1; echo "eager rc=$?"
grep -h "^release" $OUT/repro_*.log | cut -c1-220
exit 0
