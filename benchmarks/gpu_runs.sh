#!/usr/bin/env bash
# The GPU measurements BENCHMARKS.md records, one stage per device command:
#
#   bash benchmarks/gpu_runs.sh scaling OUT SUBJECT [NPROCS]    # vaeshard bench over 1, 2, 4 (8) GPUs
#   bash benchmarks/gpu_runs.sh headline OUT                    # the 2-GPU targets, in four stages:
#   bash benchmarks/gpu_runs.sh wan22 OUT                       #   headline, wan22, kept, parity
#   bash benchmarks/gpu_runs.sh kept OUT
#   bash benchmarks/gpu_runs.sh parity OUT
#   bash benchmarks/gpu_runs.sh families OUT PARITY_SUBJECTS SPEED_SUBJECTS   # named configs, one GPU
#   bash benchmarks/gpu_runs.sh ab OUT SUBJECTS                 # diffusers against vaeshard, one process
#   bash benchmarks/gpu_runs.sh shares OUT SUBJECTS             # one rank's share of N, one GPU
#   bash benchmarks/gpu_runs.sh minimax OUT [SHAPES]            # MiniMax-H3's tiles: speed and parity
#   bash benchmarks/gpu_runs.sh stream OUT [SUBJECTS] [PARTS]   # streamed decode and the first request
#   bash benchmarks/gpu_runs.sh versions OUT SITE_A SITE_B WHAT # two versions of vaeshard, one GPU
#
# scaling: one subject (wan21-480p, wan21-720p, wan22-720p) on one machine, every mode, against
#   diffusers' single-GPU decode measured in the same invocation, then the anchors (vLLM-Omni,
#   DistVAE) at the largest count. Needs wheels in .whl/ and the anchors in .anchors/ (BENCHMARKS.md,
#   Reproduce). Environment: MODES (default every mode), ANCHORS=1 (also time the anchors), SRC (the
#   vaeshard sources to measure, default ./src: an A/B run points it at a worktree of another commit),
#   TAG (added to the output names), EXTRA (more `vaeshard bench` arguments, e.g. --no-ref).
# headline: Wan 2.1 720p on 1 and 2 GPUs with diffusers and the anchors; 480p on 1 and 2, by default
#   and with kept graphs. wan22: Wan 2.2 720p on 1 and 2 GPUs with diffusers and the anchors. kept:
#   kept graphs holding NCCL exchanges, bit for bit against the eager decode; GPU parity of every mode,
#   Wan 2.1. parity: GPU parity of every mode, Wan 2.2 and Qwen-Image. Each of these four fits one
#   10-minute device command on a machine with 2 GPUs, packs what it wrote into OUT/<stage>.tar.gz (a
#   device command returns only a few files) and prints a short table last. GPUS=1 runs a stage's
#   steps on one GPU only (a check of the script itself; its figures are not the 2-GPU ones).
# families: PARITY_SUBJECTS "config=B,C,[T,]H,W;..." checked by gpu_parity.py in fp32 (TF32 off) and
#   bf16, every mode and tier (parity-CONFIG.jsonl / .log); SPEED_SUBJECTS, the same form, timed by
#   `vaeshard bench --nproc 1 --modes auto --dtype bf16`, the default tier, with diffusers' untiled
#   decode in the same run (bench-CONFIG-N.json); an item may add bench flags after a space
#   ("ltx=1,128,16,22,38 --norm-into-conv on"). REPS: timed decodes (default 3); BOUND: seconds each
#   bench may take (default: no bound).
# ab: SUBJECTS "config=B,C,[T,]H,W@REPS@SECONDS;...", each by `profile_decode.py video` in one process
#   bounded by SECONDS: diffusers' untiled decode and VARIANTS (default channels-first,vaeshard-into:
#   the default tier with norm_into_conv=True) timed A B A B, with peaks and max |diff| (NAME.json /
#   .log). One model build and no process per side, so the figures come in a fraction of `families`'s
#   time (its benches spawn a process per side; each needs about a minute more than its decodes).
#   DTYPE: the decodes' dtype (default bfloat16; float32 for a check on a CPU, whose bf16 convolutions
#   can run hundreds of times slower than fp32 ones where it lacks AVX-512).
# shares: SUBJECTS "config=B,C,[T,]H,W@RANKS@SECONDS;...", RANKS colon-separated (1:2:4:8), each by
#   `ranks.py share` bounded by SECONDS: the default tier's share of one rank of N, its communication
#   stood in (NAME.json / .log; REPS timed decodes, default 2; EXTRA: more `ranks.py share` arguments, e.g.
#   `--device cpu --small`); the last lines are ranks.py's summaries.
# minimax: `minimax_ab.py` at each of SHAPES (default "1,24,22,45,80;1,24,22,90,160": 720p and 1440p,
#   81 frames): diffusers' tiled decode against vaeshard's default tier, the 2**16-token batches, the
#   unfused blocks and exact `tile` (the first shape; the others: the default tier only), then
#   `gpu_parity.py --models minimax_h3` (fp32 TF32 off and bf16). MINIMAX_REPS: timed decodes (2).
# stream: PARTS any of stream,e2e,cudnn (default all three, in that order); SUBJECTS
#   "config=B,C,T,H,W@reps;...". 1. `gpu_parity.py stream`: stream_decode's chunks == vae.decode bit
#   for bit (fast tier with CUDA graphs at a small size, and at 480p; the exact tier), the CLI
#   writer's CUDA path == the CPU's. 2. benchmarks/e2e.py per subject: cold `vaeshard decode` to MP4,
#   the plain diffusers route and warm requests, each route in fresh processes (e2e-N.json); the
#   first vaeshard rep of the call is the machine's first (empty kernel cache), later reps find it on
#   disk. E2E_TIMEOUT: seconds per subject. 3. the steady decode with cuDNN's benchmark mode on and
#   off (bench-cudnn-*.json).
# versions: each version installed in a folder of its own (pip install --no-deps --target); WHAT
#   bits: `interleaved_ab.py bits` for Wan 2.1 720p and Wan 2.2 720p, A then B (the SHA-256 of every
#   mode's output); bench-SUBJECT: `vaeshard bench --subject SUBJECT --nproc 1 --modes auto` four
#   times, A B A B, each with diffusers' untiled decode; parity: each version's own GPU parity script
#   (PARITY_A, PARITY_B: paths), A then B.
# families, stream and versions need diffusers importable (PYTHONPATH; stream: PyAV too). Each stage
# writes an env.txt (GPU, driver, versions, date) and prints a short table last.
set -uo pipefail
STAGE=${1:?usage: $0 scaling|headline|wan22|kept|parity|families|ab|shares|minimax|stream|versions OUT [...]}
OUT=${2:?usage: $0 STAGE OUT [...]}
shift 2
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONUNBUFFERED=1

write_env() {  # write_env FILE [MODULE...]: GPU, driver, versions (and each MODULE's), CPU count, date
  local file=$1; shift
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$file" 2>&1
  python3 - "$@" >>"$file" 2>&1 <<'PY'
import importlib, sys
import torch, triton, diffusers
parts = ["torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
         "triton", triton.__version__, "diffusers", diffusers.__version__]
for name in sys.argv[1:]:
    parts += [name, importlib.import_module(name).__version__]
print(*parts)
PY
  nproc >>"$file"
  date -u >>"$file"
}

install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
}

scaling() {
  local subject=${1:?usage: $0 scaling OUT wan21-480p|wan21-720p|wan22-720p [NPROCS]} nprocs=${2:-1,2,4}
  local name="$subject${TAG:+_$TAG}" a
  mkdir -p "$OUT"
  install_wheels
  export PYTHONPATH=/tmp/site:${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH}
  python3 -m vaeshard bench --subject "$subject" --dtype bf16 --reps 3 --nproc "$nprocs" \
    --modes "${MODES:-tile,auto,spatial_shard_height,spatial_shard_width}" \
    --json "$OUT/scaling_$name.json" --plot "$OUT/scaling_$name.png" ${EXTRA:-} 2>>"$OUT/err.log" \
    | tee "$OUT/scaling_$name.txt"
  [[ -n "${ANCHORS:-}" ]] || return 0
  [[ -d .anchors/vllm_omni/_vendor ]] \
    || bash .anchors/vllm_omni/prepare.sh "$PWD/.whl/vllm_omni-0.30.0-py3-none-any.whl" >/dev/null
  case "$subject" in
    wan21-480p) a="--config wan21 --shape 1,16,21,60,104" ;;
    wan21-720p) a="--config wan21 --shape 1,16,21,90,160" ;;
    wan22-720p) a="--config wan22 --shape 1,48,31,44,80" ;;
  esac
  local r="python3 -m torch.distributed.run --standalone --nproc_per_node=${nprocs##*,}"
  anchor() { echo ">>> $*" >&2; timeout 120 "$@" 2>>"$OUT/err.log" | grep '^{' | tee -a "$OUT/anchors_$subject.jsonl"; }
  anchor $r .anchors/distvae/run_decode.py $a --dtype bf16 --reps 3 --no-ref --mode row
  anchor $r .anchors/vllm_omni/run_decode.py $a --dtype bf16 --reps 3 --no-ref --mode spatial_shard_width \
    --fastpath fused
}

two_gpus() {  # the stages headline, wan22, kept, parity
  local work="$OUT/$STAGE" g=${GPUS:-2}
  mkdir -p "$work"
  install_wheels
  export PYTHONPATH=/tmp/site:$PWD/src
  (nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; date -u
   python3 -c "import torch, triton, diffusers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, diffusers.__version__)") \
    >"$work/env.txt" 2>&1
  step() {  # step NAME SECONDS COMMAND...: the command's output in NAME.log, its exit status and time printed
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" >"$work/$name.log" 2>&1
    echo "$name rc=$? ${SECONDS}s (took $((SECONDS - start)) s)" >>"$work/steps.txt"
  }
  local r="torchrun --standalone --nproc_per_node=$g" counts
  counts=$([ "$g" = 1 ] && echo 1 || echo "1,$g")  # the GPU counts each scaling run times
  local self=(bash "$HERE/gpu_runs.sh" scaling "$work")
  case "$STAGE" in
    headline)
      step wan21-720p 300 env ANCHORS=1 MODES=auto "${self[@]}" wan21-720p "$counts"
      step wan21-480p 120 env MODES=auto "${self[@]}" wan21-480p "$counts"
      step wan21-480p-keep 90 env MODES=auto TAG=keep EXTRA="--keep-cuda-graphs --reps 5 --no-ref" \
        "${self[@]}" wan21-480p "$g"
      ;;
    wan22) step wan22-720p 500 env ANCHORS=1 MODES=auto "${self[@]}" wan22-720p "$counts" ;;
    kept)
      step kept_graphs 200 $r "$HERE/ranks.py" kept-graphs --mode spatial_shard_height
      step parity 300 $r "$HERE/gpu_parity.py" --models wan21 --out "$work/parity.jsonl"
      ;;
    parity)
      step parity_wan22 380 $r "$HERE/gpu_parity.py" --models wan22 --out "$work/parity_wan22.jsonl"
      step parity_qwen 150 $r "$HERE/gpu_parity.py" --models qwenimage --out "$work/parity_qwen.jsonl"
      ;;
  esac
  local tgz="$OUT/$STAGE.tar.gz" f
  tar -czf "$tgz" -C "$OUT" "$STAGE" && rm -rf "$work"
  tar -xzOf "$tgz" "$STAGE/steps.txt"
  for f in $(tar -tzf "$tgz" | grep -E 'scaling_.*\.txt$'); do
    echo "== $f"
    tar -xzOf "$tgz" "$f" | grep -E '^(diffusers|auto|tile|spatial)'
  done
  if tar -tzf "$tgz" | grep 'anchors_' >/dev/null; then
    tar -xzOf "$tgz" --wildcards '*/anchors_*.jsonl' | cut -c1-200
  fi
  if [ "$STAGE" = kept ]; then
    tar -xzOf "$tgz" "$STAGE/kept_graphs.log" | grep -vE "Warning|_warn_once|should be kept" | tail -4 | cut -c1-200
  fi
  if [ "$STAGE" = kept ] || [ "$STAGE" = parity ]; then
    tar -xzOf "$tgz" --wildcards "$STAGE/parity*.log" | grep -E "^(wan2|qwen)" | cut -c1-240
  fi
  return 0
}

families() {
  local item config shape n=0 parity speed
  mkdir -p "$OUT"
  write_env "$OUT/env.txt"
  IFS=';' read -ra parity <<<"${1:-}"
  for item in "${parity[@]}"; do
    [ -z "$item" ] && continue
    config=${item%%=*}
    python3 "$HERE/gpu_parity.py" --models "$config" --shapes "$item" --out "$OUT/parity-$config.jsonl" \
      >"$OUT/parity-$config.log" 2>&1 || echo "parity $config: not every row passed (or it failed)" >>"$OUT/notes.txt"
  done
  IFS=';' read -ra speed <<<"${2:-}"
  local flags bound
  for item in "${speed[@]}"; do
    [ -z "$item" ] && continue
    n=$((n + 1)); config=${item%%=*}; shape=${item#*=}; flags=""
    if [[ $shape == *" "* ]]; then flags=${shape#* }; shape=${shape%% *}; fi
    bound=()
    [ -n "${BOUND:-}" ] && bound=(timeout "$BOUND")
    # shellcheck disable=SC2086  # flags: the item's own words
    "${bound[@]}" python3 -m vaeshard bench --config "$config" --shape "$shape" --nproc 1 --modes auto --dtype bf16 \
      --reps "${REPS:-3}" $flags --json "$OUT/bench-$config-$n.json" >"$OUT/bench-$config-$n.log" 2>&1 \
      || echo "bench $item failed (or ran past BOUND)" >>"$OUT/notes.txt"
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
}

stream() {
  local subjects_text=${1:-"wan21=1,16,21,90,160@3;wan21=1,16,21,60,104@2;wan22=1,48,31,44,80@2"}
  local parts=${2:-stream,e2e,cudnn} e2e_timeout=${E2E_TIMEOUT:-300}  # (Wan 2.2 720p 121 frames needs about 400)
  local shape item config rest reps flag n=0 subjects
  mkdir -p "$OUT"
  write_env "$OUT/env.txt" av
  export VAESHARD_CACHE_DIR="$OUT/../vaeshard-cache"  # empty at the start of the call
  rm -rf "$VAESHARD_CACHE_DIR"
  for shape in 1,16,9,32,56 1,16,9,60,104; do
    [[ $parts == *stream* ]] || break
    timeout 120 python3 "$HERE/gpu_parity.py" stream --shape "$shape" --out "$OUT/stream-$shape.jsonl" \
      >"$OUT/stream-$shape.log" 2>&1 || echo "stream $shape failed" >>"$OUT/notes.txt"
  done
  IFS=';' read -ra subjects <<<"$subjects_text"
  for item in "${subjects[@]}"; do
    [ -z "$item" ] && continue
    [[ $parts == *e2e* ]] || break
    n=$((n + 1)); config=${item%%=*}; rest=${item#*=}; shape=${rest%@*}; reps=${rest#*@}
    timeout "$e2e_timeout" python3 "$HERE/e2e.py" --config "$config" --shape "$shape" --reps "$reps" \
      --out-dir "/tmp/e2e-$n" --json "$OUT/e2e-$n.json" >"$OUT/e2e-$n.log" 2>&1 \
      || echo "e2e $item failed" >>"$OUT/notes.txt"
    rm -rf "/tmp/e2e-$n"
  done
  for item in "${subjects[@]}"; do
    [ -z "$item" ] && continue
    [[ $parts == *cudnn* ]] || break
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
}

versions() {
  local A=${1:?usage: $0 versions OUT SITE_A SITE_B bits|bench-SUBJECT|parity} B=${2:?} what=${3:?}
  local base=${PYTHONPATH:-} v site round subject
  mkdir -p "$OUT"
  write_env "$OUT/env.txt"
  with() { PYTHONPATH="$1${base:+:$base}" "${@:2}"; }
  case "$what" in
    bits)
      for v in A B; do site=${!v}
        with "$site" python3 "$HERE/interleaved_ab.py" bits --config wan21 --shape 1,16,21,90,160 --modes auto,tile \
          --json "$OUT/bits.jsonl" >>"$OUT/bits.log" 2>&1 || echo "bits $v wan21 failed" >>"$OUT/bits.log"
        with "$site" python3 "$HERE/interleaved_ab.py" bits --config wan22 --shape 1,48,31,44,80 --modes auto,tile \
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
      subject=${what#bench-}
      for round in 1 2; do for v in A B; do site=${!v}
        with "$site" python3 -m vaeshard bench --subject "$subject" --nproc 1 --modes auto --reps 5 \
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
    *) echo "unknown versions run $what (bits, bench-SUBJECT, parity)" >&2; return 2 ;;
  esac
}

each_subject() {  # each_subject RUN ITEMS: `RUN config shape middle seconds name` per "config=shape@middle@seconds"
  local run=$1 item config rest shape middle seconds
  mkdir -p "$OUT"
  write_env "$OUT/env.txt"
  IFS=';' read -ra items <<<"$2"
  for item in "${items[@]}"; do
    [ -z "$item" ] && continue
    config=${item%%=*}; rest=${item#*=}; shape=${rest%%@*}; rest=${rest#*@}; middle=${rest%@*}; seconds=${rest#*@}
    "$run" "$config" "$shape" "$middle" "$seconds" "$config-${shape//,/x}" \
      || echo "$item failed (or ran past its seconds)" >>"$OUT/notes.txt"
  done
  [ -f "$OUT/notes.txt" ] && cat "$OUT/notes.txt"
}

ab_one() {  # ab_one config shape reps seconds name
  timeout "$4" python3 "$HERE/profile_decode.py" video --subject "$1=$2" --reps "$3" --dtype "${DTYPE:-bfloat16}" \
    --variants "${VARIANTS:-channels-first,vaeshard-into}" --json "$OUT/$5.json" >"$OUT/$5.log" 2>&1
}

ab() {  # one process per subject: diffusers' decode against VARIANTS, A B A B (profile_decode.py video)
  each_subject ab_one "${1:?usage: $0 ab OUT 'config=B,C,[T,]H,W@REPS@SECONDS;...'}"
  tail -q -n 2 "$OUT"/*.log | grep "|" | grep -v "^subject"
}

share_one() {  # share_one config shape ranks seconds name
  timeout "$4" python3 "$HERE/ranks.py" share --config "$1" --latent "$2" --ranks "${3//:/,}" \
    --reps "${REPS:-2}" ${EXTRA:-} --json "$OUT/$5.json" >"$OUT/$5.log" 2>&1
}

shares() {  # one rank's share of each subject's N-rank decode, on one GPU (ranks.py share)
  each_subject share_one "${1:?usage: $0 shares OUT 'config=B,C,[T,]H,W@RANKS@SECONDS;...'}"
  grep -h "^summary" "$OUT"/*.log  # ranks.py's last lines: each share's median and peak per rank count
}

minimax() {  # MiniMax-H3 on one GPU: minimax_ab.py per shape, then its GPU parity
  local shape first=1 variants
  mkdir -p "$OUT"
  write_env "$OUT/env.txt"
  IFS=';' read -ra shapes <<<"${1:-1,24,22,45,80;1,24,22,90,160}"
  for shape in "${shapes[@]}"; do
    variants=diffusers,vaeshard
    [ $first = 1 ] && variants=diffusers,vaeshard,vaeshard-b16,vaeshard-unfused,vaeshard-tile
    python3 "$HERE/minimax_ab.py" --shape "$shape" --reps "${MINIMAX_REPS:-2}" --variants "$variants" \
      $([ $first = 1 ] && echo --profile) --json "$OUT/ab-${shape//,/x}.json" >"$OUT/ab-${shape//,/x}.log" 2>&1 \
      || echo "minimax_ab.py $shape failed" >>"$OUT/notes.txt"
    first=0
  done
  python3 "$HERE/gpu_parity.py" --models minimax_h3 --out "$OUT/parity.jsonl" >"$OUT/parity.log" 2>&1 \
    || echo "gpu_parity.py failed" >>"$OUT/notes.txt"
  [ -f "$OUT/notes.txt" ] && cat "$OUT/notes.txt"
  grep -h "minimax_h3 " "$OUT"/parity.log | tail -n 16
  grep -h " | " "$OUT"/ab-*.log | grep -v "^variant"
}

case "$STAGE" in
  scaling) scaling "$@" ;;
  headline | wan22 | kept | parity) two_gpus ;;
  families) families "$@" ;;
  ab) ab "$@" ;;
  shares) shares "$@" ;;
  minimax) minimax "$@" ;;
  stream) stream "$@" ;;
  versions) versions "$@" ;;
  *) echo "unknown stage $STAGE (scaling, headline, wan22, kept, parity, families, ab, shares, minimax, stream, versions)" >&2; exit 2 ;;
esac
