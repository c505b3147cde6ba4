#!/usr/bin/env bash
# box_conv with 192 channels in PLANS: alone with the residual / the norm; its norm epilogue in the decode (interleaved); 192 on box vs the Triton kernel at 480p; GPU parity
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u; git log -1 --format=%H 2>/dev/null) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/conv_kernel.py --norm --only "720p/2" > $OUT/conv_norm192.log 2>&1; echo "norm rc=$? t=$(el)"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/conv_kernel.py --residual --only "/2" > $OUT/conv_res192.log 2>&1; echo "res rc=$? t=$(el)"
N='vaeshard.conv_kernel:norms_in_epilogue=lambda how: not how.box or how.block_n == 128'
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$N" --rounds 4 > $OUT/ab_norm192_720p_1gpu.log 2>&1; echo "abn1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$N" --rounds 4 > $OUT/ab_norm192_720p_2gpu.log 2>&1; echo "abn2 rc=$? t=$(el)"
P='vaeshard.box_conv:PLANS={96: vaeshard.box_conv.PLAN}'
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_192_480p_2gpu.log 2>&1; echo "ab480 rc=$? t=$(el)"
CUDA_VISIBLE_DEVICES=0 timeout 80 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --out /tmp/p2.jsonl > $OUT/parity_2gpu.log 2>&1; echo "parity2 rc=$? t=$(el)"
grep -E "^(720p|480p)" $OUT/conv_*.log | cut -c1-140
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -v "Casting\|^W1\|^\[W" $OUT/parity_1gpu.log | grep -v "^ *$" | tail -6 | cut -c1-200
grep -v "Casting\|^W1\|^\[W" $OUT/parity_2gpu.log | grep -v "^ *$" | tail -8 | cut -c1-200
exit 0
