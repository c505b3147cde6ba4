#!/usr/bin/env bash
# 1 GPU: the host's cost per kernel call (launch_cost.py) and of a decode at a small latent (thread CPU time), parts on/off
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 150 python3 benchmarks/launch_cost.py > $OUT/launch_cost.log 2>&1; echo "launch rc=$?"
timeout 200 python3 benchmarks/rank_alone.py --preset wan21-720p --latent 1,16,21,8,16 --parts-from-pixels 1 --ranks 1,2 --parts on,off,on,off --cuda-graphs off --reps 5 > $OUT/tiny_parts.log 2>&1; echo "tiny rc=$?"
cat $OUT/launch_cost.log; grep -E "rank\(s\)|Error" $OUT/tiny_parts.log
exit 0
