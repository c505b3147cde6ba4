#!/usr/bin/env bash
# box_conv without the norm in its epilogue: GPU parity on 1 and 2 GPUs; the decode with and without box_conv, interleaved
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
P='vaeshard.box_conv:available=lambda: False'
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 3 > $OUT/ab_box_720p_1gpu.log 2>&1; echo "ab720-1 rc=$? t=$(el)"
timeout 110 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 3 > $OUT/ab_box_720p_2gpu.log 2>&1; echo "ab720-2 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_box_480p_2gpu.log 2>&1; echo "ab480-2 rc=$? t=$(el)"
CUDA_VISIBLE_DEVICES=0 timeout 80 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --out /tmp/p2.jsonl > $OUT/parity_2gpu.log 2>&1; echo "parity2 rc=$? t=$(el)"
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-200
grep -v "Casting\|^W1\|^\[W" $OUT/parity_1gpu.log | grep -v "^ *$" | tail -8 | cut -c1-220
grep -v "Casting\|^W1\|^\[W" $OUT/parity_2gpu.log | grep -v "^ *$" | tail -10 | cut -c1-220
exit 0
