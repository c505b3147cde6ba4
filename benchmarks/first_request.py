#!/usr/bin/env python3
"""Where the time of the FIRST decode in a fresh process goes (Wan 2.1, 720p, 81 frames, bf16, one GPU).

    python3 benchmarks/first_request.py --out /tmp/first_request        # parent: runs the variants
    python3 benchmarks/first_request.py --child a --json X.json ...     # one fresh process (the parent does this)

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

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

LATENT = (1, 16, 21, 90, 160)


# --------------------------------------------------------------------------------------------- child
def child(args) -> None:
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


def parent(args) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args()
    args.shape = tuple(int(s) for s in args.shape.split(","))
    if args.child:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
