#!/usr/bin/env bash
# box_conv with its multiplies no longer serialised: alone (no bias, + residual, + norm), the decode against the serialised kernel (interleaved), the norm in its epilogue again (interleaved)
set -uo pipefail
# .ab/box_conv_serial.py, made before the call (here): box_conv.py before the accumulators' move, importable on its own
#   git show 360f1f5:src/vaeshard/box_conv.py | sed -e 's/from \. import norm_math/from vaeshard import norm_math/' \
#     -e 's/from \.triton_support import triton/from vaeshard.triton_support import triton/' > .ab/box_conv_serial.py
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/.ab PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 70 python3 benchmarks/conv_kernel.py --only "720p" > $OUT/conv_plain.log 2>&1; echo "plain rc=$? t=$(el)"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/conv_kernel.py --norm --only "720p" > $OUT/conv_norm.log 2>&1; echo "norm rc=$? t=$(el)"
S="vaeshard.box_conv:_box_conv_kernel=__import__('box_conv_serial')._box_conv_kernel"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$S" --rounds 4 > $OUT/ab_serial_720p_1gpu.log 2>&1; echo "abs1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$S" --rounds 4 > $OUT/ab_serial_720p_2gpu.log 2>&1; echo "abs2 rc=$? t=$(el)"
N='vaeshard.conv_kernel:norms_in_epilogue=lambda how: True'
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$N" --rounds 4 > $OUT/ab_norm_720p_1gpu.log 2>&1; echo "abn1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$N" --rounds 4 > $OUT/ab_norm_720p_2gpu.log 2>&1; echo "abn2 rc=$? t=$(el)"
grep -E "^(720p|head)" $OUT/conv_*.log | cut -c1-140
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
exit 0
