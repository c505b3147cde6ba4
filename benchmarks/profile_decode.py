#!/usr/bin/env python3
"""Where the time of a decode goes, in three commands (random weights, real configs, bf16).

    python3 benchmarks/profile_decode.py --preset wan21-720p --frames 5 [--vaeshard]
    torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py --preset wan21-720p --frames 5 --mode auto
    python3 benchmarks/profile_decode.py video --subject AutoencoderKLHunyuanVideo15=1,32,9,45,80 [--json OUT.json]
    torchrun --standalone --nproc_per_node=2 benchmarks/profile_decode.py host      # CPU ranks (gloo)

(wan, the default) One Wan decode on CUDA: top kernels and time per kernel class. `--cold` first
times the process's first decode (cuDNN autotuning and kernel compiles included). `--memory` adds,
per rank, the decode's peak and what is allocated at that moment by source line (the allocator's
trace). `--frames` limits the latent frames profiled (the per-frame cost is steady after the first
frame). Without --vaeshard it profiles diffusers' own decode on one GPU; under torchrun every rank
profiles vaeshard's decode in `--mode` and prints its own summary, rank 0 also the kernel table.
"GPU idle" is wall time minus the union of the intervals in which any kernel of that rank ran: time
the GPU waited for the host or for a peer. The idle time inside the span of the profiled kernels is
also attributed to the class of the kernel that ends each gap.

(video) diffusers' untiled decode of a VAE (a diffusers class with its default config, or a named
config, and a latent shape; image VAEs too), interleaved in one process: as it is (channels-first),
with the model and latent channels-last (`torch.channels_last_3d`, or `torch.channels_last` for 4-D
latents: cuDNN's NDHWC / NHWC kernels; pads and norms keep whatever layout they produce), and with
`--variants`, vaeshard's default tier and its norms into the next convolutions (`vaeshard-into`;
`vaeshard-into-cudnn`: the same with PyTorch's convolutions only, `triton_convs=False`; `vaeshard-same`:
diffusers' layers with the GroupNorms in PyTorch's arithmetic by vaeshard's kernels, as a family whose
fast tier is off runs; any vaeshard variant + `-stepN`: with `frames_per_step=N`, e.g. `vaeshard-step2`).
Each variant is timed `--reps` times after a warm-up (medians; its peak and its max |diff| from
diffusers' output taken on the warm-up), then profiled once: GPU time (CPU time on a machine without
one) by kernel class. The last lines are a table of every variant.

(host) The host's cost of a decode: Wan 2.1's layer structure at 8 base channels, a tiny latent, on
CPU ranks. The layers, and so the Python and dispatch work per latent frame, are those of the real
Wan 2.1 decoder (dim_mult 1, 2, 4, 4, two residual blocks per stage); the arithmetic is tiny, so the
time per latent frame is mostly host work. On gloo, sends and receives are synchronous TCP and add
their own cost; the 1-rank figure is the one that compares with the GPU's kernel time per latent
frame.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import vaeshard
from vaeshard.cli.bench import PRESETS
from vaeshard.cli.io import NAMED_CONFIGS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_model import steps_setting

# --- wan ----------------------------------------------------------------------------------


CLASSES = [
    ("layout transpose", r"nchwToNhwc|nhwcToNchw|transpose|permute"),
    ("attention", r"[Aa]ttention|flash|fmha|softmax"),  # before convolution: fmha kernels are cutlass ones
    ("convolution", r"conv|implicit|sm90_xmma|cudnn|winograd|fprop|dgrad|cutlass|gemm|nhwc|wgrad"),
    ("cat / pad / copy", r"cat|pad|copy|Copy|[Mm]emcpy|CatArray|reflection|constant_pad"),
    ("norm (fp32)", r"norm|reduce|Reduce|sqrt|rsqrt|RowwiseMoments|ComputeFusedParams"),  # PyTorch's GroupNorm
    ("elementwise", r"elementwise|vectorized|silu|mul|add|clamp|fill|bias_residual"),
    ("upsample", r"upsample|nearest"),
]


CLASSES.insert(0, ("communication (NCCL)", r"nccl|ncclDevKernel"))


def classify(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name):
            return label
    return "other"


def wan(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="profile_decode.py [wan]", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="wan21-720p", choices=sorted(PRESETS))
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument(
        "--shape",
        help="latent shape B,C,T,H,W instead of the preset's (e.g. a half-width latent on one "
        "GPU against a 2-rank width shard: the same per-GPU work without communication)",
    )
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--vaeshard", action="store_true", help="profile vaeshard's 1-rank path instead")
    ap.add_argument("--mode", default="auto", help="vaeshard mode under torchrun (default auto)")
    ap.add_argument("--exact", action="store_true", help="vaeshard's exact tier")
    ap.add_argument(
        "--frames-per-step",
        type=steps_setting,
        default="auto",
        help="vaeshard's frames_per_step (fast tier): auto (default) or a number",
    )
    ap.add_argument("--max-layer-frames", type=int, default=None, help="vaeshard's max_layer_frames (fast tier)")
    ap.add_argument(
        "--memory", action="store_true", help="also: what is allocated at the decode's peak, by source line"
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="also time the process's first decode (before any warm-up: cuDNN autotuning, kernel compiles)",
    )
    ap.add_argument(
        "--copies",
        action="store_true",
        help="also: one decode profiled with input shapes, the copy operations with the most GPU time by shape",
    )
    ap.add_argument(
        "--host-profile",
        action="store_true",
        help="also: one decode under cProfile on rank 0, the functions with the most host time",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="also: per decoder call and rank, the host's issue time, the GPU's span, its NCCL and idle time",
    )
    args = ap.parse_args(argv)
    from diffusers import AutoencoderKLWan

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=device)
        rank = dist.get_rank()
    config, shape, _ = PRESETS[args.preset]
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
    shape = tuple(int(v) for v in args.shape.split(",")) if args.shape else (*shape[:2], args.frames, *shape[3:])
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    if args.vaeshard or world > 1:
        import vaeshard

        fast = vaeshard.FastOptions(frames_per_step=args.frames_per_step, max_layer_frames=args.max_layer_frames)
        vaeshard.parallelize(vae, mode=args.mode, exact=args.exact, fast=fast)
        print(f"[rank {rank}] {vaeshard.plan(vae, z.shape, world, args.mode).reason}", flush=True)
    with torch.no_grad():
        if args.cold:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            vae.decode(z)
            torch.cuda.synchronize()
            print(f"[rank {rank}] first decode in this process: {time.perf_counter() - t0:.3f} s", flush=True)
        vae.decode(z)  # warm-up at the full size, so the timed decode finds the allocator grown as the profiled one
        torch.cuda.synchronize()
    # before any profiler runs in this process, so the profiler's tracing cannot slow the host's
    # launches in it (taken after a profiled decode, the host's times per call measured far longer)
    unprofiled = _timeline_unprofiled(vae, z) if args.timeline else None
    with torch.no_grad():
        t0 = time.perf_counter()
        vae.decode(z)
        returned = time.perf_counter() - t0
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            vae.decode(z)
            torch.cuda.synchronize()
    kernels = defaultdict(float)
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.key] += evt.device_time_total / 1e6
    total = sum(kernels.values())
    by_class = defaultdict(float)
    for name, t in kernels.items():
        by_class[classify(name)] += t
    busy = _busy_seconds(prof)
    print(
        f"[rank {rank}] {args.preset} latent {shape}, {world} rank(s): wall {wall:.3f} s, GPU kernel time "
        f"{total:.3f} s, GPU busy {busy:.3f} s, GPU idle {max(wall - busy, 0):.3f} s, communication "
        f"{by_class.get('communication (NCCL)', 0.0):.3f} s",
        flush=True,
    )
    print(
        f"[rank {rank}] host: decode returned after {returned:.3f} s of the {wall:.3f} s wall (near the wall: "
        f"the host, or a wait for the GPU inside the decode, set the pace); runtime calls: "
        f"{_runtime_calls(prof)}",
        flush=True,
    )
    span, inside, gaps = _idle_gaps(prof)
    waits = ", ".join(
        f"{label} {t:.3f} s in {n} gaps" for label, (t, n) in sorted(gaps.items(), key=lambda kv: -kv[1][0])
    )
    print(
        f"[rank {rank}] GPU idle inside the kernel span ({span:.3f} s): {inside:.3f} s, before the start of: "
        f"{waits or 'none'}",
        flush=True,
    )
    if args.memory:
        with torch.no_grad():
            _memory_report(vae, z, rank)
    if args.copies:
        _copy_report(vae, z, rank)
    if args.host_profile:
        _host_profile(vae, z, rank, args.top)
    if args.timeline:
        _timeline(vae, z, rank, world, unprofiled)
    by_rank = [kernels]
    if world > 1:
        import torch.distributed as dist

        by_rank = [None] * world
        dist.all_gather_object(by_rank, dict(kernels))
    if rank != 0:
        _finish(world)
        return
    if world > 1:  # the same shapes on every rank: a kernel whose time differs shows where one rank is slower

        def spread(n: str) -> float:
            return max(r.get(n, 0.0) for r in by_rank) - min(r.get(n, 0.0) for r in by_rank)

        names = sorted(set().union(*by_rank), key=lambda n: -spread(n))
        print("kernels whose GPU time differs most between the ranks (s per rank):")
        for name in names[:10]:
            print("  " + " ".join(f"{r.get(name, 0.0):7.3f}" for r in by_rank) + f"  {name[:110]}")
    print("time by kernel class:")
    for label, t in sorted(by_class.items(), key=lambda kv: -kv[1]):
        print(f"  {label:18} {t:8.3f} s {100 * t / total:5.1f}%")
    print(f"top {args.top} kernels:")
    for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {t:8.3f} s {100 * t / total:5.1f}%  {name[:110]}")
    _finish(world)


def _memory_report(vae, z, rank: int, top: int = 12) -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        vae.decode(z)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated() - base
    device = torch.cuda.current_device()
    traced_peak, sites = peak_breakdown(snapshot["device_traces"][device])
    print(
        f"[rank {rank}] peak allocated during the decode {peak / 2**30:.2f} GiB above the "
        f"{base / 2**30:.2f} GiB held before it; at the traced peak ({traced_peak / 2**30:.2f} GiB) by source:"
    )
    for site, size in sites[:top]:
        print(f"[rank {rank}]   {size / 2**30:6.2f} GiB  {site}")


def peak_breakdown(entries: list[dict], marks=("vaeshard", "diffusers")) -> tuple[int, list[tuple[str, int]]]:
    """Replay a CUDA allocator trace: the peak of live bytes, and the live bytes then by source line.

    A block counts from its `alloc` to its `free_requested` (when memory_allocated drops). The source
    is the innermost Python frame in a file whose path contains one of `marks`.
    """
    current = peak = 0
    peak_index = -1
    sizes: dict[int, int] = {}
    for i, e in enumerate(entries):
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
            current += e["size"]
            if current > peak:
                peak, peak_index = current, i
        elif e["action"] == "free_requested" and e["addr"] in sizes:
            current -= sizes.pop(e["addr"])
    live: dict[int, tuple[int, str]] = {}
    for e in entries[: peak_index + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _site(e.get("frames") or [], marks))
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    by_site: dict[str, int] = defaultdict(int)
    for size, site in live.values():
        by_site[site] += size
    return peak, sorted(by_site.items(), key=lambda kv: -kv[1])


def _site(frames: list[dict], marks) -> str:
    for f in frames:
        name = f.get("filename", "")
        if any(m in name for m in marks):
            short = re.sub(r"^.*?/(site-packages|src)/", "", name)
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "(outside vaeshard and diffusers)"


def _busy_seconds(prof) -> float:
    """Length of the union of all CUDA kernel intervals (kernels on several streams overlap): their
    span less every gap between them."""
    span, idle, _ = _idle_gaps(prof, min_us=0.0)
    return span - idle


def _copy_report(vae, z, rank: int, top: int = 12) -> None:
    """The copying operators (copy_, clone, cat, contiguous copies) of one decode by input shapes,
    with their GPU time: which tensors the copy kernels of the kernel table move."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        vae.decode(z)
        torch.cuda.synchronize()
    if rank != 0:
        return
    rows = [
        e
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key in ("aten::copy_", "aten::clone", "aten::cat", "aten::contiguous") and e.device_time_total > 0
    ]
    print("copy operations by input shape (rank 0; GPU time of the kernels they launched):")
    for e in sorted(rows, key=lambda e: -e.device_time_total)[:top]:
        print(f"  {e.device_time_total / 1e6:7.3f} s x{e.count:<5} {e.key:14} {str(e.input_shapes)[:120]}", flush=True)


def _host_profile(vae, z, rank: int, top: int) -> None:
    """One decode under cProfile (every rank runs it, rank 0 prints): the host's own time by function."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        vae.decode(z)
        profiler.disable()
        torch.cuda.synchronize()
    if rank == 0:
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
            print(
                f"host time by function, by {order} (cProfile, rank 0):\n" + text.getvalue().split("\n\n", 1)[-1],
                flush=True,
            )


def _timeline_unprofiled(vae, z) -> tuple[list[float], list[float], float]:
    """Host issue time and GPU span (ms) of each decoder call of one unprofiled decode (host clock
    and CUDA events at each call's start), and the ms before the host reached the first call. A call
    made while a CUDA graph is being captured (runtime/graphs.py) gets no entry: an event recorded there
    belongs to the graph and cannot be timed, so its span counts in the call before it."""
    host: list[float] = []
    events: list = []

    def start(module, args):
        if torch.cuda.is_current_stream_capturing():
            return
        host.append(time.perf_counter())
        events.append(torch.cuda.Event(enable_timing=True))
        events[-1].record()

    handle = vae.decoder.register_forward_pre_hook(start)
    try:
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            vae.decode(z)
            returned = time.perf_counter()
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            torch.cuda.synchronize()
    finally:
        handle.remove()
    host_ms = [1e3 * (b - a) for a, b in zip(host, host[1:] + [returned])]
    gpu_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:] + [end])]
    return host_ms, gpu_ms, 1e3 * (host[0] - t0)


def _timeline(vae, z, rank: int, world: int, unprofiled) -> None:
    """Per decoder call (each latent frame of the decode loop) and rank: when the host issued it and
    how long the GPU took (`_timeline_unprofiled`, taken before anything was profiled in this
    process), then from one profiled decode that call's NCCL kernel time and GPU idle time. Each
    call's GPU work is told apart by a marker kernel (`torch.cuda._sleep(1)`) launched as the call
    starts. The last row also holds what follows the last call (the gather of a sharded decode's
    output). Rank 0 prints every rank's rows side by side."""
    host_ms, gpu_ms, lead_ms = unprofiled
    calls = len(host_ms)
    handle = vae.decoder.register_forward_pre_hook(lambda module, args: torch.cuda._sleep(1))
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            vae.decode(z)
            torch.cuda.synchronize()
    finally:
        handle.remove()
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    split = per_call(spans, calls)
    if split is None:
        print(
            f"[rank {rank}] timeline: {sum('spin' in n for _, _, n in spans)} marker kernels for {calls} decoder "
            f"calls; no NCCL / idle split",
            flush=True,
        )
        split = [(float("nan"), float("nan"))] * calls
    rows = [(host_ms[k], gpu_ms[k], *split[k]) for k in range(calls)]
    table = [rows]
    if world > 1:
        import torch.distributed as dist

        table = [None] * world
        dist.all_gather_object(table, rows)
    if rank != 0 or not all(table):
        return
    print(
        f"timeline per decoder call (ms; host: issue time of the call, unprofiled; gpu: span of its work on the "
        f"GPU, unprofiled; nccl, idle: NCCL kernel time and GPU idle time inside it, profiled; the host reached "
        f"the first call after {lead_ms:.1f} ms):"
    )
    print("call " + "".join(f"| rank {r}: host    gpu   nccl   idle " for r in range(len(table))))
    totals = [[0.0] * 4 for _ in table]
    for k in range(calls):
        cells = []
        for r, rank_rows in enumerate(table):
            cells.append("| " + " ".join(f"{v:6.1f}" for v in rank_rows[k]) + " ")
            totals[r] = [a + b for a, b in zip(totals[r], rank_rows[k])]
        print(f"{k if k < calls - 1 else 'last':>4} " + "".join(cells))
    print(" sum " + "".join("| " + " ".join(f"{v:6.1f}" for v in t) + " " for t in totals), flush=True)


def per_call(spans: list[tuple[float, float, str]], calls: int) -> list[tuple[float, float]] | None:
    """(NCCL kernel ms, GPU idle ms) per decoder call from sorted (start us, end us, name) kernel spans
    in which a marker kernel (`spin` in its name) starts each call: a call holds the kernels that
    start between its marker and the next, and its idle time runs up to the next marker (a gap
    before it: the GPU waited for that call's launches); the last call ends with its last kernel.
    None if there are not `calls` markers."""
    starts = [s for s, _, name in spans if "spin" in name]
    if len(starts) != calls:
        return None
    bounds = starts + [max(e for _, e, _ in spans) + 1]
    out = []
    for k in range(calls):
        inside = [(s, e, n) for s, e, n in spans if bounds[k] <= s < bounds[k + 1] and "spin" not in n]
        nccl = sum(e - s for s, e, n in inside if classify(n) == "communication (NCCL)") / 1e3
        busy, last = 0.0, bounds[k]
        for s, e, _ in inside:
            busy += max(0.0, e - max(s, last))
            last = max(last, e)
        stop = bounds[k + 1] if k + 1 < calls else max([e for _, e, _ in inside] + [bounds[k]])
        out.append((nccl, max((stop - bounds[k] - busy) / 1e3, 0.0)))
    return out


def _runtime_calls(prof, top: int = 6) -> str:
    """The CUDA runtime / driver calls the host made during the profiled decode, by total time: a
    synchronising call (cudaStreamSynchronize, cudaMemcpy, cudaMalloc/cudaFree) with a large share
    means the host waited for the GPU."""
    calls: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA and re.match(r"(cuda|cu[A-Z]|nccl)", e.name):
            c = calls[e.name]
            c[0] += (e.time_range.end - e.time_range.start) / 1e6
            c[1] += 1
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][0])[:top]
    return ", ".join(f"{name} {t:.3f} s x{n}" for name, (t, n) in ranked) or "none recorded"


def _idle_gaps(prof, min_us: float = 10.0) -> tuple[float, float, dict[str, tuple[float, int]]]:
    """GPU idle time inside the span of the profiled kernels, attributed to the kernel class that
    ends each gap (what the GPU was waiting to start: a convolution the host had not launched yet,
    an NCCL transfer whose peer was not ready, ...). Returns (span s, idle s, {class: (s, gaps)})."""
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return 0.0, 0.0, {}
    gaps: dict[str, list] = defaultdict(lambda: [0.0, 0])
    end, idle = spans[0][1], 0.0
    for start, stop, name in spans[1:]:
        if start - end >= min_us:
            gap = gaps[classify(name)]
            gap[0] += (start - end) / 1e6
            gap[1] += 1
            idle += (start - end) / 1e6
        end = max(end, stop)
    return (end - spans[0][0]) / 1e6, idle, {k: (v[0], v[1]) for k, v in gaps.items()}


def _finish(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


# --- video ----------------------------------------------------------------------------------


def _decode(vae, z):
    with torch.no_grad():
        return vae.decode(z, return_dict=False)[0]


def _channels_last(ndim: int):
    return torch.channels_last_3d if ndim == 5 else torch.channels_last


def _layout(vae, last: bool) -> None:
    """Every 4-D and 5-D weight of `vae` channels-last (`last`) or contiguous, in place."""
    for p in vae.parameters():
        if p.ndim in (4, 5):
            p.data = p.data.contiguous(memory_format=_channels_last(p.ndim) if last else torch.contiguous_format)


def _timed(vae, z, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    _decode(vae, z)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _by_class(vae, z, device, top: int = 0) -> tuple[dict[str, float], list[list]]:
    """GPU time (CPU time without one) of one decode by kernel class, and its `top` kernels by time
    ([name, seconds, calls])."""
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        _decode(vae, z)
        if device.type == "cuda":
            torch.cuda.synchronize()
    out, kernels = defaultdict(float), []
    for evt in prof.key_averages():
        t = evt.device_time_total if device.type == "cuda" else evt.self_cpu_time_total
        if t:
            out[classify(evt.key)] += t / 1e6
            kernels.append([evt.key[:100], round(t / 1e6, 5), evt.count])
    return dict(out), sorted(kernels, key=lambda k: -k[1])[:top]


def _by_op(vae, z, device, top: int) -> list[list]:
    """The `top` PyTorch operators of one decode by the GPU time of the kernels each launched itself
    (CPU time without a GPU), grouped by input shapes: [operator, seconds, calls, input shapes],
    naming what a kernel table's truncated template names do not."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        _decode(vae, z)
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages(group_by_input_shape=True):
        t = evt.self_device_time_total if device.type == "cuda" else evt.self_cpu_time_total
        if t and evt.key.startswith(("aten::", "triton", "_")):
            rows.append([evt.key, round(t / 1e6, 5), evt.count, str(evt.input_shapes)[:160]])
    return sorted(rows, key=lambda r: -r[1])[:top]


VARIANTS = ("channels-first", "channels-last", "vaeshard", "vaeshard-into", "vaeshard-into-cudnn", "vaeshard-same")


def _step(label: str) -> tuple[str, int | None]:
    """A variant's name without its `-stepN` suffix, and N (None: no suffix)."""
    m = re.fullmatch(r"(.+)-step([1-9][0-9]*)", label)
    return (label, None) if m is None else (m.group(1), int(m.group(2)))


def _known(label: str) -> bool:
    base, step = _step(label)
    return base in VARIANTS and (step is None or base.startswith("vaeshard"))


_SLOWER = _SAME = None  # tuning.FAST_TIER_SLOWER_FAMILIES and GROUP_NORM_SAME_KERNELS as vaeshard defines them


def _vaeshard(vae, label: str) -> None:
    """Set `vae`'s vaeshard settings for a variant: its default fast tier, with (-into) the norms
    written into the next convolution's padded input, (-cudnn) with PyTorch's convolutions only,
    (-stepN) N latent frames per decoder call; (-same) diffusers' layers with the GroupNorms of
    kernels/group_norm_same.py: tuning.GROUP_NORM_SAME_KERNELS on and the family counted among
    tuning.FAST_TIER_SLOWER_FAMILIES meanwhile."""
    import vaeshard
    from vaeshard import tuning
    from vaeshard.families import family_for

    label, step = _step(label)
    global _SLOWER, _SAME
    if _SLOWER is None:
        _SLOWER, _SAME = tuning.FAST_TIER_SLOWER_FAMILIES, tuning.GROUP_NORM_SAME_KERNELS
    same = label == "vaeshard-same"
    tuning.FAST_TIER_SLOWER_FAMILIES = _SLOWER + ((family_for(vae).name,) if same else ())
    tuning.GROUP_NORM_SAME_KERNELS = True if same else _SAME
    into = True if label.startswith("vaeshard-into") else "auto"
    fast = vaeshard.FastOptions(
        norm_into_conv=into, triton_convs=not label.endswith("-cudnn"), frames_per_step=step or "auto"
    )
    vaeshard.parallelize(vae, fast=fast)


def _model(name: str):
    """A diffusers class with its default config, or one of the named configs, random weights."""
    import diffusers

    torch.manual_seed(0)
    if name in NAMED_CONFIGS:
        cls, kwargs = NAMED_CONFIGS[name]
        return getattr(diffusers, cls)(**kwargs)
    return getattr(diffusers, name)()


def run_subject(
    spec: str,
    reps: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    variants: tuple[str, ...] = VARIANTS[:2],
    top: int = 0,
    ops: int = 0,
) -> dict:
    name, shape_text = spec.split("=")
    shape = tuple(int(v) for v in shape_text.split(","))
    vae = vaeshard.cast_as_loaded(_model(name).eval(), dtype).to(device)
    for attr in ("use_tiling", "use_slicing", "use_framewise_decoding", "use_framewise_encoding"):
        if hasattr(vae, attr):
            setattr(vae, attr, False)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    row = {"subject": name, "latent": list(shape), "variants": {}}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        reference = _decode(vae, z)  # warm-up; an out-of-memory here is recorded as the subject's result
    except torch.OutOfMemoryError as exc:
        row["error"] = f"diffusers' untiled decode ran out of memory: {str(exc).splitlines()[0]}"
        return row
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    reference = reference.float().cpu()
    channels_last = z.contiguous(memory_format=_channels_last(z.ndim))
    inputs = {v: channels_last if v == "channels-last" else z for v in variants}

    def enter(label: str) -> None:  # the same module, converted or parallelized in place between variants
        import vaeshard

        _layout(vae, label == "channels-last")
        if label.startswith("vaeshard"):
            _vaeshard(vae, label)
        else:  # diffusers' own decode again (a no-op on a VAE never parallelized)
            vaeshard.unparallelize(vae)

    def peak_of(label: str) -> tuple[float, int, float]:
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t = _timed(vae, inputs[label], device)
        out = _decode(vae, inputs[label])
        diff = (out.float().cpu() - reference).abs().max().item()
        used = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
        return t, used, diff

    warm = {}
    for label in variants:  # each variant's own warm-up (cuDNN picks its algorithms), its peak and diff
        enter(label)
        warm[label] = peak_of(label)
    times = defaultdict(list)
    for _ in range(reps):  # A B A B
        for label in variants:
            enter(label)
            times[label].append(_timed(vae, inputs[label], device))
            print(f"  {name} {label}: {times[label][-1]:.3f} s", file=sys.stderr, flush=True)
    for label in variants:
        enter(label)
        by_class, kernels = _by_class(vae, inputs[label], device, top)
        row["variants"][label] = {
            "seconds": statistics.median(times[label]),
            "all": times[label],
            "peak_bytes": warm[label][1],
            "max_abs_diff": warm[label][2],
            "by_class": by_class,
        }
        if top:
            row["variants"][label]["top_kernels"] = kernels
        if ops:
            row["variants"][label]["top_ops"] = _by_op(vae, inputs[label], device, ops)
    row["diffusers_peak_bytes"] = peak
    vae.to("meta")  # its memory back before the next subject (the closures above keep the module)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def video(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="profile_decode.py video",
        description="diffusers' untiled decode of video VAEs, channels-first and -last (see the module's --help)",
    )
    ap.add_argument("--subject", action="append", required=True, help="Class=B,C,T,H,W or CONFIG=B,C,T,H,W")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS[:2]),
        help=f"comma-separated, any of {', '.join(VARIANTS)}; a vaeshard one + -stepN: frames_per_step=N "
        "(default: the first two)",
    )
    ap.add_argument("--top", type=int, default=0, help="also print each variant's N kernels with the most time")
    ap.add_argument(
        "--cudnn-benchmark",
        choices=("on", "off"),
        default="on",
        help="cuDNN's benchmark mode for diffusers' side (default on, as every earlier record of this "
        "command; BENCHMARKS.md's protocol rows: off). vaeshard's variants set it per request (FastOptions)",
    )
    ap.add_argument(
        "--ops", type=int, default=0, help="also print each variant's N operators (by input shapes) with the most time"
    )
    ap.add_argument(
        "--compile-flex",
        action="store_true",
        help="FlexAttention through torch.compile (gpu_parity.py's --compile-flex), for diffusers' LTX-2.5 "
        "diffusion decoder: its eager path holds every query's scores against every key",
    )
    args = ap.parse_args(argv)
    if args.compile_flex:
        from gpu_parity import compile_flex

        compile_flex()
    variants = tuple(args.variants.split(","))
    if not all(map(_known, variants)) or variants[0] != "channels-first":
        ap.error(f"--variants: channels-first first, then any of {', '.join(VARIANTS[1:])} (vaeshard ones + -stepN)")
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    rows = []
    for spec in args.subject:
        row = run_subject(spec, args.reps, device, getattr(torch, args.dtype), variants, args.top, args.ops)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    for row in rows:
        for label, v in row.get("variants", {}).items():
            if v.get("top_kernels"):
                print(f"{row['subject']} {label}: kernels with the most time (s, calls)")
                for name, t, calls in v["top_kernels"]:
                    print(f"  {t:8.4f} {calls:6d}  {name}")
            if v.get("top_ops"):
                print(f"{row['subject']} {label}: operators with the most time (s, calls, input shapes)")
                for name, t, calls, shapes in v["top_ops"]:
                    print(f"  {t:8.4f} {calls:6d}  {name}  {shapes}")
    print("subject | latent | variant | s | vs channels-first | peak GiB | max|diff| | top classes (s)")
    for row in rows:
        if "error" in row:
            print(f"{row['subject']} | {row['latent']} | {row['error']}")
            continue
        base = row["variants"]["channels-first"]["seconds"]
        for label, v in row["variants"].items():
            top = sorted(v["by_class"].items(), key=lambda kv: -kv[1])[:5]
            print(
                f"{row['subject']} | {row['latent']} | {label} | {v['seconds']:.3f} | {base / v['seconds']:.2f}x | "
                f"{v['peak_bytes'] / 2**30:.2f} | {v['max_abs_diff']:.2e} | "
                + ", ".join(f"{k} {t:.3f}" for k, t in top)
            )


# --- host ----------------------------------------------------------------------------------


def host(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="profile_decode.py host",
        description="the host's cost of a tiny Wan 2.1 decode on CPU ranks, under torchrun",
    )
    ap.add_argument("--frames", type=int, default=8, help="latent frames per decode (default 8)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--frames-per-step", type=int, default=1, help="vaeshard's frames_per_step")
    ap.add_argument("--max-layer-frames", type=int, default=None, help="vaeshard's max_layer_frames")
    args = ap.parse_args(argv)
    from diffusers import AutoencoderKLWan

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2).eval()
    fast = vaeshard.FastOptions(frames_per_step=args.frames_per_step, max_layer_frames=args.max_layer_frames)
    vaeshard.parallelize(vae, mode="spatial_shard_width" if world > 1 else "auto", fast=fast)
    z = torch.randn(1, 16, args.frames, 2, 2 * world)
    times = []
    with torch.no_grad():
        vae.decode(z)  # warm-up
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            vae.decode(z)
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(
            f"{world} rank(s), frames_per_step {args.frames_per_step}, max_layer_frames {args.max_layer_frames}: "
            f"{min(times) / args.frames * 1000:.1f} ms per latent frame (fastest of {args.reps})"
        )
    dist.destroy_process_group()


COMMANDS = {"wan": wan, "video": video, "host": host}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return wan(argv)


if __name__ == "__main__":
    main()
