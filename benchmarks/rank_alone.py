#!/usr/bin/env python3
"""One rank's share of a sharded decode, timed on one GPU with its communication stood in.

    python3 benchmarks/rank_alone.py --preset wan21-720p --ranks 1,2 --reps 3

For a machine with fewer GPUs than the decode is meant for: this process runs, on its one GPU,
what rank 0 of N runs (rank 1 where N > 2: it has two neighbours) in vaeshard's default fast tier,
sharded along the axis `auto` picks, with `memory_model.StandInComm` in place of the communication.
The stand-in allocates what the exchanges and the final gather allocate (send copies, receive
buffers, gathered keys and values, the assembled output) and sends nothing, so the halo rows hold
whatever their buffers held: the output is not the decode's, the work is. Prints, per rank count
(and `--cuda-graphs` and `--parts` value), the median wall time of `--reps` decodes after a warm-up
one (each between device synchronisations), when the host had issued the decode (its call returned)
and how long its thread ran until then (`time.thread_time`: without the time a busy machine kept it
waiting; where the GPU is idle most of the time, a small `--latent`, the host's own cost), the peak
allocated memory over a decode (`max_memory_allocated` minus what the weights and the latent hold:
tensors that kept CUDA graphs hold between decodes count), and what stays allocated and reserved
after the decodes. `--cuda-graphs keep` (or `keep-on`) times `keep_cuda_graphs=True` with
cuda_graphs "auto" (True): the warm-up and the first timed decode capture, the later ones replay;
the kept graphs are released after each row. `--kernel-profile` adds a profiled decode: GPU kernel
time by class, the kernels whose time fell least against the first row, and when the GPU waited.

What this is: a rank's own GPU and host work, without the exchanges' transfers and without waiting
for its neighbours: a lower bound for an N-GPU decode's time, not a measurement of one; the N-GPU
decode adds the NCCL kernels and the waits (BENCHMARKS.md, Protocol, "Rank share"). The peak is a
rank's, without NCCL's own buffers.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from memory_model import decode_as_rank, fast_plan, steps_setting

import vaeshard
from vaeshard import tuning
from vaeshard.cli.bench import PRESETS
from vaeshard.cli.io import NAMED_CONFIGS
from vaeshard.layers import tier
from vaeshard.runtime import spatial as shard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="wan21-720p", choices=sorted(PRESETS))
    ap.add_argument("--ranks", default="1,2", help="rank counts whose rank share to time (default 1,2)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--cuda-graphs",
        default="auto",
        help="cuda_graphs values to time, e.g. auto,on (default auto); keep, keep-on: auto, on with keep_cuda_graphs",
    )
    ap.add_argument(
        "--latent",
        default=None,
        help="the latent's shape, e.g. 1,16,21,8,16 (default: the preset's); a small one with "
        "--cuda-graphs off --parts off leaves the GPU idle most of the time, so the decode's "
        "time is the host's cost of issuing it",
    )
    ap.add_argument(
        "--host-profile",
        action="store_true",
        help="also: one decode of each share under cProfile, the functions with the most host time",
    )
    ap.add_argument(
        "--kernel-profile",
        action="store_true",
        help="also: one decode of each share under torch.profiler, its GPU kernel time by class and the "
        "kernels whose time fell least against the first row's (where the share does not scale)",
    )
    ap.add_argument(
        "--top",
        type=int,
        default=25,
        help="functions or kernels listed by --host-profile and --kernel-profile (default 25)",
    )
    ap.add_argument(
        "--parts-from-pixels",
        default=None,
        help="tuning.PARTS_FROM_PIXELS and SHARDED_PARTS_FROM_PIXELS, one value or several to time "
        "interleaved, e.g. 393216,131072 (default: the library's); 1 times the parts' host cost "
        "at a small --latent",
    )
    ap.add_argument(
        "--parts",
        default="on",
        help="the default parts of two frames (tuning.PART_FRAMES): on, off or on,off (default on)",
    )
    ap.add_argument(
        "--frames-per-step",
        default="auto",
        help="frames_per_step values to time, one or several interleaved, e.g. auto,1,2 (default auto)",
    )
    ap.add_argument(
        "--debug-log",
        action="store_true",
        help="also: vaeshard's debug log (e.g. each CUDA graph capture and its host time)",
    )
    args = ap.parse_args()
    if args.debug_log:
        import logging

        logging.basicConfig(format="    log: %(message)s")
        logging.getLogger("vaeshard").setLevel(logging.DEBUG)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from diffusers import AutoencoderKLWan

    device = torch.device("cuda", 0)
    config, shape, _ = PRESETS[args.preset]
    if args.latent:
        shape = tuple(int(n) for n in args.latent.split(","))
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
    vaeshard.parallelize(vae)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    print(
        f"{args.preset} latent {tuple(shape)}, one GPU: each rank count's rank share, communication stood in "
        f"(a lower bound for that many GPUs, not a measurement of it)"
    )
    default_parts, thresholds = tuning.PART_FRAMES, (tuning.PARTS_FROM_PIXELS, tuning.SHARDED_PARTS_FROM_PIXELS)
    try:
        _time_shares(args, vae, z, shape, device, default_parts)
    finally:
        tuning.PART_FRAMES, (tuning.PARTS_FROM_PIXELS, tuning.SHARDED_PARTS_FROM_PIXELS) = default_parts, thresholds


def _time_shares(args, vae, z, shape, device, default_parts) -> None:
    graphs_values = {"auto": "auto", "on": True, "off": False, "keep": "auto", "keep-on": True}
    baseline = torch.cuda.memory_allocated(device)  # the weights and the latent
    first = None
    first_kernels: dict[str, float] | None = None
    first_ranks = None
    for ranks in (int(r) for r in args.ranks.split(",")):
        strategy = vaeshard.plan(vae, shape, ranks).strategy
        axis = shard.HEIGHT if strategy == "spatial_shard_height" else shard.WIDTH
        steps_values = [steps_setting(k) for k in args.frames_per_step.split(",")]
        for graphs, steps, (parts, threshold) in itertools.product(
            args.cuda_graphs.split(","), steps_values, _part_settings(args)
        ):
            tuning.PART_FRAMES = default_parts if parts == "on" else None
            if threshold is not None:
                tuning.PARTS_FROM_PIXELS = tuning.SHARDED_PARTS_FROM_PIXELS = threshold
            # the row's fast-tier choices, resolved from the thresholds just set, as a request's are
            plan = fast_plan(
                vae,
                shape,
                ranks,
                axis,
                device,
                cuda_graphs=graphs_values[graphs],
                frames_per_step=steps,
                keep_cuda_graphs=graphs.startswith("keep"),
            )

            def decode(plan=plan, ranks=ranks, axis=axis):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                held = baseline  # (kept graphs' tensors count in the peak: they are this decode's)
                start, cpu = time.perf_counter(), time.thread_time()
                with torch.no_grad(), tier.active(plan):
                    out = decode_as_rank(vae, z, ranks, axis)
                issued, cpu = time.perf_counter() - start, time.thread_time() - cpu
                torch.cuda.synchronize()
                took = time.perf_counter() - start
                del out
                return took, issued, (torch.cuda.max_memory_allocated(device) - held) / 2**30, cpu

            decode()  # warm-up: cuDNN's timing, kernel compiles
            runs = [decode() for _ in range(args.reps)]
            median = statistics.median(t for t, _, _, _ in runs)
            host = statistics.median(h for _, h, _, _ in runs)
            cpu = statistics.median(c for _, _, _, c in runs)
            peak = max(p for _, _, p, _ in runs)
            first = first or median
            where = "" if ranks == 1 else f", by {axis}, rank {0 if ranks == 2 else 1}"
            where += "" if threshold is None else f", parts from {threshold} pixels"
            where += "" if steps == "auto" else f", frames_per_step {steps}"
            kept = (torch.cuda.memory_allocated(device) - baseline) / 2**30
            reserved = torch.cuda.memory_reserved(device) / 2**30
            print(
                f"  {ranks} rank(s){where}, cuda_graphs {graphs}, default parts {parts}: median {median:.3f} s "
                f"({', '.join(f'{t:.3f}' for t, _, _, _ in runs)}), host returned at {host:.3f} s "
                f"(its thread ran {cpu:.3f} s), peak "
                f"{peak:.2f} GiB ({peak * 2**30 / 1e9:.2f} GB; the last decode's {runs[-1][2]:.2f} GiB); "
                f"first row / this {first / median:.2f}x; "
                f"held after the decodes {kept:.2f} GiB allocated, {reserved:.2f} GiB reserved in all",
                flush=True,
            )
            if args.host_profile:
                _host_profile(decode, args.top)
            if args.kernel_profile:
                first_ranks = first_ranks or ranks
                kernels = _kernel_profile(decode, first_kernels, ranks / first_ranks, args.top)
                first_kernels = first_kernels or kernels
            if vaeshard.release(vae):  # (after the profiles: with kept graphs they replay)
                print(
                    f"    after vaeshard.release: {torch.cuda.memory_reserved(device) / 2**30:.2f} GiB reserved in all",
                    flush=True,
                )


def _part_settings(args):
    """(--parts value, --parts-from-pixels value or None) pairs in the order they are timed."""
    thresholds = [None] if args.parts_from_pixels is None else [int(v) for v in args.parts_from_pixels.split(",")]
    return [(parts, threshold) for parts in args.parts.split(",") for threshold in thresholds]


def _host_profile(decode, top: int) -> None:
    """One more decode under cProfile: the host's own time by function (a device synchronisation
    shows as time in the function that waited)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    decode()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        print(f"    host time by function, by {order} (cProfile):\n" + text.getvalue().split("\n\n", 1)[-1], flush=True)


def _kernel_profile(decode, first: dict[str, float] | None, scale: float, top: int) -> dict[str, float]:
    """One more decode under torch.profiler: GPU kernel seconds by class and by kernel; against the
    first profiled row, whose share is `scale` times this one's, the kernels with the most time
    above their first-row time / `scale` (what did not scale with the rank count)."""
    from profile_decode import _busy_seconds, classify
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        took = decode()[0]
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.key] = kernels.get(evt.key, 0.0) + evt.device_time_total / 1e6
    total = sum(kernels.values())
    print(
        f"    profiled decode {took:.3f} s: GPU kernel time {total:.3f} s, busy {_busy_seconds(prof):.3f} s", flush=True
    )
    _idle_report(prof)
    classes: dict[str, list[float]] = {}
    for index, profiled in enumerate((kernels, first or {})):
        for name, t in profiled.items():
            classes.setdefault(classify(name), [0.0, 0.0])[index] += t
    for label, (t, base) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
        versus = f"  (first row {base:.3f} s, {base / t:.2f}x)" if first and t else ""
        print(f"    {label:22} {t:7.3f} s{versus}", flush=True)
    if first:
        rows = sorted(set(kernels) | set(first), key=lambda k: -(kernels.get(k, 0.0) - first.get(k, 0.0) / scale))
        print(f"    kernels by their time above the first row's / {scale:g}:", flush=True)
        for name in rows[:top]:
            print(
                f"    {kernels.get(name, 0.0):7.4f} s (first row {first.get(name, 0.0):7.4f} s)  {name[:100]}",
                flush=True,
            )
    else:
        for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {t:7.4f} s  {name[:110]}", flush=True)
    return kernels


def _idle_report(prof, parts: int = 10, largest: int = 8) -> None:
    """When the GPU waited inside the profiled decode: its idle time (gaps between kernels of at least
    20 us) in each tenth of the kernels' span, and the largest gaps with their offsets from the first
    kernel (a capture, a host-paced stretch, a synchronisation)."""
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return
    origin, end, gaps = spans[0][0], spans[0][1], []
    for start, stop in spans[1:]:
        if start - end >= 20:
            gaps.append((end - origin, start - end))
        end = max(end, stop)
    width = (end - origin) / parts
    tenths = [0.0] * parts
    for at, length in gaps:
        tenths[min(int(at // width), parts - 1)] += length / 1e3
    print(
        f"    GPU idle {sum(g for _, g in gaps) / 1e6:.3f} s in {len(gaps)} gaps; ms per tenth of the "
        f"{(end - origin) / 1e6:.3f} s span: {' '.join(f'{t:.1f}' for t in tenths)}",
        flush=True,
    )
    print(
        "    largest gaps (ms at offset ms): "
        + ", ".join(f"{g / 1e3:.1f} at {at / 1e3:.0f}" for at, g in sorted(gaps, key=lambda ag: -ag[1])[:largest]),
        flush=True,
    )


if __name__ == "__main__":
    main()
