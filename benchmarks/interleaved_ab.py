#!/usr/bin/env python3
"""One fast-tier setting at two values, decodes interleaved in the same processes (A, B, A, B, ...).

    torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-480p \\
        --setting triton_convs --values true,false --rounds 5
    torchrun --standalone --nproc_per_node=2 benchmarks/interleaved_ab.py --preset wan21-720p \\
        --setting mode --values spatial_shard_height,spatial_shard_width --rounds 3

Separate `vaeshard bench` runs of the two values land in different processes, whose own pace can
differ by more than the setting does (Wan 2.1 480p on 2 GPUs: 0.41-0.50 s for the same code,
BENCHMARKS.md "Why 2 GPUs give 1.8x"). Here both values share the processes, the model and the
latent: `vaeshard.parallelize` switches the setting between decodes, each value gets one warm-up
decode, then `--rounds` rounds time one decode of each value (wall clock on every rank after a
device synchronisation and a barrier; the slowest rank's time). Prints each value's times and median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import vaeshard
from vaeshard.bench import PRESETS
from vaeshard.config import FAST_TIER_SETTINGS
from vaeshard.io import NAMED_CONFIGS


def _value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    return int(low) if low.lstrip("-").isdigit() else low  # e.g. cuda_graphs=auto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="wan21-480p")
    ap.add_argument("--setting", choices=(*FAST_TIER_SETTINGS, "mode"), required=True,
                    help="a fast-tier setting, or mode (then --values are two modes)")
    ap.add_argument("--values", required=True, help="two values, e.g. true,false or 1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", default="auto")
    args = ap.parse_args()
    values = [_value(v) for v in args.values.split(",")]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    from diffusers import AutoencoderKLWan

    config, shape, _ = PRESETS[args.preset]
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)

    def decode(value) -> float:
        settings = {"mode": args.mode, args.setting: value}  # (--setting mode: the value is the mode)
        vaeshard.parallelize(vae, **settings)
        if world > 1:
            dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            vae.decode(z)
        torch.cuda.synchronize()
        took = torch.tensor([time.perf_counter() - start], device=device)
        if world > 1:
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took.item()

    for value in values:  # warm-up: cuDNN's timing, kernel compiles, the allocator's growth
        decode(value)
    times = {str(v): [] for v in values}
    for _ in range(args.rounds):
        for value in values:
            times[str(value)].append(decode(value))
    if rank == 0:
        print(f"{args.preset}, {world} GPU(s), mode {args.mode}: {args.setting} interleaved, {args.rounds} rounds")
        for value, ts in times.items():
            print(f"  {args.setting}={value:6} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
