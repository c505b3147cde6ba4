#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 60 python3 benchmarks/conv_kernel.py --cache > $OUT/conv_cache.log 2>&1; echo "conv cache rc=$? t=$(el)"
timeout 70 python3 .ab/ab_cache.py --preset wan21-720p --rounds 3 > $OUT/ab_cache.log 2>&1; echo "ab1 rc=$? t=$(el)"
timeout 60 torchrun --standalone --nproc_per_node=2 .ab/ab_cache.py --preset wan21-720p --rounds 3 >> $OUT/ab_cache.log 2>&1; echo "ab2 rc=$? t=$(el)"
[ $(el) -lt 200 ] && { ANCHORS=1 MODES=auto timeout 230 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "scaling720 t=$(el)"; }
[ $(el) -lt 400 ] && { timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_height,spatial_shard_width --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
rm -f $OUT/*.png $OUT/parity.jsonl
cat $OUT/conv_cache.log
grep -A3 "read apart" $OUT/ab_cache.log
grep -E "^(auto|diffusers)" $OUT/scaling_*.txt | cut -c1-150
cut -c1-330 $OUT/anchors_*.jsonl 2>/dev/null | sed 's/"torch".*"median_s"/ ... "median_s"/'
grep -E "^wan" $OUT/parity.log | cut -c1-130
exit 0
