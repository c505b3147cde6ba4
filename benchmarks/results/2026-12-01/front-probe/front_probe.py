"""Why box_conv reading the cache apart runs slower alone at 720p on 1 GPU: variants timed in one process."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import norm_kernel
from vaeshard import box_conv

def ms(fn):
    return norm_kernel._time(fn, loops=1, reps=30) * 1e3

for name, (h, w, pad) in {"720p 1 GPU": (720, 1280, (0, 1, 1)), "720p by height": (362, 1280, (0, 0, 1)),
                          "480p 1 GPU": (480, 832, (0, 1, 1))}.items():
    torch.manual_seed(0)
    x = torch.randn(1, 96, 6, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    wt = torch.randn(96, 96, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * 96) ** 0.5
    bw = box_conv.box_weight_of(wt)
    ho, wo = h + 2 * pad[1] - 2, w + 2 * pad[2] - 2
    out = torch.empty(1, 96, 4, ho, wo, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    new = x[:, :, 2:].clone()
    cache = x[:, :, :2].clone()
    view_new, view_cache = x[:, :, 2:], x[:, :, :2]
    runs = {
        "plain (6-frame buffer)": lambda: box_conv.conv3d(x, wt, None, pad, out, bw),
        "causal, no cache (zeros)": lambda: box_conv.conv3d(new, wt, None, pad, out, bw, causal=True),
        "causal, cache apart": lambda: box_conv.conv3d(new, wt, None, pad, out, bw, causal=True, cache=cache),
        "causal, views of one buffer": lambda: box_conv.conv3d(view_new, wt, None, pad, out, bw, causal=True, cache=view_cache),
        "causal, cache = new's frames": lambda: box_conv.conv3d(new, wt, None, pad, out, bw, causal=True, cache=new[:, :, :2]),
        "plain again": lambda: box_conv.conv3d(x, wt, None, pad, out, bw),
    }
    for label, fn in runs.items():
        fn()
    torch.cuda.synchronize()
    for rnd in range(2):
        for label, fn in runs.items():
            print(f"{name:16} {label:30} {ms(fn):7.3f} ms", flush=True)
