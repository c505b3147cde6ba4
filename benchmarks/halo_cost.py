#!/usr/bin/env python3
"""Cost of one halo exchange (`Comm.fill_halo`): the host's time and the wall time per exchange.

    torchrun --standalone --nproc_per_node=2 benchmarks/halo_cost.py          # NCCL on GPUs
    torchrun --standalone --nproc_per_node=2 benchmarks/halo_cost.py --cpu    # gloo

A sharded Wan decode makes about 36 exchanges per latent frame (one per spatial convolution). Each
is timed in a loop of `--iters` calls on a channels-last convolution input buffer: "host" is the time
until the loop has been issued (what the exchange costs the CPU that also launches the decode's
kernels), "wall" until the GPU has finished it too. Shapes: a Wan 2.1 720p full-resolution
convolution input on 2 ranks (96 channels, 6 frames, 720 x 642 sharded on width) and a latent-level
one (384 channels, 3 frames, 90 x 82).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from vaeshard.runtime.comm import Comm

SHAPES = {"full-res": (1, 96, 6, 720, 642), "latent-level": (1, 384, 3, 90, 82)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU ranks")
    args = ap.parse_args()
    if args.cpu:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    comm = Comm.for_group(dist.group.WORLD)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for shape_name, shape in SHAPES.items():
        buf = torch.randn(shape, device=device).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
        for _ in range(5):
            comm.fill_halo(buf, 4, 1, 1, comm.world)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            comm.fill_halo(buf, 4, 1, 1, comm.world)
        host = time.perf_counter() - t0
        sync()
        wall = time.perf_counter() - t0
        if comm.rank == 0:
            print(
                f"{shape_name:13} host {host / args.iters * 1e6:7.1f} us/exchange, "
                f"wall {wall / args.iters * 1e6:7.1f} us/exchange ({comm.world} ranks, {device.type})",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
