#!/usr/bin/env bash
# The GPU performance targets' 2-GPU measurements, in four stages that each fit one 10-minute device
# command on a machine with 2 GPUs (wheels in .whl/, the anchors in .anchors/: BENCHMARKS.md, Reproduce):
#   bash benchmarks/two_gpus.sh headline "$OUT"   # Wan 2.1 720p on 1 and 2 GPUs with diffusers and the
#                                                 # anchors; 480p on 1 and 2, by default and with kept graphs
#   bash benchmarks/two_gpus.sh wan22 "$OUT"      # Wan 2.2 720p on 1 and 2 GPUs with diffusers and the anchors
#   bash benchmarks/two_gpus.sh kept "$OUT"       # kept graphs holding NCCL exchanges, bit for bit against
#                                                 # the eager decode; GPU parity of every mode, Wan 2.1
#   bash benchmarks/two_gpus.sh parity "$OUT"     # GPU parity of every mode, Wan 2.2 and Qwen-Image
# Each stage packs what it wrote into OUT/<stage>.tar.gz (the logs, JSON and plots; a device command
# returns only a few files) and prints a short table last. GPUS=1 runs a stage's steps on one GPU
# only (a check of the script itself on a machine with one GPU; its figures are not the 2-GPU ones).
set -uo pipefail
STAGE=${1:?usage: $0 headline|wan22|kept|parity OUTDIR}
OUT=${2:?usage: $0 STAGE OUTDIR}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$OUT/$STAGE"
mkdir -p "$WORK"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; date -u
 python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") \
  > "$WORK/env.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...: the command's output in NAME.log, its exit status and time printed
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "$name rc=$? ${SECONDS}s (took $((SECONDS - start)) s)" >> "$WORK/steps.txt"
}
G=${GPUS:-2}
R="torchrun --standalone --nproc_per_node=$G"
COUNTS=$([ "$G" = 1 ] && echo 1 || echo "1,$G")  # the GPU counts each scaling run times
case "$STAGE" in
  headline)
    step wan21-720p 300 env ANCHORS=1 MODES=auto bash "$HERE/gpu_scaling.sh" wan21-720p "$WORK" "$COUNTS"
    step wan21-480p 120 env MODES=auto bash "$HERE/gpu_scaling.sh" wan21-480p "$WORK" "$COUNTS"
    step wan21-480p-keep 90 env MODES=auto TAG=keep EXTRA="--keep-cuda-graphs --reps 5 --no-ref" \
      bash "$HERE/gpu_scaling.sh" wan21-480p "$WORK" "$G"
    ;;
  wan22)
    step wan22-720p 500 env ANCHORS=1 MODES=auto bash "$HERE/gpu_scaling.sh" wan22-720p "$WORK" "$COUNTS"
    ;;
  kept)
    step kept_graphs 200 $R "$HERE/kept_graphs.py" --mode spatial_shard_height
    step parity 300 $R "$HERE/gpu_parity.py" --models wan21 --out "$WORK/parity.jsonl"
    ;;
  parity)
    step parity_wan22 380 $R "$HERE/gpu_parity.py" --models wan22 --out "$WORK/parity_wan22.jsonl"
    step parity_qwen 150 $R "$HERE/gpu_parity.py" --models qwenimage --out "$WORK/parity_qwen.jsonl"
    ;;
  *)
    echo "unknown stage $STAGE (headline, wan22, kept, parity)" >&2
    exit 2
    ;;
esac
tar -czf "$OUT/$STAGE.tar.gz" -C "$OUT" "$STAGE" && rm -rf "$WORK"
tar -xzOf "$OUT/$STAGE.tar.gz" "$STAGE/steps.txt"
for f in $(tar -tzf "$OUT/$STAGE.tar.gz" | grep -E 'scaling_.*\.txt$'); do
  echo "== $f"
  tar -xzOf "$OUT/$STAGE.tar.gz" "$f" | grep -E '^(diffusers|auto|tile|spatial)'
done
if tar -tzf "$OUT/$STAGE.tar.gz" | grep 'anchors_' > /dev/null; then
  tar -xzOf "$OUT/$STAGE.tar.gz" --wildcards '*/anchors_*.jsonl' | cut -c1-200
fi
if [ "$STAGE" = kept ]; then
  tar -xzOf "$OUT/$STAGE.tar.gz" "$STAGE/kept_graphs.log" | grep -vE "Warning|_warn_once|should be kept" | tail -4 | cut -c1-200
fi
if [ "$STAGE" = kept ] || [ "$STAGE" = parity ]; then
  tar -xzOf "$OUT/$STAGE.tar.gz" --wildcards "$STAGE/parity*.log" | grep -E "^(wan2|qwen)" | cut -c1-240
fi
exit 0
