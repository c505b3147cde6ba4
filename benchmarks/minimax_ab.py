#!/usr/bin/env python3
"""MiniMax-H3 on one device, in one process: diffusers' decode as configured (its tiling is on by
default: the released, tiled decode) against vaeshard's variants, timed A B A B.

    python3 benchmarks/minimax_ab.py --shape 1,24,22,45,80 [--reps 2] [--variants V,...] [--profile]
        [--json OUT.json] [--small]

Variants (`--variants`, comma-separated, `diffusers` first):
- `diffusers`: diffusers' own decode (tiles one at a time);
- `vaeshard`: vaeshard's default tier (`auto`: the tiles batched, the ViT blocks' passes fused);
- `vaeshard-b16`, `vaeshard-b14`, `vaeshard-b12`: the same with batches of at most 2**16 / 2**14 / 2**12
  tokens (`tuning.MINIMAX_BATCH_TOKENS`);
- `vaeshard-unfused`: batched tiles through diffusers' own blocks;
- `vaeshard-tile`: mode `tile`, the exact tier (bit for bit with diffusers').

The model is the real config (`--config`, random weights, seeded) in `--dtype` as diffusers'
from_pretrained(torch_dtype=...) loads it (`vaeshard.cast_as_loaded`: MiniMax-H3 keeps its
norms and residual scales in float32). Each variant: a first decode (compiles included), a decode
for its peak memory above what was allocated before it and its difference to diffusers' output,
then `--reps` timed decodes interleaved with the other variants' (median). `--profile`: CUDA time by
kind and the top kernels of one decode of `diffusers` and `vaeshard`. The last lines are a table.
`--small`: the tiny test config at a tiny latent on the CPU (a check of the script).
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

import vaeshard
from vaeshard import tuning
from vaeshard.families import minimax_h3, named_configs, tiny_configs
from vaeshard.fast.token_blocks import run_blocks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_decode import classify

VARIANTS = (
    "diffusers",
    "vaeshard",
    "vaeshard-b16",
    "vaeshard-b14",
    "vaeshard-b12",
    "vaeshard-unfused",
    "vaeshard-tile",
)
BATCH_TOKENS = tuning.MINIMAX_BATCH_TOKENS


def _enter(vae, label: str) -> None:
    """Set `vae` (in place) and the family's batch knobs for a variant."""
    minimax_h3.run_blocks, tuning.MINIMAX_BATCH_TOKENS = run_blocks, BATCH_TOKENS
    if label == "diffusers":
        vaeshard.unparallelize(vae)
    elif label == "vaeshard-tile":
        vaeshard.parallelize(vae, mode="tile", exact=True)
    else:
        vaeshard.parallelize(vae)
        if label == "vaeshard-b16":
            tuning.MINIMAX_BATCH_TOKENS = 2**16
        elif label == "vaeshard-b14":
            tuning.MINIMAX_BATCH_TOKENS = 2**14
        elif label == "vaeshard-b12":
            tuning.MINIMAX_BATCH_TOKENS = 2**12
        elif label == "vaeshard-unfused":
            minimax_h3.run_blocks = None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="minimax_ab.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="minimax_h3", help="a named config of AutoencoderKLMiniMaxH3")
    ap.add_argument("--shape", default="1,24,22,45,80", help="the latent, B,C,T,H,W (default: 720p, 81 frames)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default="diffusers,vaeshard,vaeshard-tile")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--small", action="store_true", help="the tiny test config on the CPU, latent 1,4,5,11,9")
    a = ap.parse_args(argv)
    labels = a.variants.split(",")
    if labels[0] != "diffusers" or not set(labels) <= set(VARIANTS):
        ap.error(f"--variants: diffusers first, then any of {', '.join(VARIANTS[1:])}")
    import diffusers

    dev = torch.device("cuda" if torch.cuda.is_available() and not a.small else "cpu")
    cuda = dev.type == "cuda"
    dtype = getattr(torch, a.dtype) if not a.small else torch.float32
    cls, kwargs = (tiny_configs() if a.small else named_configs())["minimax_h3" if a.small else a.config]
    shape = (1, 4, 5, 11, 9) if a.small else tuple(int(v) for v in a.shape.split(","))
    torch.manual_seed(0)
    vae = vaeshard.cast_as_loaded(getattr(diffusers, cls)(**kwargs).eval(), dtype).to(dev)
    if a.small:
        vae.enable_tiling(64, 64, 16, 16)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dev, dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def decode():
        with torch.no_grad():
            return vae.decode(z, return_dict=False)[0]

    def timed() -> float:
        sync()
        t0 = time.perf_counter()
        decode()
        sync()
        return time.perf_counter() - t0

    row = {"config": a.config, "latent": list(shape), "dtype": str(dtype), "device": str(dev), "variants": {}}
    if cuda:
        row["gpu"] = torch.cuda.get_device_name(dev)
    ref = None
    for label in labels:
        _enter(vae, label)
        first = timed()
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        out = decode()
        peak = torch.cuda.max_memory_allocated(dev) - base if cuda else 0
        out = out.float().cpu()
        ref = out if ref is None else ref
        d = (out - ref).abs()
        row["variants"][label] = {
            "first_s": first,
            "peak_bytes": peak,
            "max_abs_diff": d.max().item(),
            "mean_abs_diff": d.mean().item(),
            "bit_identical": bool(torch.equal(out, ref)),
        }
        print(label, row["variants"][label], flush=True)
    times = defaultdict(list)
    for _ in range(a.reps):  # A B A B
        for label in labels:
            _enter(vae, label)
            times[label].append(timed())
            print(f"  {label} {times[label][-1]:.3f} s", flush=True)
    for label in labels:
        row["variants"][label]["seconds"] = statistics.median(times[label])
        row["variants"][label]["all"] = times[label]
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for label in [v for v in ("diffusers", "vaeshard") if v in labels]:
            _enter(vae, label)
            activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
            with profile(activities=activities) as prof:
                decode()
                sync()
            by = defaultdict(float)
            events = prof.key_averages()
            for e in events:
                t = e.device_time_total if cuda else e.self_cpu_time_total
                if t:
                    by[classify(e.key)] += t / 1e6
            own = [(e.self_device_time_total if cuda else e.self_cpu_time_total, e.key, e.count) for e in events]
            top = sorted(((t / 1e6, k, c) for t, k, c in own if t), reverse=True)[:15]
            row["variants"][label]["by_class"] = dict(by)
            row["variants"][label]["top_kernels"] = top
            print(label, "by class", {k: round(v, 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1])})
            for t, k, c in top:
                print(f"   {t:.3f} s  x{c}  {k[:100]}")
    minimax_h3.run_blocks, tuning.MINIMAX_BATCH_TOKENS = run_blocks, BATCH_TOKENS
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)
    base = row["variants"]["diffusers"]["seconds"]
    print("variant | s | vs diffusers | peak GiB | max|diff| | bit-identical")
    for label, v in row["variants"].items():
        print(
            f"{a.config} {shape} {label} | {v['seconds']:.3f} | {base / v['seconds']:.2f}x | "
            f"{v['peak_bytes'] / 2**30:.2f} | {v['max_abs_diff']:.2e} | {v['bit_identical']}"
        )


if __name__ == "__main__":
    main()
