#!/usr/bin/env python3
"""A/B interleaved in the same processes: the upsamplers' convolution by the Triton kernel reading
the source frames (A: conv_kernel.upsample_plan as in the library) vs the frames upsampled into the
convolution's buffer then cuDNN (B: upsample_plan patched to None). Prints medians, peak memory per
value, the outputs' difference, and the kernel's calls (shapes, tiles, halo, copies of the source)."""
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
real_plan, real_conv, real_takes = conv_kernel.upsample_plan, conv_kernel.upsample_conv2d, conv_kernel.takes_source
seen, copied = {}, []
def conv(src, sub, weight, bias, how, top=0, left=0, gemm=None):
    key = (tuple(src.shape), sub, top, left, how.block_m)
    seen[key] = seen.get(key, 0) + 1
    return real_conv(src, sub, weight, bias, how, top, left, gemm)
def takes(src):
    ok = real_takes(src)
    if not ok: copied.append((tuple(src.shape), src.stride()))
    return ok
conv_kernel.upsample_conv2d, conv_kernel.takes_source = conv, takes
vaeshard.parallelize(vae, mode=args.mode)
outs, peaks = {}, {}
def decode(v, keep=False):
    conv_kernel.upsample_plan = real_plan if v == "kernel" else (lambda *a, **k: None)
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
vals = ["kernel", "copy"]
for v in vals: decode(v, keep=True)
d = (outs["kernel"].float() - outs["copy"].float()).abs()
msg = f"kernel vs copy: max {d.max().item():.3e} mean {d.mean().item():.3e} equal {(d == 0).float().mean().item():.5f}"
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v))
if rank == 0:
    print(f"{args.preset}, {world} GPU(s), mode {args.mode}: upsamplers' convolution, interleaved, {args.rounds} rounds")
    print("  " + msg)
    print(f"  kernel calls over all decodes (src shape, sub, top, left, block_m: calls): {seen}")
    print(f"  sources copied to channels-last first: {len(copied)} {copied[:3]}")
    for v, ts in times.items():
        print(f"  {v:7} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})  peak {peaks[v]:.2f} GiB (rank 0)")
if world > 1: dist.destroy_process_group()
