#!/usr/bin/env bash
# 1 GPU: compiled kernels launched directly (triton_support.launch) + box_conv's kept layouts/weight descriptors:
# bits against the JIT launches, parity, the host's cost per launch, rank shares (parts on/off), the host's cost of a decode
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
R=benchmarks/rank_alone.py
timeout 120 python3 .ab/launch_bits.py > $OUT/launch_bits.log 2>&1; echo "bits rc=$?"
timeout 100 python3 benchmarks/launch_cost.py > $OUT/launch_cost.log 2>&1; echo "launch rc=$?"
timeout 170 python3 $R --preset wan21-720p --ranks 2,1 --parts on,off,on,off --reps 5 > $OUT/share_720p.log 2>&1; echo "720p rc=$?"
timeout 120 python3 $R --preset wan21-720p --latent 1,16,21,8,16 --parts-from-pixels 1 --ranks 2 --parts on,off,on,off --cuda-graphs off --reps 5 > $OUT/tiny_parts.log 2>&1; echo "tiny rc=$?"
timeout 150 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --max-layer-frames 2 > $OUT/parity.log 2>&1; echo "parity rc=$?"
cat $OUT/launch_bits.log $OUT/launch_cost.log; grep -E "rank\(s\)|Error" $OUT/share_720p.log $OUT/tiny_parts.log | cut -d: -f2-; tail -25 $OUT/parity.log
exit 0
