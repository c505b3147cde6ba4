#!/usr/bin/env bash
# the library with box_conv's TMA stores (96 and 192 channels; 192 with its rows in registers): the 192 registers A/B, then diffusers and the anchors in the same call (Wan 2.1 720p on 1 and 2 GPUs, 480p), GPU parity on 1 and 2 GPUs, a 1-GPU profile
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
P='vaeshard.box_conv:PLANS={**vaeshard.box_conv.PLANS, 192: vaeshard.box_conv.PLANS[192]._replace(a_regs=False)}'
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_regs192_720p_2gpu.log 2>&1; echo "ab2 rc=$? t=$(el)"
ANCHORS=1 MODES=auto timeout 290 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > $OUT/err.log 2>&1; echo "scaling720 t=$(el)"
[ $(el) -lt 400 ] && { MODES=auto EXTRA=--no-ref timeout 90 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1,2 >> $OUT/err.log 2>&1; echo "scaling480 t=$(el)"; }
[ $(el) -lt 480 ] && { CUDA_VISIBLE_DEVICES=0 timeout 60 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto --out /tmp/p1.jsonl > $OUT/parity_1gpu.log 2>&1; echo "parity1 rc=$? t=$(el)"; }
[ $(el) -lt 520 ] && { timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --out /tmp/p2.jsonl > $OUT/parity_2gpu.log 2>&1; echo "parity2 rc=$? t=$(el)"; }
rm -f $OUT/*.png
for f in $OUT/scaling_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/tables.txt; rm -f $OUT/scaling_*.txt
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-180
grep -E "^(==|auto|diffusers)" $OUT/tables.txt | cut -c1-160
cut -c1-330 $OUT/anchors_*.jsonl 2>/dev/null | sed 's/"torch".*"median_s"/ ... "median_s"/'
grep -hE "^wan21" $OUT/parity_*.log | cut -c1-160
exit 0
