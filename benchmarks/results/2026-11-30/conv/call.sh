#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/conv_kernel.py --sweep --json $OUT/conv_kernel.json > $OUT/conv_kernel.log 2>&1; echo "conv rc=$? t=$(el)"
MODES=auto,spatial_shard_height timeout 200 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "720 triton t=$(el)"
TAG=cudnn EXTRA="--no-ref --no-triton-convs" MODES=auto,spatial_shard_height timeout 150 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "720 cudnn t=$(el)"
L=$(( 520 - $(el) ))
[ $L -gt 40 ] && { timeout $L torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --modes auto,spatial_shard_height,spatial_shard_width --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
rm -f $OUT/*.png
tail -12 $OUT/conv_kernel.log | cut -c1-110
grep -E "^(auto|spatial|diffusers|ref)" $OUT/scaling_*.txt | cut -c1-140
grep -E "^wan" $OUT/parity.log | cut -c1-130
exit 0
