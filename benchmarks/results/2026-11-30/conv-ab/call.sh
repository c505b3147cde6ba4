#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
R="torchrun --standalone --nproc_per_node=2"
timeout 150 $R benchmarks/interleaved_ab.py --preset wan21-480p --setting triton_convs --values true,false --rounds 6 > $OUT/ab_480p_2gpu.log 2>&1
timeout 150 $R benchmarks/interleaved_ab.py --preset wan21-480p --setting triton_convs --values true,false --rounds 6 > $OUT/ab_480p_2gpu_b.log 2>&1
timeout 150 $R benchmarks/interleaved_ab.py --preset wan21-720p --setting triton_convs --values true,false --rounds 4 > $OUT/ab_720p_2gpu.log 2>&1
grep -h -A3 "interleaved" $OUT/ab_*.log
exit 0
