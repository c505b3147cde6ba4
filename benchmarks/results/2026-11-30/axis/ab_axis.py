#!/usr/bin/env python3
"""Sharding axis A/B interleaved in the same processes: spatial_shard_height vs spatial_shard_width
(and what `auto` picks), one warm-up decode each, then --rounds rounds; slowest rank's wall time."""
import argparse, os, statistics, time
import torch
import torch.distributed as dist
import vaeshard
from vaeshard.bench import PRESETS
from vaeshard.io import NAMED_CONFIGS

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="wan21-720p")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
from diffusers import AutoencoderKLWan
config, shape, _ = PRESETS[args.preset]
torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
modes = ["spatial_shard_height", "spatial_shard_width"]
def decode(mode):
    vaeshard.parallelize(vae, mode=mode)
    dist.barrier(); torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        vae.decode(z)
    torch.cuda.synchronize()
    took = torch.tensor([time.perf_counter() - t], device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item()
for m in modes: decode(m)
times = {m: [] for m in modes}
for _ in range(args.rounds):
    for m in modes:
        times[m].append(decode(m))
if rank == 0:
    print(f"{args.preset}, {world} GPUs: axis interleaved, {args.rounds} rounds; auto picks {vaeshard.plan(vae, shape, world).strategy}")
    for m, ts in times.items():
        print(f"  {m:21} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})")
dist.destroy_process_group()
