#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 90 python3 .ab/wrap_ab.py > $OUT/wrap_ab.log 2>&1; echo "wrap rc=$? t=$(el)"
timeout 100 python3 benchmarks/conv_kernel.py > $OUT/conv_plain.log 2>&1; echo "conv rc=$? t=$(el)"
timeout 100 python3 benchmarks/conv_kernel.py --residual > $OUT/conv_residual.log 2>&1; echo "conv residual rc=$? t=$(el)"
timeout 60 python3 .ab/attn_probe.py > $OUT/attn.log 2>&1; echo "attn rc=$? t=$(el)"
timeout 150 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting triton_convs --values true,false --rounds 3 > $OUT/ab_wan22.log 2>&1; echo "ab22 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21,wan22 --dtypes bf16,fp32 --modes auto --shapes "wan21=1,16,5,30,64;wan22=1,48,5,22,48" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
cat $OUT/wrap_ab.log | grep -v Warn
cut -c1-120 $OUT/conv_plain.log | grep -v "^\*"
cut -c1-120 $OUT/conv_residual.log | grep -v "^\*"
cat $OUT/attn.log
grep -A2 interleaved $OUT/ab_wan22.log
grep -E "^wan" $OUT/parity.log | cut -c1-130; tail -3 $OUT/parity.log
exit 0
