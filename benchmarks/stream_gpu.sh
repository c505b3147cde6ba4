#!/usr/bin/env bash
# Streamed decode and the first request on one GPU, in one call:
#
#   bash benchmarks/stream_gpu.sh OUT [SUBJECTS] [PARTS]
#
# PARTS: any of stream,e2e,cudnn (default all three, in that order). E2E_TIMEOUT: seconds per e2e subject.
# 1. benchmarks/stream_gpu.py: stream_decode's chunks == vae.decode bit for bit (fast tier with CUDA
#    graphs at a small size, and at 480p; the exact tier), the CLI writer's CUDA path == the CPU's.
# 2. benchmarks/e2e.py per subject ("config=B,C,T,H,W@reps;..."): cold `vaeshard decode` to MP4,
#    the plain diffusers route and warm requests, each route in fresh processes (e2e-N.json). The first
#    vaeshard rep of the call is the machine's first (empty kernel cache); later reps find it on disk.
# 3. the steady decode with cuDNN's benchmark mode on and off (bench-cudnn-*.json).
# diffusers (and PyAV) must be importable (PYTHONPATH). The last lines printed are a short table.
set -uo pipefail
OUT=${1:?usage: $0 OUT [SUBJECTS]}
SUBJECTS=${2:-"wan21=1,16,21,90,160@3;wan21=1,16,21,60,104@2;wan22=1,48,31,44,80@2"}
PARTS=${3:-stream,e2e,cudnn}
E2E_TIMEOUT=${E2E_TIMEOUT:-300}  # seconds per e2e subject (Wan 2.2 720p 121 frames needs about 400)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/gpu_env.sh"; write_env "$OUT/env.txt" av
export VAESHARD_CACHE_DIR="$OUT/../vaeshard-cache"  # empty at the start of the call
rm -rf "$VAESHARD_CACHE_DIR"
for shape in 1,16,9,32,56 1,16,9,60,104; do
  [[ $PARTS == *stream* ]] || break
  timeout 120 python3 "$here/stream_gpu.py" --shape "$shape" --out "$OUT/stream-$shape.jsonl" \
    >"$OUT/stream-$shape.log" 2>&1 || echo "stream_gpu $shape failed" >>"$OUT/notes.txt"
done
IFS=';' read -ra subjects <<<"$SUBJECTS"
n=0
for item in "${subjects[@]}"; do
  [ -z "$item" ] && continue
  [[ $PARTS == *e2e* ]] || break
  n=$((n + 1)); config=${item%%=*}; rest=${item#*=}; shape=${rest%@*}; reps=${rest#*@}
  timeout "$E2E_TIMEOUT" python3 benchmarks/e2e.py --config "$config" --shape "$shape" --reps "$reps" \
    --out-dir "/tmp/e2e-$n" --json "$OUT/e2e-$n.json" >"$OUT/e2e-$n.log" 2>&1 \
    || echo "e2e $item failed" >>"$OUT/notes.txt"
  rm -rf "/tmp/e2e-$n"
done
for item in "${subjects[@]}"; do
  [ -z "$item" ] && continue
  [[ $PARTS == *cudnn* ]] || break
  config=${item%%=*}; rest=${item#*=}; shape=${rest%@*}
  for flag in "" --cudnn-benchmark; do
    timeout 150 python3 -m vaeshard bench --config "$config" --shape "$shape" --nproc 1 --modes auto --reps 3 \
      --no-ref $flag --json "$OUT/bench-cudnn-$config-${shape//,/x}${flag:+-on}.json" >/dev/null 2>&1 \
      || echo "bench $item $flag failed" >>"$OUT/notes.txt"
  done
done
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "stream-*.jsonl"))):
    for line in open(path):
        r = json.loads(line)
        print("stream", os.path.basename(path), r["check"], r.get("exact", ""), r.get("chunks", r.get("frames")), "ok" if r["ok"] else "FAILED")
for path in sorted(glob.glob(os.path.join(out, "e2e-*.json"))):
    d = json.load(open(path))
    cmd = " ".join(d["environment"]["command"][1:])
    m, w, p = d["median"], d["warm"]["median_s"], d["warm"]["peak_gib"]
    reps = " ".join(f"{r['to_file_s']:.1f}" for r in d["rows"]["vaeshard"])
    print(f"{os.path.basename(path)} {cmd}")
    print(f"  cold vaeshard {m['vaeshard']['to_file_s']:.2f} s (reps {reps}; load {m['vaeshard']['load_s']:.2f} decode "
          f"{m['vaeshard']['decode_s']:.2f} encode {m['vaeshard']['encode_s']:.2f}) | diffusers {m['diffusers']['to_file_s']:.2f} s "
          f"(load {m['diffusers']['load_s']:.2f} decode {m['diffusers']['decode_s']:.2f} encode {m['diffusers']['encode_s']:.2f})")
    print(f"  warm decode {w['decode']:.2f} decode+encode {w['decode_then_encode']:.2f} streamed {w['streamed']:.2f} s; "
          f"peak decode {p['decode']:.2f} streamed {p['streamed']:.2f} GiB")
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in d["ratios"].items()))
for path in sorted(glob.glob(os.path.join(out, "bench-cudnn-*.json"))):
    d = json.load(open(path))
    print(os.path.basename(path), " ".join(f"{r['seconds']:.3f}" for r in d["rows"]))
notes = os.path.join(out, "notes.txt")
if os.path.exists(notes):
    print(open(notes).read())
EOF
