#!/usr/bin/env python3
"""A/B interleaved in the same processes: the residual blocks' norm2 (+ SiLU) computed in conv1's
Triton epilogue (A) vs conv1 then the norm kernel (B: conv_kernel.norms_in_epilogue patched False).
Prints medians, peak memory per value, and the outputs' difference."""
import argparse, os, statistics, time
import torch
import torch.distributed as dist
import vaeshard
from vaeshard import conv_kernel
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
real = conv_kernel.norms_in_epilogue
vaeshard.parallelize(vae, mode=args.mode)
outs, peaks = {}, {}
def decode(v, keep=False):
    conv_kernel.norms_in_epilogue = real if v == "epilogue" else (lambda how: False)
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
vals = ["epilogue", "pass"]
for v in vals: decode(v, keep=True)
d = (outs["epilogue"].float() - outs["pass"].float()).abs()
msg = f"epilogue vs pass: max {d.max().item():.3e} mean {d.mean().item():.3e} equal {(d == 0).float().mean().item():.5f}"
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v))
if rank == 0:
    print(f"{args.preset}, {world} GPU(s), mode {args.mode}: norm2 in conv1's epilogue, interleaved, {args.rounds} rounds")
    print("  " + msg)
    for v, ts in times.items():
        print(f"  {v:9} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})  peak {peaks[v]:.2f} GiB (rank 0)")
if world > 1: dist.destroy_process_group()
