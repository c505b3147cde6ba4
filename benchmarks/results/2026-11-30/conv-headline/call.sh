#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u; git log -1 --format=%H 2>/dev/null) > $OUT/env.txt 2>&1
ANCHORS=1 MODES=auto timeout 330 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "scaling720 t=$(el)"
[ $(el) -lt 400 ] && { MODES=auto timeout 110 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1,2 > /dev/null; echo "scaling480 t=$(el)"; }
[ $(el) -lt 480 ] && { TAG=cudnn EXTRA="--no-ref --no-triton-convs" MODES=auto timeout 70 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 2 > /dev/null; echo "480 cudnn t=$(el)"; }
rm -f $OUT/*.png $OUT/*_cudnn.json
grep -E "^(auto|diffusers|ref)" $OUT/scaling_*.txt | cut -c1-150
cat $OUT/anchors_*.jsonl 2>/dev/null | cut -c1-300
exit 0
