#!/usr/bin/env bash
# box_conv's tilings for 192/256/384 channels alone; the fastest 192 tiling in the decode (interleaved); the shard axis with box_conv
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/conv_kernel.py --box-sweep --json $OUT/sweep.json > $OUT/box_sweep.log 2>&1; echo "sweep rc=$? t=$(el)"
BEST=$(python3 - $OUT/sweep.json <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["shape"] == "720p/2, 1 GPU" and "box" in r]
b = min(rows, key=lambda r: r["kernel_ms"])["box"]
print("BoxPlan(" + ", ".join(f"{k}={v}" for k, v in b.items()) + ")")
PY
)
echo "best 192 tiling at 720p/2: $BEST"
P="vaeshard.box_conv:PLANS={96: vaeshard.box_conv.PLAN, 192: vaeshard.box_conv.$BEST}"
echo "$P" > $OUT/patch.txt
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_192_720p_1gpu.log 2>&1; echo "ab720-1 rc=$? t=$(el)"
timeout 110 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$P" --rounds 4 > $OUT/ab_192_720p_2gpu.log 2>&1; echo "ab720-2 rc=$? t=$(el)"
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting mode --values spatial_shard_width,spatial_shard_height --rounds 4 > $OUT/ab_axis_720p.log 2>&1; echo "axis rc=$? t=$(el)"
grep -E "^(720p|480p|Wan)" $OUT/box_sweep.log | awk '{print}' | cut -c1-120
grep -v Warn $OUT/ab_*.log | grep -E "(wan|  )" | cut -c1-200
exit 0
