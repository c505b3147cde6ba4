#!/usr/bin/env bash
# Wan 2.2's duplicating shortcut by one Triton pass (fast.add_duplicated_): its bits against diffusers' at Wan 2.2's shapes, the decode interleaved against the views' broadcasting add, Wan 2.2 720p on 1 GPU
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 60 python3 .ab/dup_bits.py > $OUT/dup_bits.log 2>&1; echo "bits rc=$? t=$(el)"
timeout 110 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting patch --values off,on --patch "vaeshard.fast:add_duplicated_=lambda *a, **k: False" --rounds 3 > $OUT/ab_dupkernel_wan22_1gpu.log 2>&1; echo "ab rc=$? t=$(el)"
[ $(el) -lt 250 ] && { MODES=auto EXTRA=--no-ref timeout 100 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan22 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt; rm -f $OUT/scaling_*.txt
cat $OUT/dup_bits.log | grep -v Warn
grep -E "^(==|auto)" $OUT/tables.txt | cut -c1-170
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
exit 0
