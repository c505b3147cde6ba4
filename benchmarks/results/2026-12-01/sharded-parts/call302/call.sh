#!/usr/bin/env bash
# 1 GPU: sharded decodes with the default parts (one halo exchange per block for all its parts): a rank's share, parts on/off
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
R=benchmarks/rank_alone.py
timeout 200 python3 $R --preset wan21-720p --ranks 2,4 --parts on,off,on,off --reps 5 > $OUT/share_720p.log 2>&1; echo "720p rc=$?"
timeout 100 python3 $R --preset wan21-480p --ranks 2 --parts on,off,on,off --reps 5 > $OUT/share_480p.log 2>&1; echo "480p rc=$?"
timeout 100 python3 $R --preset wan21-720p --ranks 1 --parts on,off --reps 3 > $OUT/one_720p.log 2>&1; echo "1gpu rc=$?"
timeout 150 python3 $R --preset wan21-720p --ranks 2 --reps 2 --host-profile --top 30 > $OUT/share_profile.log 2>&1; echo "prof rc=$?"
timeout 60 python3 .ab/norm_rows_bits.py > $OUT/norm_rows_bits.log 2>&1; echo "bits rc=$?"; cat $OUT/norm_rows_bits.log
for f in $OUT/share_720p.log $OUT/share_480p.log $OUT/one_720p.log; do echo "== $f"; grep -E "rank\(s\)|Error" $f; done
exit 0
