#!/usr/bin/env bash
# One subject on a 2-GPU machine, in one call: the anchors (diffusers on 1 GPU, DistVAE row shard,
# vLLM-Omni spatial shard + fused fast path) and vaeshard bench, so every ratio comes from one run.
# Needs the anchors copied to .anchors/ and wheels in .whl/ (see BENCHMARKS.md):
#   bash benchmarks/gpu_run.sh wan21-720p "$OUT"
set -uo pipefail
SUBJECT=${1:?usage: $0 wan21-480p|wan21-720p|wan22-720p OUTDIR}
OUT=${2:?usage: $0 SUBJECT OUTDIR}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[[ -d .anchors/vllm_omni/_vendor ]] || bash .anchors/vllm_omni/prepare.sh "$PWD/.whl/vllm_omni-0.30.0-py3-none-any.whl" >/dev/null
case "$SUBJECT" in
  wan21-480p) A="--config wan21 --shape 1,16,21,60,104" ;;
  wan21-720p) A="--config wan21 --shape 1,16,21,90,160" ;;
  wan22-720p) A="--config wan22 --shape 1,48,31,44,80" ;;
esac
R="python3 -m torch.distributed.run --standalone"
anchor() { echo ">>> $*" >&2; "$@" 2>>"$OUT/anchors_err.log" | grep '^{' | tee -a "$OUT/anchors_$SUBJECT.jsonl"; }
anchor $R --nproc_per_node=1 .anchors/distvae/run_decode.py $A --dtype bf16 --reps 3 --no-ref --mode plain
anchor $R --nproc_per_node=2 .anchors/distvae/run_decode.py $A --dtype bf16 --reps 3 --no-ref --mode row
anchor $R --nproc_per_node=2 .anchors/vllm_omni/run_decode.py $A --dtype bf16 --reps 3 --no-ref --mode spatial_shard_width --fastpath fused
B="python3 -m vaeshard bench --preset $SUBJECT --dtype bf16 --reps 3"
$B --nproc 1 --modes ${ONE_GPU_MODES:-auto} --json "$OUT/bench_${SUBJECT}_1gpu.json" 2>>"$OUT/bench_err.log" | tee "$OUT/bench_${SUBJECT}_1gpu.txt"
$B --nproc 2 --modes ${TWO_GPU_MODES:-tile,auto,spatial_shard_height,spatial_shard_width} --json "$OUT/bench_${SUBJECT}_2gpu.json" \
  --plot "$OUT/bench_${SUBJECT}_2gpu.png" 2>>"$OUT/bench_err.log" | tee "$OUT/bench_${SUBJECT}_2gpu.txt"
