#!/usr/bin/env bash
# 1 GPU, HEAD 99f6dd1 + rank_alone.py --frames-per-step: rank shares of small frames (480p on 2, 720p on 4 and 8)
# at 1, 2 and 3 latent frames per decoder step, interleaved in each process, two processes for 480p; the 1-GPU
# profile of Wan 2.1 720p with the current code
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") > $OUT/env.txt 2>&1
for round in 1 2; do
  echo "== round $round" >> $OUT/steps_480p.log
  timeout 120 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2 --frames-per-step 1,2,3 --reps 5 >> $OUT/steps_480p.log 2>&1; echo "480p $round rc=$? t=$SECONDS"
done
timeout 100 python3 benchmarks/rank_alone.py --preset wan21-480p --ranks 2,1 --cuda-graphs keep --frames-per-step 1,2 --reps 5 > $OUT/steps_480p_keep.log 2>&1; echo "480p keep rc=$? t=$SECONDS"
timeout 150 python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 4,8 --frames-per-step 1,2,1,2 --reps 5 > $OUT/steps_720p_4_8.log 2>&1; echo "720p 4,8 rc=$? t=$SECONDS"
timeout 120 python3 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --vaeshard > $OUT/profile1.log 2>&1; echo "profile rc=$? t=$SECONDS"
grep -hE "rank\(s\)|Error|error" $OUT/steps_*.log | sed -E 's/ \(its thread[^)]*\)//; s/; first row[^;]*;/;/' | cut -c1-230
grep -E "wall|^  [a-z]" $OUT/profile1.log | head -12 | cut -c1-160
exit 0
