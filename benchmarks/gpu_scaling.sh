#!/usr/bin/env bash
# Scaling run for one subject on one machine: vaeshard bench over 1, 2, 4 (8) GPUs, every mode, against
# diffusers' single-GPU decode measured in the same invocation, then the anchors at the largest count.
# Needs wheels in .whl/ and the anchors in .anchors/ (see BENCHMARKS.md):
#   bash benchmarks/gpu_scaling.sh wan21-720p "$OUT" 1,2,4
# Environment: MODES (default every mode), ANCHORS=1 (also time the anchors), SRC (the vaeshard
# sources to measure, default ./src: an A/B run points it at a worktree of another commit) and TAG
# (added to the output names), EXTRA (more `vaeshard bench` arguments, e.g. --no-ref).
set -uo pipefail
SUBJECT=${1:?usage: $0 wan21-480p|wan21-720p|wan22-720p OUTDIR [NPROCS]}
OUT=${2:?usage: $0 SUBJECT OUTDIR [NPROCS]}
NPROCS=${3:-1,2,4}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
SRC=${SRC:-$PWD/src}
NAME="$SUBJECT${TAG:+_$TAG}"
export PYTHONPATH=/tmp/site:$SRC${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m vaeshard bench --subject "$SUBJECT" --dtype bf16 --reps 3 --nproc "$NPROCS" \
  --modes "${MODES:-tile,auto,spatial_shard_height,spatial_shard_width}" \
  --json "$OUT/scaling_$NAME.json" --plot "$OUT/scaling_$NAME.png" ${EXTRA:-} 2>>"$OUT/err.log" | tee "$OUT/scaling_$NAME.txt"
[[ -n "${ANCHORS:-}" ]] || exit 0
[[ -d .anchors/vllm_omni/_vendor ]] || bash .anchors/vllm_omni/prepare.sh "$PWD/.whl/vllm_omni-0.30.0-py3-none-any.whl" >/dev/null
case "$SUBJECT" in
  wan21-480p) A="--config wan21 --shape 1,16,21,60,104" ;;
  wan21-720p) A="--config wan21 --shape 1,16,21,90,160" ;;
  wan22-720p) A="--config wan22 --shape 1,48,31,44,80" ;;
esac
N=${NPROCS##*,}
R="python3 -m torch.distributed.run --standalone --nproc_per_node=$N"
anchor() { echo ">>> $*" >&2; timeout 120 "$@" 2>>"$OUT/err.log" | grep '^{' | tee -a "$OUT/anchors_$SUBJECT.jsonl"; }
anchor $R .anchors/distvae/run_decode.py $A --dtype bf16 --reps 3 --no-ref --mode row
anchor $R .anchors/vllm_omni/run_decode.py $A --dtype bf16 --reps 3 --no-ref --mode spatial_shard_width --fastpath fused
