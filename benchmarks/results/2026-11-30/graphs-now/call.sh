#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan21 --dtypes bf16 --modes auto,spatial_shard_width --shapes "wan21=1,16,5,30,64" --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p --setting cuda_graphs --values true,false --rounds 4 > $OUT/ab_graphs.log 2>&1; echo "ab480 rc=$? t=$(el)"
timeout 80 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting cuda_graphs --values true,false --rounds 2 >> $OUT/ab_graphs.log 2>&1; echo "ab720 rc=$? t=$(el)"
timeout 70 torchrun --standalone --nproc_per_node=1 benchmarks/interleaved_ab.py --preset wan21-720p --setting cuda_graphs --values true,false --rounds 2 >> $OUT/ab_graphs.log 2>&1; echo "ab720x1 rc=$? t=$(el)"
[ $(el) -lt 330 ] && { timeout 90 torchrun --standalone --nproc_per_node=2 .ab/ab_axis.py --preset wan22-720p --rounds 2 > $OUT/ab_axis_wan22.log 2>&1; echo "axis22 rc=$? t=$(el)"; }
[ $(el) -lt 420 ] && { MODES=auto EXTRA=--no-ref timeout 60 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 2 > /dev/null; echo "scaling480 t=$(el)"; }
rm -f $OUT/*.png
grep -E "^wan" $OUT/parity.log | cut -c1-140
grep -E "^(wan|  )" $OUT/ab_graphs.log
grep -E "^(wan|  )" $OUT/ab_axis_wan22.log
grep -E "^auto" $OUT/scaling_*.txt | cut -c1-150
grep -i "warn\|could not be captured\|Error" $OUT/*.log | grep -v "OMP_NUM\|Warning: Profiler\|_warn_once\|UserWarning" | head -8
exit 0
