#!/usr/bin/env bash
# Wan 2.2 720p on one H200 with the current library: diffusers in the same call, a whole-decode profile (where its time goes), its full-resolution convolution alone against cuDNN
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
MODES=auto timeout 240 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan22 t=$(el)"
[ $(el) -lt 330 ] && { timeout 180 python3 benchmarks/profile_decode.py --preset wan22-720p --frames 31 --vaeshard --memory --top 25 > $OUT/profile1_wan22.log 2>&1; echo "profile rc=$? t=$(el)"; }
[ $(el) -lt 480 ] && { timeout 100 python3 benchmarks/conv_kernel.py --only "Wan 2.2" > $OUT/conv_wan22.log 2>&1; echo "conv rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt; rm -f $OUT/scaling_*.txt
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-170
grep -E "wall|idle|peak|GiB|^  |^ +[0-9]" $OUT/profile1_wan22.log | cut -c1-170 | head -60
grep -v Warn $OUT/conv_wan22.log | cut -c1-160
exit 0
