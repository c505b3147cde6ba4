#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u; git log -1 --format=%H 2>/dev/null) > $OUT/env.txt 2>&1
timeout 100 python3 benchmarks/conv_kernel.py > $OUT/conv_plain.log 2>&1; echo "conv rc=$? t=$(el)"
timeout 100 python3 benchmarks/conv_kernel.py --residual > $OUT/conv_residual.log 2>&1; echo "conv residual rc=$? t=$(el)"
ANCHORS=1 MODES=auto timeout 260 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > /dev/null; echo "scaling720 t=$(el)"
timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting triton_convs --values true,false --rounds 3 > $OUT/ab_720p_1gpu.log 2>&1; echo "ab rc=$? t=$(el)"
[ $(el) -lt 420 ] && { timeout 80 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16,fp32 --modes auto --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
[ $(el) -lt 470 ] && { MODES=auto timeout 70 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1 > /dev/null; echo "scaling480 t=$(el)"; }
[ $(el) -lt 510 ] && { timeout 50 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile rc=$? t=$(el)"; }
rm -f $OUT/*.png
cut -c1-120 $OUT/conv_plain.log | grep -v "^\*"
cut -c1-120 $OUT/conv_residual.log | grep -v "^\*"
grep -E "^(auto|diffusers)" $OUT/scaling_*.txt | cut -c1-150
cat $OUT/anchors_*.jsonl 2>/dev/null | cut -c1-160
grep -A2 interleaved $OUT/ab_720p_1gpu.log
grep -E "^wan" $OUT/parity.log | cut -c1-130
grep -A8 "time by kernel class" $OUT/profile1.log
exit 0
