#!/usr/bin/env bash
# max_layer_frames=2 against the default, interleaved, 2 GPUs; per-call timelines on 1 and 2 GPUs with the SM clock logged
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv; python3 -c "import torch, triton, diffusers;print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version(), 'triton', triton.__version__, 'diffusers', diffusers.__version__)"; lscpu | grep 'Model name'; date -u) > $OUT/env.txt 2>&1
timeout 150 torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p --setting max_layer_frames --values none,2 --rounds 4 > $OUT/ab_lmf_720p.log 2>&1; echo "ablmf rc=$? t=$(el)"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 25 > $OUT/clocks.csv 2>&1 & SMI=$!
echo "1gpu start $(date -u +%T.%N)" > $OUT/marks.txt
CUDA_VISIBLE_DEVICES=0 timeout 90 torchrun --standalone --nproc_per_node=1 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --timeline > $OUT/timeline1.log 2>&1; echo "timeline1 rc=$? t=$(el)"
echo "2gpu start $(date -u +%T.%N)" >> $OUT/marks.txt
timeout 100 torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 21 --timeline > $OUT/timeline2.log 2>&1; echo "timeline2 rc=$? t=$(el)"
echo "end $(date -u +%T.%N)" >> $OUT/marks.txt
kill $SMI
grep -v Warn $OUT/ab_lmf_720p.log | grep -E "(wan|  )" | cut -c1-250
grep -A24 "^call |" $OUT/timeline1.log | cut -c1-120
grep -A24 "^call |" $OUT/timeline2.log | cut -c1-120
wc -l $OUT/clocks.csv
exit 0
