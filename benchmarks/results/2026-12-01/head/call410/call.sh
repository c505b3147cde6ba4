#!/usr/bin/env bash
# 1 GPU: a rank's share at 720p with the new head against the code before, GPU kernel time profiled
# (host-noise-free), interleaved processes; kept graphs' bits; GPU parity on one GPU
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src OLD=/tmp/site:$PWD/.ab/old/src
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; PYTHONPATH=$NEW python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
for round in 1 2; do
  for tree in new old; do
    if [ $tree = new ]; then PP=$NEW; else PP=$OLD; fi
    echo "== wan21-720p $tree round $round" >> $OUT/share_kprof.log
    PYTHONPATH=$PP timeout 110 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 2 --reps 5 --kernel-profile --top 12 >> $OUT/share_kprof.log 2>&1; echo "share $tree rc=$?"
  done
done
PYTHONPATH=$NEW timeout 150 python3 benchmarks/kept_graphs.py > $OUT/kept_bits.log 2>&1; echo "bits rc=$?"
PYTHONPATH=$NEW timeout 180 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$?"
grep -hE "^==|rank\(s\)|profiled decode|cat / pad|convolution  |Error|error" $OUT/share_kprof.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row.*$//' | cut -c1-200
grep -vE "Warning|_warn_once|should be kept" $OUT/kept_bits.log | tail -3 | cut -c1-200
grep -vE "Warning|_warn_once|should be kept" $OUT/parity.log | tail -25 | cut -c1-200
