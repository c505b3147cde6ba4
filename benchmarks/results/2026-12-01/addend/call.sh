#!/usr/bin/env bash
# Wan 2.2's duplicating shortcut added in the upsamplers' interleaving pass: interleaved against the pass of its own, Wan 2.2 720p with diffusers in the same call, GPU parity of Wan 2.2 (fp32 and bf16), frames_per_step 1 against 2 on Wan 2.2
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 120 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting patch --values off,on --patch "vaeshard.families.wan:_dup_addend=lambda *a: None" --rounds 3 > $OUT/ab_addend_wan22_1gpu.log 2>&1; echo "ab addend rc=$? t=$(el)"
MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > $OUT/err.log 2>&1; echo "scaling wan22 t=$(el)"
timeout 120 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22 --dtypes fp32,bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_wan22_1gpu.log 2>&1; echo "parity rc=$? t=$(el)"
[ $(el) -lt 400 ] && { timeout 150 python3 benchmarks/interleaved_ab.py --preset wan22-720p --setting frames_per_step --values 1,2 --rounds 2 > $OUT/ab_steps_wan22_1gpu.log 2>&1; echo "ab steps rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt 2>/dev/null; rm -f $OUT/scaling_*.txt
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -hE "^wan2" $OUT/parity_*.log | cut -c1-160
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-170
exit 0
