#!/usr/bin/env bash
# An A/B of two versions of vaeshard on one GPU, interleaved in one call. Each version is installed in
# a folder of its own (pip install --no-deps --target); diffusers is on PYTHONPATH already.
#
#   bash benchmarks/versions_ab.sh OUT SITE_A SITE_B STAGE
#
# STAGE bits:         decode_bits.py for Wan 2.1 720p and Wan 2.2 720p, A then B (the SHA-256 of every
#                     mode's output, fast tier with cuDNN's heuristic, exact tier, tile)
# STAGE bench-SUBJECT: `vaeshard bench --preset SUBJECT --nproc 1 --modes auto` four times, A B A B, each
#                     with diffusers' untiled decode in the same process group run
# STAGE parity:       each version's own GPU parity script (PARITY_A, PARITY_B: paths), A then B
# Every output goes to OUT as .jsonl / .json / .log; the last lines printed are a short table.
set -uo pipefail
OUT=${1:?usage: $0 OUT SITE_A SITE_B STAGE}; A=${2:?}; B=${3:?}; STAGE=${4:?}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
base=${PYTHONPATH:-}
with() { PYTHONPATH="$1${base:+:$base}" "${@:2}"; }
here=$(cd "$(dirname "$0")" && pwd)
case "$STAGE" in
  bits)
    for v in A B; do site=${!v}
      with "$site" python3 "$here/decode_bits.py" --config wan21 --shape 1,16,21,90,160 --modes auto,tile \
        --json "$OUT/bits.jsonl" >>"$OUT/bits.log" 2>&1 || echo "bits $v wan21 failed" >>"$OUT/bits.log"
      with "$site" python3 "$here/decode_bits.py" --config wan22 --shape 1,48,31,44,80 --modes auto,tile \
        --json "$OUT/bits.jsonl" >>"$OUT/bits.log" 2>&1 || echo "bits $v wan22 failed" >>"$OUT/bits.log"
    done
    python3 - "$OUT/bits.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["config"], r["mode"], r["exact"])
by = {}
for r in rows:
    by.setdefault(key(r), {})[r["version"]] = r
for k, v in sorted(by.items()):
    hashes = {ver: r["sha256"][:12] for ver, r in v.items()}
    print(k, hashes, "IDENTICAL" if len(set(r["sha256"] for r in v.values())) == 1 and len(v) == 2 else "DIFFER")
EOF
    ;;
  bench-*)
    subject=${STAGE#bench-}
    for round in 1 2; do for v in A B; do site=${!v}
      with "$site" python3 -m vaeshard bench --preset "$subject" --nproc 1 --modes auto --reps 5 \
        --json "$OUT/bench-$subject-$v$round.json" >"$OUT/bench-$subject-$v$round.log" 2>&1 || echo "bench $v$round failed"
    done; done
    python3 - "$OUT" "$subject" <<'EOF'
import json, statistics, sys
out, subject = sys.argv[1:]
for v in "AB":
    runs = [json.load(open(f"{out}/bench-{subject}-{v}{i}.json")) for i in (1, 2)]
    ours = [r["rows"][0]["seconds"] for r in runs]
    ref = [r["reference"]["seconds"] for r in runs]
    peak = max(max(r["rows"][0]["peak_bytes_per_rank"]) for r in runs) / 2**30
    print(f"{subject} {v}: vaeshard {ours} s, diffusers {ref} s, speed-up {statistics.median(ref) / statistics.median(ours):.2f}x, "
          f"peak {peak:.2f} GiB, version {runs[0]['environment']['vaeshard']}")
EOF
    ;;
  parity)
    with "$A" python3 "${PARITY_A:?}" --out "$OUT/parity-A.jsonl" >"$OUT/parity-A.log" 2>&1; echo "parity A exit $?"
    with "$B" python3 "${PARITY_B:?}" --out "$OUT/parity-B.jsonl" >"$OUT/parity-B.log" 2>&1; echo "parity B exit $?"
    tail -n 25 "$OUT/parity-B.log"
    ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
