"""The time a user waits, from a fresh process to the closed video file (BENCHMARKS.md, "Streamed
decode and the first request").

    python3 benchmarks/e2e.py --config wan21 --shape 1,16,21,90,160 --reps 2 --json e2e.json
    python3 benchmarks/e2e.py --model DIR --latents FILE --device cpu --reps 1   # a saved model and latent
    python3 benchmarks/e2e.py first-request --out /tmp/first_request   # where a first decode's time goes

Three routes over the same local model folder and latent file, each in fresh processes, interleaved
rep by rep:
- cold vaeshard: `vaeshard decode LATENTS --model DIR --out X.mp4` as a user runs it (stamps from
  its `--timings` file split the wall time into load, first decode, and the rest of the write);
- plain diffusers, the route a user would write: `from_pretrained`, `vae.decode`, the pipeline's
  `VideoProcessor.postprocess_video` and `diffusers.utils.export_to_video`;
- warm vaeshard, in one process after a first request: `vae.decode` alone, the decode then the
  whole video encoded, and the decode streamed into the writer (encode overlapped), with each
  one's peak memory.
A route's time is from its launch to its closed file (`to_file_s`, what the targets count); the
process's exit after it is shown apart.
`python3 benchmarks/e2e.py diffusers|warm ...` are the children; `run_e2e` the parent.

`first-request`: the phases of a fresh process's first decode, by variant (a cold and a warm Triton
cache, cuDNN's benchmark mode on and off, plain diffusers): `e2e.py first-request --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()  # a first-request child's start: before torch, after the standard library's imports

GIB = 1024**3
CHILD_TIMEOUT_S = 900  # one route's fresh process: far above a 720p decode's, so a stuck one ends the run


# --- the parent ------------------------------------------------------------------------------------


def prepare(model, shape, folder: Path, dtype: str) -> tuple[str, str]:
    """A named config's random-weight model saved as a local folder, and a seeded latent file: the
    e2e routes load both from disk as users do. Returns (model folder, latent file)."""
    import torch
    from safetensors.torch import save_file

    from vaeshard.cli.bench import make_latent, torch_dtype

    model_dir, latents = folder / "model", folder / "latents.safetensors"
    model.load(dtype=torch_dtype(dtype)).save_pretrained(model_dir)
    save_file({"latents": make_latent(shape).to(torch.float32)}, latents)
    return str(model_dir), str(latents)


def run_e2e(
    model_dir: str, latents: str, folder: Path, *, dtype: str, fps: int, reps: int, nproc: int, device: str, log
) -> dict:
    """Every route `reps` times (cold ones interleaved, each a fresh process), then the warm child."""
    exe = [sys.executable, str(Path(__file__).resolve())]
    rows: dict[str, list[dict]] = {"vaeshard": [], "diffusers": []}
    for rep in range(reps):
        for route in ("vaeshard", "diffusers"):
            out = folder / f"{route}.mp4"
            stamps = folder / f"{route}-{rep}.json"
            if route == "vaeshard":
                cmd = [sys.executable, "-m", "vaeshard", "decode", latents, "--model", model_dir, "--out", str(out)]
                cmd += ["--fps", str(fps), "--dtype", dtype, "--device", device, "--quiet", "--timings", str(stamps)]
                cmd += ["--nproc", str(nproc)] if nproc > 1 else []
            else:
                cmd = [*exe, "diffusers", latents, "--model", model_dir]
                cmd += ["--out", str(out), "--fps", str(fps), "--dtype", dtype, "--device", device]
                cmd += ["--timings", str(stamps)]
            row = _timed(cmd, stamps)
            row["bytes"] = out.stat().st_size
            rows[route].append(row)
            log(f"e2e {route} rep {rep + 1}/{reps}: {row['wall_s']:.2f} s")
    warm_json = folder / "warm.json"
    cmd = [*exe, "warm", latents, "--model", model_dir, "--out", str(folder / "warm.mp4")]
    cmd += ["--fps", str(fps), "--dtype", dtype, "--device", device, "--reps", str(reps), "--timings", str(warm_json)]
    _check_run(cmd)
    warm = json.loads(warm_json.read_text())
    log("e2e warm: " + ", ".join(f"{k} {v:.2f} s" for k, v in warm["median_s"].items()))
    return summarize(rows, warm)


def _timed(cmd: list[str], stamps: Path) -> dict:
    launched = time.time()
    _check_run(cmd)
    wall = time.time() - launched
    t = json.loads(stamps.read_text())
    return {
        "wall_s": wall,
        "load_s": t["loaded"] - launched,
        "decode_s": t["decoded"] - t["loaded"],
        "encode_s": t["written"] - t["decoded"],
        "to_file_s": t["written"] - launched,  # what the targets count: a fresh process to the closed file
        "exit_s": launched + wall - t["written"],
        **({"encoder": t["encoder"]} if "encoder" in t else {}),
    }


def _check_run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)} did not finish within {CHILD_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-4000:]}")


def summarize(rows: dict[str, list[dict]], warm: dict) -> dict:
    """Medians per route and phase, and the ratios the targets are stated in."""
    med = {
        route: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], float)}
        for route, rs in rows.items()
    }
    w = warm["median_s"]
    return {
        "rows": rows,
        "median": med,
        "warm": warm,
        "ratios": {
            "cold_over_warm_decode_then_encode": med["vaeshard"]["to_file_s"] / w["decode_then_encode"],
            "diffusers_over_vaeshard_cold": med["diffusers"]["to_file_s"] / med["vaeshard"]["to_file_s"],
            "warm_streamed_over_warm_decode": w["streamed"] / w["decode"],
            **(
                {"streamed_peak_over_decode_peak": warm["peak_gib"]["streamed"] / warm["peak_gib"]["decode"]}
                if warm["peak_gib"]
                else {}
            ),
        },
    }


def table(result: dict) -> str:
    lines = ["route              to file s  load s  decode s  encode s  exit s", "-" * 64]
    for route, m in result["median"].items():
        lines.append(
            f"{route + ' (cold)':<18} {m['to_file_s']:9.2f} {m['load_s']:7.2f} {m['decode_s']:9.2f} "
            f"{m['encode_s']:9.2f} {m['exit_s']:7.2f}"
        )
    w, peak = result["warm"]["median_s"], result["warm"]["peak_gib"]
    for name in ("decode", "decode_then_encode", "streamed"):
        lines.append(f"warm {name:<18} {w[name]:7.2f}" + (f"  peak {peak[name]:.2f} GiB" if peak else ""))
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return "\n".join(lines)


def command(args) -> int:
    """Check the arguments, prepare the model folder and latent where a named config is given, run
    the routes, print the table (and write the JSON)."""
    import torch

    from vaeshard.cli import io
    from vaeshard.cli.bench import environment

    if args.config is not None:
        if args.shape is None or args.latents is not None:
            raise SystemExit("--config needs --shape B,C,T,H,W (its latent is made and saved), no --latents")
        model = io.named_model(args.config)
    elif args.model is not None:
        if args.latents is None or args.shape is not None:
            raise SystemExit("--model needs --latents FILE (and no --shape): the routes load both from disk")
        model = io.resolve_model(args.model, args.subfolder, offline=True)
        if model.path is None or not Path(model.path).is_dir():
            raise SystemExit("the routes load the model from a local folder: give --model a folder")
    else:
        raise SystemExit("say what to decode: --config NAME --shape B,C,T,H,W, or --model DIR --latents FILE")
    if model.latent_ndim() != 5:
        raise SystemExit("the routes write an MP4: they need a video VAE")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.device_count() < args.nproc:
        raise SystemExit(f"--nproc {args.nproc} needs {args.nproc} GPUs; {torch.cuda.device_count()} visible")
    folder = Path(args.out_dir or tempfile.mkdtemp(prefix="vaeshard-e2e-"))
    folder.mkdir(parents=True, exist_ok=True)
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    if args.config is not None:
        io.check_latent_shape(args.shape, model, source=f"latent shape {tuple(args.shape)}")
        model_dir, latents = prepare(model, args.shape, folder, dtype)
    else:
        model_dir, latents = model.path, args.latents
        io.check_latents(io.load_latents(latents), model, source=f"latents in {latents!r}")
    result = run_e2e(
        model_dir,
        latents,
        folder,
        dtype=dtype,
        fps=args.fps,
        reps=args.reps,
        nproc=args.nproc,
        device=device,
        log=lambda line: print(f"[e2e] {line}", file=sys.stderr, flush=True),
    )
    print(table(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(device), **result}, indent=1))
        print(f"wrote {args.json}")
    return 0


# --- the first request: where its time goes ----------------------------------------

FIRST_REQUEST_DOC = """Where the time of the FIRST decode in a fresh process goes (Wan 2.1, 720p, 81 frames, bf16,
one GPU).

    python3 benchmarks/e2e.py first-request --out /tmp/first_request        # parent: runs the variants
    python3 benchmarks/e2e.py first-request --child a --json X.json ...     # one fresh process (the parent does this)

The parent launches fresh `python3` children one after another and records each one's wall time from
Popen to exit. Each child stamps (time.perf_counter) its phases: import torch; import diffusers and
vaeshard; CUDA context; model build + to(cuda); latent ready; parallelize (+ plan); request 1 and 2
through `vaeshard.stream_decode` (synchronize, then a stamp per chunk); request 3 through
`vae.decode(z).sample`. Triton's compile (a disk-cache hit included) and kernel loads are timed by
wrapping `triton.compiler.compile` and `CompiledKernel._init_handles` in the child (nothing under
src/ changes); vaeshard's debug log (CUDA graph captures, with their host time) goes to a file.

Variants, in order:
  warm  page-cache warmer (not a measurement of vaeshard): import torch, one cuDNN conv3d and one matmul,
        so that (a) and (b) differ in Triton's disk cache only, not in the OS page cache of libcudnn etc.
  a     TRITON_CACHE_DIR a fresh empty folder (cold Triton disk cache), cuDNN benchmark on (default)
  b     the same TRITON_CACHE_DIR (warm disk cache), benchmark on
  c     warm Triton cache, FastOptions(cudnn_benchmark=False)
  e     plain diffusers (no vaeshard): vae.decode(z).sample, requests 1..3
  bprof as b, with torch.profiler around request 1 and request 2 (key_averages tables to text files)
(d: vaeshard never sets torch.backends.cudnn.benchmark_limit, so a "left default" variant is b itself.)
"""

LATENT = (1, 16, 21, 90, 160)


# --------------------------------------------------------------------------------------------- child
def first_child(args) -> None:
    rec: dict = {"variant": args.child, "phases": {}, "env_triton_cache": os.environ.get("TRITON_CACHE_DIR")}
    last = [T0]

    def stamp(name):
        now = time.perf_counter()
        rec["phases"][name] = round(now - last[0], 4)
        last[0] = now
        save()

    def save():
        rec["child_total_s"] = round(time.perf_counter() - T0, 4)
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)

    import torch

    DT = getattr(torch, args.dtype)
    stamp("import_torch")
    if args.child == "warm":
        dev = args.device
        x = torch.randn(1, 8, 4, 32, 32, device=dev)
        w = torch.randn(8, 8, 3, 3, 3, device=dev)
        torch.nn.functional.conv3d(x, w, padding=1)
        (torch.randn(256, 256, device=dev) @ torch.randn(256, 256, device=dev)).sum().item()
        stamp("cuda_conv_matmul")
        save()
        return

    # Triton compile / load timing (a cache hit is a "compile" that loads from disk)
    tri = rec["triton"] = {"compiles": [], "init_handles_s": 0.0, "init_handles_n": 0}
    try:
        import triton
        import triton.compiler as tc
        import triton.compiler.compiler as tcc

        orig_compile = tcc.compile

        def timed_compile(src, *a, **k):
            began = time.perf_counter()
            with torch.profiler.record_function("triton.compiler.compile"):
                out = orig_compile(src, *a, **k)
            name = getattr(getattr(src, "fn", None), "__name__", None) or str(getattr(src, "name", "?"))
            tri["compiles"].append([name, round(time.perf_counter() - began, 4)])
            return out

        tcc.compile = timed_compile
        tc.compile = timed_compile
        orig_init = tcc.CompiledKernel._init_handles

        def timed_init(self):
            if self.module is not None:
                return orig_init(self)
            began = time.perf_counter()
            with torch.profiler.record_function("triton.CompiledKernel._init_handles"):
                out = orig_init(self)
            tri["init_handles_s"] += time.perf_counter() - began
            tri["init_handles_n"] += 1
            return out

        tcc.CompiledKernel._init_handles = timed_init
        rec["versions_triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        tri["error"] = repr(exc)
    stamp("triton_hooks")

    import diffusers

    if args.child != "e":
        import vaeshard
        import vaeshard.cli.io as vio

    stamp("import_diffusers_vaeshard" if args.child != "e" else "import_diffusers")

    import logging

    torch.set_grad_enabled(False)  # plain decode: diffusers' decode is not under no_grad by itself
    lg = logging.getLogger("vaeshard")
    lg.setLevel(logging.DEBUG)
    h = logging.FileHandler(args.json[:-5] + ".vaeshard.log", mode="w")
    h.setFormatter(logging.Formatter("%(relativeCreated)9.0f ms %(message)s"))
    lg.addHandler(h)

    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
    stamp("cuda_context")

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if args.child != "e":
        vae = vio.named_model("wan21").load(dtype=DT, device=args.device)
    else:  # the same build without vaeshard: AutoencoderKLWan's defaults are Wan 2.1, seed 0
        torch.manual_seed(0)
        diffusers.utils.logging.set_verbosity_error()
        vae = diffusers.AutoencoderKLWan().to(dtype=DT).to(args.device).eval()
    sync()
    stamp("model_build_to_device")

    z = torch.randn(*args.shape, generator=torch.Generator().manual_seed(0)).to(args.device, DT)
    sync()
    stamp("latent_ready")

    rec["versions"] = {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "cudnn_benchmark_limit_default": torch.backends.cudnn.benchmark_limit,
        "cudnn_benchmark_global": torch.backends.cudnn.benchmark,
    }

    if args.child != "e":
        fast = vaeshard.FastOptions(cudnn_benchmark=(args.child != "c"))
        vaeshard.parallelize(vae, fast=fast)
        stamp("parallelize")
        p = vaeshard.plan(vae, z.shape)
        rec["plan"] = p.explain()
        stamp("plan_explain")

    prof_ctx = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])

    def request(i: int):
        nonlocal prof_ctx
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        c0 = len(tri["compiles"])
        prof = None
        if args.profile and i <= 2:
            prof = profile(activities=acts, record_shapes=False)
            prof.__enter__()
        sync()
        began = time.perf_counter()
        chunks = []
        if args.child == "e" or i == 3:
            out = vae.decode(z).sample
            sync()
            frames = out.shape[2]
            del out
        else:
            prev = began
            frames = 0
            it = iter(vaeshard.stream_decode(vae, z))
            k = 0
            while True:
                with torch.profiler.record_function(f"chunk{k:02d}"):
                    try:
                        c = next(it)
                    except StopIteration:
                        break
                    sync()
                now = time.perf_counter()
                frames += c.shape[2]
                chunks.append([c.shape[2], round(now - prev, 4)])
                prev = now
                del c
                k += 1
        total = time.perf_counter() - began
        r = {"total_s": round(total, 4), "frames": frames, "chunks": chunks}
        r["triton_compiles"] = len(tri["compiles"]) - c0
        r["triton_compile_s"] = round(sum(t for _, t in tri["compiles"][c0:]), 4)
        if dev.type == "cuda":
            r["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if prof is not None:
            prof.__exit__(None, None, None)
            base = args.json[:-5]
            ka = prof.key_averages()
            with open(f"{base}.prof_req{i}.txt", "w") as f:
                f.write(f"request {i}: {total:.3f} s wall (profiled)\n\n")
                f.write("== sorted by cpu_time_total ==\n")
                f.write(ka.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
                f.write("\n== sorted by self_cpu_time_total ==\n")
                f.write(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
                if dev.type == "cuda":
                    f.write("\n== sorted by self_device_time_total ==\n")
                    f.write(ka.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))
            # compact machine-readable top rows
            rows = []
            for e in sorted(ka, key=lambda e: -e.cpu_time_total)[:40]:
                rows.append(
                    {
                        "name": e.key,
                        "n": e.count,
                        "cpu_total_ms": round(e.cpu_time_total / 1e3, 2),
                        "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
                    }
                )
            r["profile_top"] = rows
        rec[f"req{i}"] = r
        return total

    for i in (1, 2, 3):
        request(i)
        stamp(f"request{i}")
        save()
    rec["triton"]["init_handles_s"] = round(rec["triton"]["init_handles_s"], 4)
    save()


# -------------------------------------------------------------------------------------------- parent
def dir_stats(path):
    n = size = 0
    for root, _, files in os.walk(path):
        for f in files:
            n += 1
            size += os.path.getsize(os.path.join(root, f))
    return n, size


def first_parent(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    tcache = os.path.join(args.tmp, "triton_cache_fresh")
    subprocess.run(["rm", "-rf", tcache])
    os.makedirs(tcache)
    variants = args.variants.split(",")
    summary = []
    for v in variants:
        env = dict(os.environ)
        env["TRITON_CACHE_DIR"] = tcache
        js = os.path.join(args.out, f"{v}.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "first-request",
            "--child",
            "b" if v == "bprof" else v,
            "--json",
            js,
            "--device",
            args.device,
            "--shape",
            ",".join(map(str, args.shape)),
            "--dtype",
            args.dtype,
        ]
        if v == "bprof":
            cmd.append("--profile")
        began = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            log, _ = p.communicate(timeout=args.child_timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            log, _ = p.communicate()
            log += "\n[parent] TIMEOUT\n"
        wall = time.perf_counter() - began
        with open(os.path.join(args.out, f"{v}.stdout.txt"), "w") as f:
            f.write(log[-20000:])
        rec = {}
        if os.path.exists(js):
            with open(js) as f:
                rec = json.load(f)
        rec["parent_wall_s"] = round(wall, 3)
        rec["returncode"] = p.returncode
        rec["triton_cache_after"] = dict(zip(("files", "bytes"), dir_stats(tcache)))
        with open(js, "w") as f:
            json.dump(rec, f, indent=1)
        summary.append((v, rec))
        print(f"[parent] {v}: rc={p.returncode} wall={wall:.1f}s", flush=True)
        if p.returncode != 0:
            print(log[-3000:], flush=True)
    print_table(summary)


def print_table(summary) -> None:
    keys = [
        "import_torch",
        "import_diffusers_vaeshard",
        "cuda_context",
        "model_build_to_device",
        "latent_ready",
        "parallelize",
        "request1",
        "request2",
        "request3",
    ]
    short = ["imp_torch", "imp_dif+vs", "cuda_ctx", "build", "latent", "parallel", "req1", "req2", "req3"]
    print("\nvariant  wall  child " + " ".join(f"{s:>10}" for s in short) + "  trit_n trit_s")
    for v, rec in summary:
        ph = rec.get("phases", {})
        if "import_diffusers" in ph:
            ph = {**ph, "import_diffusers_vaeshard": ph["import_diffusers"]}
        cells = " ".join(f"{ph.get(k, float('nan')):10.2f}" for k in keys)
        tri = rec.get("triton", {})
        n = len(tri.get("compiles", []))
        s = sum(t for _, t in tri.get("compiles", []))
        print(f"{v:7} {rec.get('parent_wall_s', 0):5.1f} {rec.get('child_total_s', 0):5.1f} {cells}  {n:6d} {s:6.2f}")
    print("\nfirst chunks (s): req1 | req2")
    for v, rec in summary:
        c1 = [c[1] for c in rec.get("req1", {}).get("chunks", [])][:8]
        c2 = [c[1] for c in rec.get("req2", {}).get("chunks", [])][:8]
        n1 = len(rec.get("req1", {}).get("chunks", []))
        print(f"{v:7} n={n1:2d} " + " ".join(f"{x:.2f}" for x in c1) + " | " + " ".join(f"{x:.2f}" for x in c2))


def first_request(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="e2e.py first-request", description=FIRST_REQUEST_DOC, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default=",".join(map(str, LATENT)), help="latent shape, comma-separated")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 (float32: a CPU smoke test)")
    ap.add_argument("--out", default="/tmp/first_request")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--variants", default="warm,a,b,c,e,bprof")
    ap.add_argument("--child-timeout", type=float, default=150.0)
    args = ap.parse_args(argv)
    args.shape = tuple(int(s) for s in args.shape.split(","))
    if args.child:
        first_child(args)
    else:
        first_parent(args)
    return 0


# --- the children ----------------------------------------------------------------------------------


def _diffusers_route(args) -> None:
    """The plain route, as a user writes it (one device)."""
    import diffusers
    import torch
    from diffusers.utils import export_to_video
    from diffusers.video_processor import VideoProcessor
    from safetensors.torch import load_file

    from vaeshard.cli.bench import torch_dtype

    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = torch_dtype(args.dtype)
    vae = getattr(diffusers, config["_class_name"]).from_pretrained(args.model, torch_dtype=dtype).to(args.device)
    z = load_file(args.latents)["latents"].to(args.device, dtype)
    _sync(args.device)
    stamps = {"loaded": time.time()}
    with torch.no_grad():
        video = vae.decode(z).sample
    _sync(args.device)
    stamps["decoded"] = time.time()
    frames = VideoProcessor(vae_scale_factor=8).postprocess_video(video, output_type="np")[0]
    try:
        export_to_video(frames, args.out, fps=args.fps)
        stamps["encoder"] = "export_to_video (imageio-ffmpeg)"
    except AttributeError:  # imageio without its ffmpeg: what export_to_video does without imageio
        from diffusers.utils.export_utils import _legacy_export_to_video

        _legacy_export_to_video(frames, args.out, fps=args.fps)
        stamps["encoder"] = "export_to_video's OpenCV backend (imageio-ffmpeg missing)"
    stamps["written"] = time.time()
    Path(args.timings).write_text(json.dumps(stamps))


def _warm_route(args) -> None:
    """One process, one model: a first request (not timed), then per rep `vae.decode` alone (the whole
    video held), the decode then the whole video written, and the decode streamed into the writer
    (one chunk held at a time), with peak memory."""
    import torch

    import vaeshard
    from vaeshard.cli import io
    from vaeshard.cli.bench import torch_dtype
    from vaeshard.cli.writer import ChunkWriter, write_output, write_stream

    model = io.resolve_model(args.model, None, offline=True)
    vae = model.load(dtype=torch_dtype(args.dtype), device=args.device)
    z = io.load_latents(args.latents).to(args.device, vae.dtype)
    cuda = args.device == "cuda"
    vaeshard.parallelize(vae)

    def decode():
        vae.decode(z)

    def decode_then_encode():
        write_output(vae.decode(z).sample, args.out, "mp4", args.fps)

    def streamed():
        with ChunkWriter(args.out, "mp4", args.fps) as writer:
            write_stream(vae, z, writer)

    runs = {"decode": decode, "decode_then_encode": decode_then_encode, "streamed": streamed}
    streamed()  # the process's first request
    times: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, float] = {}
    for _ in range(args.reps):
        for name, fn in runs.items():
            _sync(args.device)
            if cuda:
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fn()
            _sync(args.device)
            times[name].append(time.perf_counter() - t0)
            if cuda:  # on the CPU a process's peak is not resettable per run: none reported
                peaks[name] = max(peaks.get(name, 0.0), (torch.cuda.max_memory_allocated() - base) / GIB)
    result = {"times_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()}, "peak_gib": peaks}
    Path(args.timings).write_text(json.dumps(result))


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _shape(text: str) -> list[int]:
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["first-request"]:
        return first_request(argv[1:])
    if argv[:1] in (["diffusers"], ["warm"]):  # a child the parent started
        child = argparse.ArgumentParser(prog="e2e.py diffusers|warm")
        child.add_argument("route", choices=("diffusers", "warm"))
        child.add_argument("latents")
        child.add_argument("--model", required=True)
        child.add_argument("--out", required=True)
        child.add_argument("--fps", type=int, default=16)
        child.add_argument("--dtype", default="bf16")
        child.add_argument("--device", default="cuda")
        child.add_argument("--reps", type=int, default=3)
        child.add_argument("--timings", required=True)
        args = child.parse_args(argv)
        (_diffusers_route if args.route == "diffusers" else _warm_route)(args)
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--config", default=None, help="a named real config (vaeshard.cli.io), random weights")
    what.add_argument("--model", default=None, metavar="DIR", help="a local diffusers folder")
    parser.add_argument("--subfolder", default=None, help="subfolder of DIR holding the VAE")
    parser.add_argument("--shape", type=_shape, default=None, metavar="B,C,T,H,W", help="with --config")
    parser.add_argument("--latents", default=None, metavar="FILE", help="with --model: the latent file to decode")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="default: bf16 on cuda")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--nproc", type=int, default=1, help="ranks of the cold `vaeshard decode` route")
    parser.add_argument("--reps", type=int, default=3, help="runs of each route (default 3)")
    parser.add_argument("--fps", type=int, default=16, help="frame rate of the MP4s (default 16)")
    parser.add_argument(
        "--out-dir", default=None, metavar="DIR", help="where the runs write (default: a temporary folder)"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write every figure and the environment")
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
