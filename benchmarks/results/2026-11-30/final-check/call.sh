#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; date -u) > $OUT/env.txt 2>&1
timeout 60 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes spatial_shard_width,spatial_shard_height --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting triton_convs --values true,false --rounds 2 > $OUT/ab_720p_2gpu.log 2>&1; echo "ab rc=$? t=$(el)"
grep -E "^wan" $OUT/parity.log | cut -c1-130
grep -A2 interleaved $OUT/ab_720p_2gpu.log
exit 0
