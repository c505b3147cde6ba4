#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 120 python3 benchmarks/conv_kernel.py --only head --sweep --json $OUT/conv_head.json > $OUT/conv_head.log 2>&1; echo "conv head rc=$? t=$(el)"
timeout 120 python3 .ab/ab_head.py --preset wan21-720p --rounds 3 > $OUT/ab_head_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 90 torchrun --standalone --nproc_per_node=2 .ab/ab_head.py --preset wan21-720p --rounds 3 > $OUT/ab_head_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
[ $(el) -lt 330 ] && { timeout 60 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes spatial_shard_width,spatial_shard_height --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity2 rc=$? t=$(el)"; }
[ $(el) -lt 400 ] && { timeout 50 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=1,16,5,30,64" --out $OUT/parity1.jsonl > $OUT/parity1.txt 2>&1; echo "parity1 rc=$? t=$(el)"; }
cut -c1-125 $OUT/conv_head.log | grep -v "^\*"
grep -v Warn $OUT/ab_head_1gpu.log $OUT/ab_head_2gpu.log | grep -E "(wan|  )" | cut -c1-300
grep -E "^wan" $OUT/parity.log $OUT/parity1.txt | cut -c1-150
exit 0
