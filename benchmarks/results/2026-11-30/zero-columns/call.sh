#!/usr/bin/env bash
# zero columns (the Triton kernel's wrapping tiles on unsharded widths its row tiles do not fit): A/B
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; date -u) > $OUT/env.txt 2>&1
P='--setting patch --values off,on --patch vaeshard.fast:zero_columns=lambda*a:False'
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p $P --rounds 6 > $OUT/ab_zero_columns_480p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
timeout 80 python3 benchmarks/interleaved_ab.py --preset wan21-480p $P --rounds 4 > $OUT/ab_zero_columns_480p_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting mode --values spatial_shard_height,spatial_shard_width --rounds 5 > $OUT/ab_axis_480p.log 2>&1; echo "axis rc=$? t=$(el)"
timeout 60 python3 benchmarks/conv_kernel.py --only 480p > $OUT/conv_kernel_480p.log 2>&1; echo "conv rc=$? t=$(el)"
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-250
grep -v Warn $OUT/conv_kernel_480p.log | cut -c1-200
exit 0
