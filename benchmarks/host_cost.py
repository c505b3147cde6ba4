#!/usr/bin/env python3
"""Host cost of a decode: Wan 2.1's layer structure at 8 base channels, a tiny latent, CPU ranks.

    torchrun --standalone --nproc_per_node=1 benchmarks/host_cost.py
    torchrun --standalone --nproc_per_node=2 benchmarks/host_cost.py   # sharded along the width (gloo)

The layers, and so the Python and dispatch work per latent frame, are those of the real Wan 2.1
decoder (dim_mult 1, 2, 4, 4, two residual blocks per stage); the arithmetic is tiny, so the time per
latent frame is mostly host work. On gloo, sends and receives are synchronous TCP and add their own
cost; the 1-rank figure is the one that compares with the GPU's kernel time per latent frame.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import vaeshard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=8, help="latent frames per decode (default 8)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--frames-per-step", type=int, default=1, help="vaeshard's frames_per_step")
    ap.add_argument("--max-layer-frames", type=int, default=None, help="vaeshard's max_layer_frames")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
