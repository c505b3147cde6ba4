#!/usr/bin/env python3
"""CUDA out-of-memory on one rank during a sharded decode: every rank must stop, none may hang.

    torchrun --standalone --nproc_per_node=2 benchmarks/gpu_faults.py --oom-rank 1 --group-timeout 60

Rank `--oom-rank` caps its allocator with torch.cuda.set_per_process_memory_fraction so its share
of a Wan 2.1 720p decode cannot fit; the other ranks are unconstrained. Each rank prints one JSON
line: what it raised (or that it finished), and after how many seconds. A rank stuck in a collective
is ended by NCCL's watchdog at the group timeout (TORCH_NCCL_ASYNC_ERROR_HANDLING tears the process
down), so look at torchrun's exit status and the wall time of the whole command as well. Run it
under `timeout` so a hang would show as exit 124.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import vaeshard


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--oom-rank", type=int, default=1)
    ap.add_argument("--fraction", type=float, default=0.01, help="memory fraction for the OOM rank")
    ap.add_argument("--group-timeout", type=float, default=60.0)
    ap.add_argument("--shape", default="1,16,9,90,160")
    ap.add_argument("--mode", default="spatial_shard_width")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=args.group_timeout))
    rank = dist.get_rank()
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan().eval().to(device, torch.bfloat16)
    vaeshard.parallelize(vae, mode=args.mode)
    shape = tuple(int(v) for v in args.shape.split(","))
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    vae.decode(z[:, :, :1])  # warm-up with room to spare: communicators and kernels are ready
    torch.cuda.synchronize()
    dist.barrier()
    if rank == args.oom_rank:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(args.fraction, device)
    start = time.perf_counter()
    outcome = {"rank": rank, "oom_rank": args.oom_rank, "shape": list(shape), "mode": args.mode}
    try:
        vae.decode(z)
        torch.cuda.synchronize()
        outcome.update(result="finished")
    except BaseException as exc:  # record whatever surfaced
        outcome.update(result="raised", error=type(exc).__name__, message=str(exc).splitlines()[0][:300])
    outcome["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(outcome), flush=True)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0 if outcome["result"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
