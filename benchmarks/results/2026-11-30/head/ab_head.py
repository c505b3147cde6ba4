#!/usr/bin/env python3
"""A/B interleaved in the same processes: the decoder's 96 -> 3 output convolution on the Triton kernel
(A: conv_kernel.plan as in the library, 16 padded channels) vs cuDNN (B: plan patched to None for fewer
than 8 output channels). Prints medians, peak memory per value and the outputs' difference."""
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
real = conv_kernel.plan
def cudnn_head(x, weight, *a):
    return None if weight.shape[0] < 8 else real(x, weight, *a)
taken = []
def counting(x, weight, *a):
    how = real(x, weight, *a)
    if weight.shape[0] < 8: taken.append(how)
    return how
vaeshard.parallelize(vae, mode=args.mode)
outs, peaks = {}, {}
def decode(v, keep=False):
    conv_kernel.plan = counting if v == "kernel" else cudnn_head
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
vals = ["kernel", "cudnn"]
for v in vals: decode(v, keep=True)
d = (outs["kernel"].float() - outs["cudnn"].float()).abs()
msg = f"kernel vs cudnn: max {d.max().item():.3e} mean {d.mean().item():.3e} equal {(d == 0).float().mean().item():.5f}"
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v))
if rank == 0:
    print(f"{args.preset}, {world} GPU(s), mode {args.mode}: the decoder's output convolution, interleaved, {args.rounds} rounds")
    print("  " + msg)
    print(f"  the head's plans in the kernel decodes: {len(taken)} calls, {sorted(set(map(str, taken)))[:2]}")
    for v, ts in times.items():
        print(f"  {v:7} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})  peak {peaks[v]:.2f} GiB (rank 0)")
if world > 1: dist.destroy_process_group()
