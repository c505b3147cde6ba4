#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 70 torchrun --standalone --nproc_per_node=2 .ab/ab_norm.py --preset wan21-720p --mode auto --rounds 2 > $OUT/ab_norm_2gpu.log 2>&1; echo "ab width rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=2 .ab/ab_norm.py --preset wan21-720p --mode spatial_shard_height --rounds 2 >> $OUT/ab_norm_2gpu.log 2>&1; echo "ab height rc=$? t=$(el)"
ANCHORS=1 MODES=auto,spatial_shard_height timeout 300 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "scaling720 t=$(el)"
[ $(el) -lt 450 ] && { MODES=auto EXTRA=--no-ref timeout 60 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 2 > /dev/null; echo "scaling480 t=$(el)"; }
[ $(el) -lt 500 ] && { timeout 50 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes spatial_shard_width,spatial_shard_height --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
rm -f $OUT/*.png
grep -v Warn $OUT/ab_norm_2gpu.log | grep -E "^(wan|  )"
grep -E "^(auto|spatial|diffusers)" $OUT/scaling_*.txt | cut -c1-160
cut -c1-330 $OUT/anchors_*.jsonl 2>/dev/null | sed 's/"torch".*"median_s"/ ... "median_s"/'
grep -E "^wan" $OUT/parity.log | cut -c1-130
exit 0
