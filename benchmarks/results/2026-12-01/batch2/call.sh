#!/usr/bin/env bash
# GPU parity of the committed library with two samples in one request (box_conv's TMA stores of samples that follow each other's frames), 1 and 2 GPUs, fp32 and bf16
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=2,16,5,30,64" --out /tmp/p1.jsonl > $OUT/parity_batch2_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"
timeout 120 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --shapes "wan21=2,16,5,30,64" --out /tmp/p2.jsonl > $OUT/parity_batch2_2gpu.log 2>&1; echo "parity2 rc=$? t=$(el)"
grep -hE "^wan21" $OUT/parity_*.log | cut -c1-160
exit 0
