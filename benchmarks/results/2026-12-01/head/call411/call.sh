#!/usr/bin/env bash
# 1 GPU, commit 8b12449 (the head's cache taken from its buffer, 1b724cf): Wan 2.1 720p and 480p and Wan 2.2 720p
# with diffusers in the same call; the 480p share with and without kept graphs, interleaved; Wan 2.2 GPU parity
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
MODES=auto timeout 120 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > /dev/null 2>&1; echo "720p rc=$? t=$SECONDS"
MODES=auto timeout 90 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1 > /dev/null 2>&1; echo "480p rc=$? t=$SECONDS"
MODES=auto timeout 150 bash benchmarks/gpu_scaling.sh wan22-720p $OUT 1 > /dev/null 2>&1; echo "wan22 rc=$? t=$SECONDS"
timeout 100 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --cuda-graphs auto,keep,auto,keep --reps 5 > $OUT/share_480p_keep.log 2>&1; echo "share rc=$? t=$SECONDS"
if [ $SECONDS -lt 400 ]; then
  timeout $((560 - SECONDS)) torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22 --out $OUT/parity_wan22.jsonl > $OUT/parity_wan22.log 2>&1; echo "parity rc=$? t=$SECONDS"
fi
rm -f $OUT/*.png; [[ -s $OUT/err.log ]] || rm -f $OUT/err.log
for f in $OUT/scaling_*.txt; do echo "== $f"; grep -E "^diffusers|^auto" $f; done
grep -hE "rank\(s\)|Error|error" $OUT/share_480p_keep.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/' | cut -c1-250
grep -hE "^wan2" $OUT/parity_wan22.log 2>/dev/null | cut -c1-200
exit 0
