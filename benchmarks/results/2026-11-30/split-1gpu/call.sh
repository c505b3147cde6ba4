#!/usr/bin/env bash
# (run on nvidia-h200, one GPU, from the repository root; the command as given to the machine)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD/src; date -u > $OUT/env.txt; timeout 140 torchrun --standalone --nproc_per_node=1 benchmarks/interleaved_ab.py --preset wan21-720p --setting triton_convs --values true,false --rounds 3 > $OUT/ab_720p_1gpu.log 2>&1; echo rc=$?; grep -A2 interleaved $OUT/ab_720p_1gpu.log
