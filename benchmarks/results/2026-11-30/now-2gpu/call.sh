#!/usr/bin/env bash
# current library (commit 9a7ea54's computation): 2-GPU profile and timeline at 720p; zero columns kept to 96 channels, A/B at 480p
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 > $OUT/profile2.log 2>&1; echo "profile2 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --timeline > $OUT/timeline2.log 2>&1; echo "timeline2 rc=$? t=$(el)"
PATCH='vaeshard.fast:zero_columns=lambda _like, w, width, _f=vaeshard.fast.zero_columns: w.shape[0] == 96 and _f(_like, w, width)'
timeout 110 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$PATCH" --rounds 7 > $OUT/ab_zc96_480p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
timeout 90 python3 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$PATCH" --rounds 5 > $OUT/ab_zc96_480p_1gpu.log 2>&1; echo "ab1 rc=$? t=$(el)"
grep -E "wall|GPU idle" $OUT/profile2.log | cut -c1-220
grep -A14 "time by kernel class" $OUT/profile2.log | cut -c1-150
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-250
tail -25 $OUT/timeline2.log | cut -c1-200
exit 0
