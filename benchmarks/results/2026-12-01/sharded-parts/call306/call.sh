#!/usr/bin/env bash
# 1 GPU: the host's cost per launch and per small decode, compiled kernels launched directly vs through the JIT
# function, interleaved; parity of Wan 2.2 (the Triton convolution, the duplicating shortcut, the interleave pass)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
timeout 200 python3 benchmarks/launch_cost.py --decode > $OUT/launch_cost.log 2>&1; echo "launch rc=$?"
timeout 150 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan22 --modes auto,spatial_shard_height > $OUT/parity_wan22.log 2>&1; echo "parity rc=$?"
cat $OUT/launch_cost.log; grep -E "^wan22" $OUT/parity_wan22.log
exit 0
