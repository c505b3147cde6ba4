#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 200 python3 benchmarks/conv_kernel.py --upsample --sweep --json $OUT/conv_up.json > $OUT/conv_up.log 2>&1; echo "conv up rc=$? t=$(el)"
timeout 120 python3 .ab/ab_up.py --preset wan21-720p --rounds 3 > $OUT/ab_up_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
[ $(el) -lt 380 ] && { timeout 90 torchrun --standalone --nproc_per_node=2 .ab/ab_up.py --preset wan21-720p --rounds 3 > $OUT/ab_up_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"; }
[ $(el) -lt 440 ] && { timeout 60 torchrun --standalone --nproc_per_node=2 .ab/ab_up.py --preset wan21-480p --rounds 5 >> $OUT/ab_up_2gpu.log 2>&1; echo "ab2-480 rc=$? t=$(el)"; }
[ $(el) -lt 480 ] && { timeout 60 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes spatial_shard_width,spatial_shard_height --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity2 rc=$? t=$(el)"; }
[ $(el) -lt 530 ] && { timeout 50 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=1,16,5,30,64" --out $OUT/parity1.jsonl > $OUT/parity1.log 2>&1; echo "parity1 rc=$? t=$(el)"; }
cut -c1-125 $OUT/conv_up.log | grep -v "^\*"
grep -v Warn $OUT/ab_up_1gpu.log $OUT/ab_up_2gpu.log | grep -E "(wan|  )" | cut -c1-400
grep -E "^wan" $OUT/parity.log $OUT/parity1.log | cut -c1-150
tail -3 $OUT/ab_up_1gpu.log
exit 0
