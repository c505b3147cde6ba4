#!/usr/bin/env python3
"""Where the time of diffusers' untiled decode of a video VAE goes, and what channels-last changes.

    python3 benchmarks/video_profile.py --subject AutoencoderKLHunyuanVideo15=1,32,9,45,80 [--subject ...] \
        [--reps 2] [--json OUT.json]

For each subject (a diffusers class with its default config, random weights, bf16 by default, and a latent shape),
interleaved in one process: diffusers' untiled decode as it is (channels-first), and the same decode
with the model and the latent in `torch.channels_last_3d` (cuDNN's NDHWC kernels; pads and norms keep
whatever layout they produce). Each variant is timed `--reps` times after a warm-up (medians), then
profiled once: GPU time by kernel class (benchmarks/profile_decode.py's classes). The last lines are
a table of both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_decode import classify


def _decode(vae, z):
    with torch.no_grad():
        return vae.decode(z, return_dict=False)[0]


def _layout(vae, fmt) -> None:
    """Every 5-D weight of `vae` in memory format `fmt` (in place)."""
    for p in vae.parameters():
        if p.ndim == 5:
            p.data = p.data.contiguous(memory_format=fmt)


def _timed(vae, z, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    _decode(vae, z)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _by_class(vae, z, device) -> dict[str, float]:
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        _decode(vae, z)
        if device.type == "cuda":
            torch.cuda.synchronize()
    out = defaultdict(float)
    for evt in prof.key_averages():
        t = evt.device_time_total if device.type == "cuda" else evt.self_cpu_time_total
        if t:
            out[classify(evt.key)] += t / 1e6
    return dict(out)


def run_subject(spec: str, reps: int, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    import diffusers

    name, shape_text = spec.split("=")
    shape = tuple(int(v) for v in shape_text.split(","))
    torch.manual_seed(0)
    vae = getattr(diffusers, name)().eval().to(device, dtype)
    for attr in ("use_tiling", "use_slicing", "use_framewise_decoding", "use_framewise_encoding"):
        if hasattr(vae, attr):
            setattr(vae, attr, False)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    row = {"subject": name, "latent": list(shape), "variants": {}}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        _decode(vae, z)  # warm-up; an out-of-memory here is recorded as the subject's result
    except torch.OutOfMemoryError as exc:
        row["error"] = f"diffusers' untiled decode ran out of memory: {str(exc).splitlines()[0]}"
        return row
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    layouts = {
        "channels-first": (torch.contiguous_format, z),
        "channels-last": (torch.channels_last_3d, z.contiguous(memory_format=torch.channels_last_3d)),
    }
    _layout(vae, torch.channels_last_3d)
    _decode(vae, layouts["channels-last"][1])  # its own warm-up (cuDNN picks NDHWC algorithms)
    times = defaultdict(list)
    for _ in range(reps):  # A B A B, the same module converted in place between them
        for label, (fmt, zz) in layouts.items():
            _layout(vae, fmt)
            times[label].append(_timed(vae, zz, device))
            print(f"  {name} {label}: {times[label][-1]:.3f} s", file=sys.stderr, flush=True)
    for label, (fmt, zz) in layouts.items():
        _layout(vae, fmt)
        row["variants"][label] = {
            "seconds": statistics.median(times[label]),
            "all": times[label],
            "by_class": _by_class(vae, zz, device),
        }
    row["diffusers_peak_bytes"] = peak
    del vae, z
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subject", action="append", required=True, help="Class=B,C,T,H,W")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    args = ap.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    rows = []
    for spec in args.subject:
        row = run_subject(spec, args.reps, device, getattr(torch, args.dtype))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    print("subject | latent | channels-first s | channels-last s | ratio | top classes (channels-first, s)")
    for row in rows:
        if "error" in row:
            print(f"{row['subject']} | {row['latent']} | {row['error']}")
            continue
        a, b = row["variants"]["channels-first"], row["variants"]["channels-last"]
        top = sorted(a["by_class"].items(), key=lambda kv: -kv[1])[:4]
        print(
            f"{row['subject']} | {row['latent']} | {a['seconds']:.3f} | {b['seconds']:.3f} | "
            f"{a['seconds'] / b['seconds']:.2f}x | " + ", ".join(f"{k} {v:.3f}" for k, v in top)
        )


if __name__ == "__main__":
    main()
