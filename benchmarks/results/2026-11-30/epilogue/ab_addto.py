#!/usr/bin/env python3
"""A/B, interleaved in one process: conv2's residual added in the Triton kernel's epilogue (A) vs a
separate bias+residual pass after it (B: conv_kernel.takes_add_to patched to refuse)."""
import argparse, os, statistics, time
import torch
import vaeshard
from vaeshard import conv_kernel
from vaeshard.bench import PRESETS
from vaeshard.io import NAMED_CONFIGS

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="wan21-720p")
ap.add_argument("--rounds", type=int, default=4)
args = ap.parse_args()
device = torch.device("cuda", 0)
from diffusers import AutoencoderKLWan
config, shape, _ = PRESETS[args.preset]
torch.manual_seed(0)
vae = AutoencoderKLWan(**NAMED_CONFIGS[config][1]).eval().to(device, torch.bfloat16)
z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
real = conv_kernel.takes_add_to
vaeshard.parallelize(vae)
outs = {}
def decode(v):
    conv_kernel.takes_add_to = real if v == "epilogue" else (lambda *a: False)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        out = vae.decode(z).sample
    torch.cuda.synchronize()
    outs[v] = out
    return time.perf_counter() - t
vals = ["epilogue", "separate"]
for v in vals: decode(v)
d = (outs["epilogue"].float() - outs["separate"].float()).abs()
print(f"epilogue vs separate pass: max {d.max().item():.3e} mean {d.mean().item():.3e}")
outs.clear()
times = {v: [] for v in vals}
for _ in range(args.rounds):
    for v in vals:
        times[v].append(decode(v)); outs.clear()
print(f"{args.preset}, 1 GPU: residual add interleaved, {args.rounds} rounds")
for v, ts in times.items():
    print(f"  {v:9} median {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})")
