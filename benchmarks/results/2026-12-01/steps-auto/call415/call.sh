#!/usr/bin/env bash
# 1 GPU, the working tree of commit 660c947 before its script changes (gpu_parity.py at 5 latent frames,
# kept_graphs.py with frames_per_step=2 in request 9): two_gpus.sh's kept stage run on one GPU, a check of the script
mkdir -p $OUT && GPUS=1 bash benchmarks/two_gpus.sh kept "$OUT"
