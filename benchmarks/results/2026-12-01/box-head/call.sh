#!/usr/bin/env bash
# the head's 96 -> 3 convolution on box_conv: alone (tilings), in the decode (interleaved against cuDNN), GPU parity of the library with it, a 1-GPU profile
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/conv_kernel.py --box-sweep --only head > $OUT/box_head.log 2>&1; echo "sweep rc=$? t=$(el)"
P='vaeshard.box_conv:PLANS={96: vaeshard.box_conv.PLANS[96], 192: vaeshard.box_conv.PLANS[192]}'
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_head_720p_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_head_720p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$P" --rounds 5 > $OUT/ab_head_480p_2gpu.log 2>&1; echo "ab480 rc=$? t=$(el)"
CUDA_VISIBLE_DEVICES=0 timeout 80 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --out /tmp/p2.jsonl > $OUT/parity_2gpu.log 2>&1; echo "parity2 rc=$? t=$(el)"
[ $(el) -lt 440 ] && { CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile1 rc=$? t=$(el)"; }
grep -E "^head" $OUT/box_head.log | cut -c1-140
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -v "Casting\|^W1\|^\[W" $OUT/parity_1gpu.log | grep -E "^wan21" | cut -c1-200
grep -v "Casting\|^W1\|^\[W" $OUT/parity_2gpu.log | grep -E "^wan21" | cut -c1-200
head -40 $OUT/profile1.log | cut -c1-160
exit 0
