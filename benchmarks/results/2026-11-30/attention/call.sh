#!/usr/bin/env bash
# the fast tier's attention: A/B interleaved against PyTorch's kernel (1 and 2 GPUs), alone, and parity
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; git log -1 --format=%H 2>/dev/null; date -u) > $OUT/env.txt 2>&1
P='--setting patch --values off,on --patch vaeshard.fast:attention_kernel_available=lambda*a:False'
timeout 110 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p $P --rounds 4 > $OUT/ab_attn_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
timeout 100 python3 benchmarks/interleaved_ab.py --preset wan21-720p $P --rounds 3 > $OUT/ab_attn_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p $P --rounds 5 > $OUT/ab_attn_480p.log 2>&1; echo "ab480 rc=$? t=$(el)"
timeout 40 python3 benchmarks/results/2026-11-30/attention/attention_alone.py > $OUT/attention_alone.log 2>&1; echo "alone rc=$? t=$(el)"
timeout 150 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --modes auto,spatial_shard_height,spatial_shard_width --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
grep -v Warn $OUT/ab_attn_*.log | grep -E "(wan|  )" | cut -c1-250
cat $OUT/attention_alone.log | grep -v Warn
tail -25 $OUT/parity.log | cut -c1-200
exit 0
