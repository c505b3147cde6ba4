"""box_conv reading the cache apart: is it the second pair of descriptors or the branch? Variants of
box_conv.py (make_variants.py) timed in one process against the library's kernel."""
import os
import sys
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(__file__))
import torch
import norm_kernel
from vaeshard import box_conv
import bv_branch, bv_interleaved, bv_order

def ms(fn):
    return norm_kernel._time(fn, loops=1, reps=30) * 1e3

for name, (h, w, pad) in {"720p 1 GPU": (720, 1280, (0, 1, 1)), "720p by height": (362, 1280, (0, 0, 1))}.items():
    torch.manual_seed(0)
    x = torch.randn(1, 96, 6, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    wt = torch.randn(96, 96, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * 96) ** 0.5
    bw = box_conv.box_weight_of(wt)
    ho, wo = h + 2 * pad[1] - 2, w + 2 * pad[2] - 2
    out = torch.empty(1, 96, 4, ho, wo, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    new, cache = x[:, :, 2:].clone(), x[:, :, :2].clone()
    runs = {
        "library plain (6-frame buffer)": lambda: box_conv.conv3d(x, wt, None, pad, out, bw),
        "library causal, cache apart": lambda: box_conv.conv3d(new, wt, None, pad, out, bw, causal=True, cache=cache),
        "branch only (xd, 6-frame buffer)": lambda: bv_branch.conv3d(x, wt, None, pad, out, bw, causal=True),
        "cache descriptors first": lambda: bv_order.conv3d(new, wt, None, pad, out, bw, causal=True, cache=cache),
        "descriptors interleaved": lambda: bv_interleaved.conv3d(new, wt, None, pad, out, bw, causal=True, cache=cache),
    }
    want = runs["library plain (6-frame buffer)"]().clone()
    for label, fn in runs.items():
        same = torch.equal(fn(), want)
        print(f"{name:16} {label:34} bit-identical {same}", flush=True)
    torch.cuda.synchronize()
    for rnd in range(3):
        for label, fn in runs.items():
            print(f"{name:16} {label:34} {ms(fn):7.3f} ms", flush=True)
