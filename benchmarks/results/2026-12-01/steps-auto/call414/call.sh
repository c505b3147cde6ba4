#!/usr/bin/env bash
# 1 GPU, the working tree with frames_per_step="auto" (the new default): rank shares and one-rank decodes timed
# with auto against 1 latent frame per step, interleaved in each process (480p: two processes)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
for round in 1 2; do
  echo "== round $round" >> $OUT/auto_480p.log
  timeout 100 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2,1 --frames-per-step auto,1 --reps 5 >> $OUT/auto_480p.log 2>&1; echo "480p $round rc=$? t=$SECONDS"
done
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 2,4 --frames-per-step auto,1 --reps 3 > $OUT/auto_720p.log 2>&1; echo "720p rc=$? t=$SECONDS"
grep -hE "rank\(s\)|Error|error" $OUT/auto_*.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/; s/, default parts on//' | cut -c1-200
exit 0
