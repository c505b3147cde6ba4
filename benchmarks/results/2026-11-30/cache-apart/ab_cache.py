#!/usr/bin/env python3
"""A/B interleaved in the same processes: the causal cache read in place by the Triton kernel (A) vs
copied in front of the new frames (B: conv_kernel.takes_cache patched to refuse). 1 or N ranks."""
import argparse, os, statistics, time
import torch, torch.distributed as dist
import vaeshard
from vaeshard import conv_kernel
from vaeshard.bench import PRESETS
from vaeshard.io import NAMED_CONFIGS
ap = argparse.ArgumentParser(); ap.add_argument("--preset", default="wan21-720p"); ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--mode", default="auto")
args = ap.parse_args()
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))); torch.cuda.set_device(device)
if world > 1: dist.init_process_group("nccl", device_id=device)
from diffusers import AutoencoderKLWan
config, shape, _ = PRESETS[args.preset]
torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
real = conv_kernel.takes_cache
vaeshard.parallelize(vae, mode=args.mode)
outs = {}
def decode(v):
    conv_kernel.takes_cache = real if v == "apart" else (lambda *a: False)
    torch.cuda.reset_peak_memory_stats(device)
    if world > 1: dist.barrier()
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad(): out = vae.decode(z).sample
    torch.cuda.synchronize()
    took = torch.tensor([time.perf_counter() - t], device=device)
    if world > 1: dist.all_reduce(took, op=dist.ReduceOp.MAX)
    outs[v] = (out, torch.cuda.max_memory_allocated(device) / 2**30)
    return took.item()
vals = ["apart", "copied"]
for v in vals: decode(v)
same = torch.equal(outs["apart"][0], outs["copied"][0])
peaks = {v: outs[v][1] for v in vals}
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v)); outs.clear()
if rank == 0:
    print(f"{args.preset}, {world} GPU(s), mode {args.mode}: causal cache read apart vs copied, interleaved, {args.rounds} rounds; identical outputs: {same}")
    for v, ts in times.items():
        print(f"  {v:7} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})  peak (whole decode, incl. output) {peaks[v]:.2f} GiB")
if world > 1: dist.destroy_process_group()
