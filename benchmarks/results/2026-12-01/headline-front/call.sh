#!/usr/bin/env bash
# the library reading the causal caches where they lie (1 GPU; no 2-GPU machine available): Wan 2.1 720p with diffusers in the same call, 480p, the norm in box_conv's epilogue interleaved (now that both convolutions' buffers hold only new frames), a profile with the memory at the peak
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u; git log --oneline -1 2>/dev/null) > $OUT/env.txt 2>&1
MODES=auto timeout 200 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling720 t=$(el)"
MODES=auto EXTRA=--no-ref timeout 80 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1 >> $OUT/err.log 2>&1; echo "scaling480 t=$(el)"
P='vaeshard.conv_kernel:norms_in_epilogue=lambda how: True'
[ $(el) -lt 330 ] && { timeout 130 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_norm_720p_1gpu.log 2>&1; echo "ab rc=$? t=$(el)"; }
[ $(el) -lt 440 ] && { timeout 120 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard --memory > $OUT/profile1.log 2>&1; echo "profile rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt; rm -f $OUT/scaling_*.txt
grep -E "^(==|auto|diffusers|vaeshard|\|)" $OUT/tables.txt | cut -c1-170
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
head -40 $OUT/profile1.log | cut -c1-150
exit 0
