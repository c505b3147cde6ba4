#!/usr/bin/env python3
"""A/B interleaved in the same processes: buffers sharded by height filled frame by frame (A:
shard.copy_frames as in the library) vs one strided copy (B: copy_frames patched to dst.copy_(src)).
Prints medians, peak memory per value and the outputs' difference."""
import argparse, os, statistics, time
import torch
import torch.distributed as dist
import vaeshard
from vaeshard import shard
from vaeshard.bench import PRESETS
from vaeshard.io import NAMED_CONFIGS

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="wan21-720p")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--mode", default="auto")
args = ap.parse_args()
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
real = shard.copy_frames
taken = []
def counting(dst, src, dim):
    taken.append(tuple(dst.shape))
    return real(dst, src, dim)
vaeshard.parallelize(vae, mode=args.mode)
outs, peaks = {}, {}
def decode(v, keep=False):
    shard.copy_frames = counting if v == "frames" else (lambda d, s, dim: d.copy_(s))
    if world > 1: dist.barrier()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    t = time.perf_counter()
    with torch.no_grad():
        out = vae.decode(z).sample
    torch.cuda.synchronize()
    took = torch.tensor([time.perf_counter() - t], device=device)
    peaks[v] = (torch.cuda.max_memory_allocated() - base) / 2**30
    if world > 1: dist.all_reduce(took, op=dist.ReduceOp.MAX)
    if keep: outs[v] = out
    return took.item()
vals = ["frames", "strided"]
for v in vals: decode(v, keep=True)
d = (outs["frames"].float() - outs["strided"].float()).abs()
msg = f"frames vs strided: max {d.max().item():.3e} mean {d.mean().item():.3e} equal {(d == 0).float().mean().item():.5f}"
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v))
if rank == 0:
    print(f"{args.preset}, {world} GPU(s), mode {args.mode}: buffers filled frame by frame, interleaved, {args.rounds} rounds")
    print("  " + msg)
    print(f"  copy_frames calls in the frames decodes: {len(taken)}, shapes {sorted(set(taken))[:6]}")
    for v, ts in times.items():
        print(f"  {v:7} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})  peak {peaks[v]:.2f} GiB (rank 0)")
if world > 1: dist.destroy_process_group()
