#!/usr/bin/env bash
# 1 GPU: the graphs out-of-memory case again (release_if_cached); the default parts of 2 frames for
# layers of >= 2^18-pixel frames (fast.frames_for_layer) interleaved against none; parity where parts apply; headline
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)") > $OUT/env.txt 2>&1
T="timeout"
A="--models wan22 --dtypes bf16 --modes auto --frames-per-step 1 --shapes wan22=2,48,5,22,40 --out /tmp/p.jsonl"
$T 110 torchrun --standalone --nproc_per_node=1 .ab/debug_run.py benchmarks/gpu_parity.py $A > $OUT/oom_rerun.log 2>&1; echo "oom rerun rc=$?"
NOPARTS='vaeshard.fast:PARTS_FROM_PIXELS=1<<62'
$T 150 python3 benchmarks/interleaved_ab.py --preset wan21-720p --setting patch --values off,on --patch "$NOPARTS" --rounds 4 > $OUT/ab_parts_720p.log 2>&1; echo "ab720 rc=$?"
$T 100 python3 benchmarks/interleaved_ab.py --preset wan21-480p --setting patch --values off,on --patch "$NOPARTS" --rounds 4 > $OUT/ab_parts_480p.log 2>&1; echo "ab480 rc=$?"
$T 120 torchrun --standalone --nproc_per_node=1 benchmarks/gpu_parity.py --models wan21 --dtypes bf16,fp32 --modes auto --shapes "wan21=1,16,5,72,72;wan22=1,48,5,22,40" --out /tmp/q.jsonl > $OUT/parity_parts.log 2>&1; echo "parity rc=$?"
MODES=auto $T 150 bash benchmarks/gpu_scaling.sh wan21-720p $OUT 1 > /dev/null 2>&1; echo "headline rc=$?"
echo "== oom"; grep -hE "^wan2|OutOfMemory|gave .* back|captured" $OUT/oom_rerun.log | cut -c1-300
for f in $OUT/ab_parts_*.log; do echo "== $f"; tail -6 $f; done
echo "== parity"; grep -hE "^wan2" $OUT/parity_parts.log | cut -c1-200
echo "== headline"; tail -5 $OUT/scaling_wan21-720p.txt
exit 0
