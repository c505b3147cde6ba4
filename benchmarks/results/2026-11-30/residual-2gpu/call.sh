#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
ANCHORS=1 MODES=auto,spatial_shard_height,spatial_shard_width timeout 300 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 2 > /dev/null; echo "scaling720 t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting triton_convs --values true,false --rounds 3 > $OUT/ab_720p_2gpu.log 2>&1; echo "ab rc=$? t=$(el)"
[ $(el) -lt 430 ] && { MODES=auto EXTRA=--no-ref timeout 90 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 2 > /dev/null; echo "scaling480 t=$(el)"; }
rm -f $OUT/*.png
grep -E "^(auto|spatial|diffusers)" $OUT/scaling_*.txt | cut -c1-160
cut -c1-330 $OUT/anchors_*.jsonl 2>/dev/null | sed 's/"torch".*"median_s"/ ... "median_s"/'
grep -A2 interleaved $OUT/ab_720p_2gpu.log
exit 0
