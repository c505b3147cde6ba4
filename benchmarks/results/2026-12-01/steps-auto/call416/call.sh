#!/usr/bin/env bash
# 1 GPU, commit 660c947 (frames_per_step "auto"): two_gpus.sh's kept stage on one GPU (GPUS=1: kept_graphs.py,
# both models, and gpu_parity.py for Wan 2.1 at 9 latent frames, the default path replaying a CUDA graph), then
# Wan 2.2's parity rows of the default path and tile in bf16
set -uo pipefail
GPUS=1 bash benchmarks/two_gpus.sh kept "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
timeout 240 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22 --dtypes bf16 --modes auto,tile \
  --out $OUT/parity_wan22.jsonl > $OUT/parity_wan22.log 2>&1; echo "parity wan22 rc=$? t=$SECONDS"
grep -hE "^wan2" $OUT/parity_wan22.log | cut -c1-160
exit 0
