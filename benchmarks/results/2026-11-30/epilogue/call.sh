#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 100 python3 benchmarks/conv_kernel.py --residual --only "1 GPU" > $OUT/conv_residual.log 2>&1; echo "conv residual rc=$? t=$(el)"
timeout 100 python3 benchmarks/conv_kernel.py --residual --only "2 GPUs" >> $OUT/conv_residual.log 2>&1; echo "conv residual2 rc=$? t=$(el)"
timeout 120 python3 .ab/ab_addto.py --preset wan21-720p --rounds 4 > $OUT/ab_addto.log 2>&1; echo "ab rc=$? t=$(el)"
timeout 120 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile rc=$? t=$(el)"
[ $(el) -lt 420 ] && { timeout 120 python3 benchmarks/conv_kernel.py --only "Wan 2.2" --sweep > $OUT/conv_wan22.log 2>&1; echo "sweep22 rc=$? t=$(el)"; }
cut -c1-120 $OUT/conv_residual.log | grep -v "^\*"
cat $OUT/ab_addto.log | grep -v Warn | tail -4
grep -E "^(wan|  |[a-z])" $OUT/profile1.log | head -30 | cut -c1-140
cut -c1-120 $OUT/conv_wan22.log 2>/dev/null
exit 0
