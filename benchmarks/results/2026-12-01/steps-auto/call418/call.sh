#!/usr/bin/env bash
# 1 GPU, commit 8d61a0b (library as 660c947): two_gpus.sh's headline stage run on one GPU, a check of the script
mkdir -p $OUT && GPUS=1 bash benchmarks/two_gpus.sh headline "$OUT"
