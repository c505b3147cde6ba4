#!/usr/bin/env bash
# halo rows sent in the buffer's own order of dimensions (channels innermost) against the default order (transposed): A/B, 2 GPUs
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
PATCH='vaeshard.comm:_exchange_order=lambda buf: tuple(range(buf.ndim))'
timeout 130 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$PATCH" --rounds 6 > $OUT/ab_order_720p.log 2>&1; echo "ab720 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$PATCH" --rounds 7 > $OUT/ab_order_480p.log 2>&1; echo "ab480 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting mode --values spatial_shard_width,spatial_shard_height --rounds 4 > $OUT/ab_axis_720p.log 2>&1; echo "axis rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 > $OUT/profile2.log 2>&1; echo "profile2 rc=$? t=$(el)"
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-250
grep -E "wall" $OUT/profile2.log | cut -c1-220
grep -A12 "time by kernel class" $OUT/profile2.log | cut -c1-150
exit 0
