#!/usr/bin/env bash
# 1 GPU, commit after 44cb57a (gpu_parity.py with qwenimage): Qwen-Image GPU parity (its decoder's head runs
# wan.FastCoderHead too); Wan 2.1 two samples where the head's caches are per sample
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
timeout 150 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models qwenimage --out $OUT/parity_qwen.jsonl > $OUT/parity_qwen.log 2>&1; echo "qwen rc=$? t=$SECONDS"
timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=2,16,5,72,72" --out $OUT/parity_batch2.jsonl > $OUT/parity_batch2.log 2>&1; echo "batch2 rc=$? t=$SECONDS"
grep -hE "^qwen|^wan2" $OUT/parity_qwen.log $OUT/parity_batch2.log | cut -c1-200
exit 0
