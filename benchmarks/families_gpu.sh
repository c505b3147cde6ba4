#!/usr/bin/env bash
# GPU parity and 1-GPU speed of named configs (vaeshard.cli.io NAMED_CONFIGS), in one call:
#
#   bash benchmarks/families_gpu.sh OUT PARITY_SUBJECTS SPEED_SUBJECTS
#
# PARITY_SUBJECTS: "config=B,C,[T,]H,W;..." checked by gpu_parity.py in fp32 (TF32 off) and bf16,
#                  every mode and tier (parity-CONFIG.jsonl / .log)
# SPEED_SUBJECTS:  "config=B,C,[T,]H,W;..." timed by `vaeshard bench --nproc 1 --modes auto --dtype bf16`,
#                  the default tier, with diffusers' untiled decode in the same run (bench-CONFIG-N.json)
# diffusers must be importable (PYTHONPATH). The last lines printed are a short table of both.
set -uo pipefail
OUT=${1:?usage: $0 OUT PARITY_SUBJECTS SPEED_SUBJECTS}; PARITY=${2:-}; SPEED=${3:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/gpu_env.sh"; write_env "$OUT/env.txt"
IFS=';' read -ra parity <<<"$PARITY"
for item in "${parity[@]}"; do
  [ -z "$item" ] && continue
  config=${item%%=*}
  python3 "$here/gpu_parity.py" --models "$config" --shapes "$item" --out "$OUT/parity-$config.jsonl" \
    >"$OUT/parity-$config.log" 2>&1 || echo "parity $config: not every row passed (or it failed)" >>"$OUT/notes.txt"
done
IFS=';' read -ra speed <<<"$SPEED"
n=0
for item in "${speed[@]}"; do
  [ -z "$item" ] && continue
  n=$((n + 1)); config=${item%%=*}; shape=${item#*=}
  python3 -m vaeshard bench --config "$config" --shape "$shape" --nproc 1 --modes auto --dtype bf16 --reps 3 \
    --json "$OUT/bench-$config-$n.json" >"$OUT/bench-$config-$n.log" 2>&1 || echo "bench $item failed" >>"$OUT/notes.txt"
done
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "parity-*.jsonl"))):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    failed = [f"{r['dtype']} {r['mode']}" for r in rows if not r.get("ok")]
    print(os.path.basename(path), len(rows), "rows,", "all ok" if not failed else "FAILED: " + ", ".join(failed))
for path in sorted(glob.glob(os.path.join(out, "bench-*.json"))):
    b = json.load(open(path))
    ref, row = b.get("reference") or {}, b["rows"][0]
    print(os.path.basename(path), b["shape"], "vaeshard %.4f s" % row["seconds"], "diffusers %s s" % (
        "%.4f" % ref["seconds"] if "seconds" in ref else "-"), "x%.2f" % row.get("speedup_vs_diffusers", float("nan")),
        "peak %.2f GiB" % (row["peak_bytes_per_rank"][0] / 2**30),
        "diffusers peak %s GiB" % ("%.2f" % (ref["peak_bytes"] / 2**30) if "peak_bytes" in ref else "-"))
if os.path.exists(os.path.join(out, "notes.txt")):
    print(open(os.path.join(out, "notes.txt")).read())
EOF
