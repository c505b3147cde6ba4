#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/conv_kernel.py --norm > $OUT/conv_norm.log 2>&1; echo "conv norm rc=$? t=$(el)"
timeout 120 python3 .ab/ab_norm.py --preset wan21-720p --rounds 3 > $OUT/ab_norm_1gpu.log 2>&1; echo "ab rc=$? t=$(el)"
[ $(el) -lt 360 ] && { timeout 80 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16,fp32 --modes auto --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
[ $(el) -lt 440 ] && { timeout 60 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile rc=$? t=$(el)"; }
cut -c1-120 $OUT/conv_norm.log | grep -v "^\*"
cat $OUT/ab_norm_1gpu.log | grep -v Warn | tail -5
grep -E "^wan" $OUT/parity.log | cut -c1-130
grep -A8 "time by kernel class" $OUT/profile1.log
tail -3 $OUT/ab_norm_1gpu.log
exit 0
