#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
ANCHORS=1 MODES=auto timeout 330 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1,2 > /dev/null; echo "scaling720 t=$(el)"
[ $(el) -lt 390 ] && { MODES=auto timeout 110 bash benchmarks/gpu_scaling.sh wan21-480p $OUT 1,2 > /dev/null; echo "scaling480 t=$(el)"; }
L=$(( 500 - $(el) ))
[ $L -gt 40 ] && { timeout $L torchrun --standalone --nproc_per_node=2 benchmarks/gpu_parity.py --models wan22 --modes auto --out $OUT/parity.jsonl > $OUT/parity.log 2>&1; echo "parity rc=$? t=$(el)"; }
rm -f $OUT/*.png
grep -E "^(auto|diffusers|ref)" $OUT/scaling_*.txt | cut -c1-150
cat $OUT/anchors_*.jsonl 2>/dev/null | cut -c1-300
grep -E "^wan" $OUT/parity.log | cut -c1-130
exit 0
