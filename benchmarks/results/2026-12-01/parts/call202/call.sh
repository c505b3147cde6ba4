#!/usr/bin/env bash
# 1 GPU: default parts of 2 frames (fast.frames_for_layer) and the part buffer kept as the cache (_store_cache owned),
# each interleaved against the library without it; parity where parts apply; Wan 2.1 720p headline with diffusers
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
AB="timeout 150 python3 benchmarks/interleaved_ab.py --setting patch --values off,on --rounds 4"
$AB --preset wan21-720p --patch "vaeshard.fast:PART_FRAMES=None" > $OUT/ab_noparts_720p.log 2>&1; echo "1 rc=$?"
$AB --preset wan21-720p --patch "vaeshard.families.wan:_whole_storage=lambda t: False" > $OUT/ab_nokeep_720p.log 2>&1; echo "2 rc=$?"
$AB --preset wan21-720p --patch "vaeshard.fast:PARTS_FROM_PIXELS=1<<16" > $OUT/ab_from16_720p.log 2>&1; echo "3 rc=$?"
$AB --preset wan21-480p --patch "vaeshard.fast:PART_FRAMES=None" > $OUT/ab_noparts_480p.log 2>&1; echo "4 rc=$?"
timeout 120 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16,fp32 --modes auto --shapes "wan21=1,16,5,72,72;wan22=1,48,5,22,40" --out /tmp/q.jsonl > $OUT/parity_parts.log 2>&1; echo "parity rc=$?"
MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > $OUT/headline.log 2>&1; echo "headline rc=$?"
for f in $OUT/ab_*.log; do echo "== $f"; tail -3 $f; done
echo "== parity"; grep -hE "^wan2" $OUT/parity_parts.log | cut -c1-200
echo "== headline"; grep -E "diffusers|auto" $OUT/headline.log | head -8
exit 0
