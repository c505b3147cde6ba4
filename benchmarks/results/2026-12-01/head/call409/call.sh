#!/usr/bin/env bash
# 1 GPU: the decoder's head run as a residual block's convolutions (wan.FastCoderHead): bits against
# diffusers' head path, a rank's share timed against the code before (HEAD's tree in .ab/old), interleaved processes
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src OLD=/tmp/site:$PWD/.ab/old/src
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; PYTHONPATH=$NEW python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
P="vaeshard.families.wan:_head_fast_path=lambda part: False"
for preset in wan21-720p wan21-480p wan22-720p; do
  PYTHONPATH=$NEW timeout 150 python3 benchmarks/interleaved_ab.py --preset $preset --setting patch --values on,off --patch "$P" --rounds 3 >> $OUT/head_ab_1gpu.log 2>&1; echo "ab $preset rc=$?"
done
for preset in wan21-720p wan21-480p; do
  for round in 1 2; do
    for tree in new old; do
      if [ $tree = new ]; then PP=$NEW; else PP=$OLD; fi
      echo "== $preset $tree round $round" >> $OUT/share_ab.log
      PYTHONPATH=$PP timeout 100 python3 benchmarks/rank_alone.py --preset $preset --ranks 2 --reps 5 >> $OUT/share_ab.log 2>&1; echo "share $preset $tree rc=$?"
    done
  done
done
grep -vE "Warning|_warn_once|should be kept" $OUT/head_ab_1gpu.log | cut -c1-220 | tail -40
grep -hE "^==|rank\(s\)|Error|error" $OUT/share_ab.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row.*$//' | cut -c1-230
