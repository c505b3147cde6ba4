#!/usr/bin/env bash
# 1 GPU: where a sharded rank's host time goes (rank share alone, cProfile; a tiny latent for the host's own cost)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
R=benchmarks/rank_alone.py
timeout 120 python3 $R --preset wan21-720p --ranks 1,2 --parts on,off --reps 3 > $OUT/share_720p.log 2>&1; echo "share rc=$?"
timeout 120 python3 $R --preset wan21-720p --latent 1,16,21,8,16 --ranks 1,2,4 --parts off --cuda-graphs off --reps 5 > $OUT/tiny.log 2>&1; echo "tiny rc=$?"
timeout 150 python3 $R --preset wan21-720p --latent 1,16,21,8,16 --ranks 1,2 --parts off --cuda-graphs off --reps 3 --host-profile --top 40 > $OUT/tiny_profile.log 2>&1; echo "tinyprof rc=$?"
timeout 150 python3 $R --preset wan21-720p --ranks 2 --reps 3 --host-profile --top 40 > $OUT/share_profile.log 2>&1; echo "shareprof rc=$?"
for f in $OUT/share_720p.log $OUT/tiny.log; do echo "== $f"; grep -E "rank\(s\)|Error" $f; done
exit 0
