#!/usr/bin/env bash
# Wan 2.2's up blocks without the materialised shortcut (FastResidualUpBlock) and 1x1x1 convolutions reading their input where it lies: Wan 2.2 720p on one H200 with diffusers in the same call, each change interleaved against the library without it, a profile, GPU parity; Wan 2.1 720p
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
MODES=auto timeout 200 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan22 t=$(el)"
timeout 110 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting patch --values off,on --patch "vaeshard.families.wan:_dup_up_views=lambda *a: None" --rounds 3 > $OUT/ab_dupup_wan22_1gpu.log 2>&1; echo "ab dupup rc=$? t=$(el)"
timeout 110 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting patch --values off,on --patch "vaeshard.shard:_dense_channels_last=lambda t: False" --rounds 3 > $OUT/ab_unpadded_wan22_1gpu.log 2>&1; echo "ab unpadded rc=$? t=$(el)"
[ $(el) -lt 450 ] && { timeout 70 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22 --dtypes bf16 --modes auto --out /tmp/p.jsonl > $OUT/parity_wan22_1gpu.log 2>&1; echo "parity rc=$? t=$(el)"; }
[ $(el) -lt 500 ] && { MODES=auto EXTRA=--no-ref timeout 80 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 >> $OUT/err.log 2>&1; echo "scaling wan21 t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt; rm -f $OUT/scaling_*.txt
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-170
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -hE "^wan22" $OUT/parity_*.log | cut -c1-160
exit 0
