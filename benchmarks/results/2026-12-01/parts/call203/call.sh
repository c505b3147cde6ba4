#!/usr/bin/env bash
# 1 GPU, commit 2e09557 (default parts of two frames, part buffers kept as caches): Wan 2.2 720p and Wan 2.1 480p
# with diffusers in the same call, a Wan 2.1 720p profile, two-sample parity where the parts apply
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > /dev/null 2>&1; echo "wan22 rc=$?"
MODES=auto timeout 90 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1 > /dev/null 2>&1; echo "480p rc=$?"
timeout 120 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard --memory --top 16 > $OUT/profile1_wan21.log 2>&1; echo "profile rc=$?"
timeout 120 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --shapes "wan21=2,16,5,72,72" --out /tmp/q.jsonl > $OUT/parity_batch2_parts.log 2>&1; echo "parity rc=$?"
rm -f $OUT/*.png; [[ -s $OUT/err.log ]] || rm -f $OUT/err.log
for f in $OUT/scaling_*.txt; do echo "== $f"; grep -E "^diffusers|^auto" $f; done
echo "== profile"; grep -iE "wall|total|conv|norm|cop|peak" $OUT/profile1_wan21.log | head -14
echo "== parity"; grep -hE "^wan2" $OUT/parity_batch2_parts.log | cut -c1-200
exit 0
