"""Wrapping tiles: the committed kernel (pointer stores) vs the TMA-box stores, same process."""
import sys, os, statistics, importlib.util, torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import norm_kernel
from vaeshard import conv_kernel as new
spec = importlib.util.spec_from_file_location("old_conv_kernel", ".ab/old_conv_kernel.py",
                                              submodule_search_locations=None)
import vaeshard.triton_support  # the old file imports it relatively: patch
src = open(".ab/old_conv_kernel.py").read().replace("from .triton_support", "from vaeshard.triton_support")
old = type(sys)("old_conv_kernel"); exec(compile(src, "old_conv_kernel.py", "exec"), old.__dict__)
shapes = {"720p 2 GPUs width 96": (96, 720, 642), "720p 4 GPUs width 96": (96, 720, 322),
          "480p 2 GPUs width 96": (96, 480, 418), "720p/2 2 GPUs width 192": (192, 360, 322)}
for name, (c, h, w) in shapes.items():
    x = torch.randn(1, c, 6, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    wt = torch.randn(c, c, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * c) ** 0.5
    pad = (0, 1, 0)
    gw = new.gemm_weight_of(wt)
    hn = new.plan(x, wt, 1, pad, 1, 1); ho = old.plan(x, wt, 1, pad, 1, 1)
    a = new.conv3d(x, wt, None, pad, hn, gw); b = old.conv3d(x, wt, None, pad, ho, gw)
    same = torch.equal(a, b)
    tn = norm_kernel._time(lambda: new.conv3d(x, wt, None, pad, hn, gw), 1, 20) * 1e3
    to = norm_kernel._time(lambda: old.conv3d(x, wt, None, pad, ho, gw), 1, 20) * 1e3
    tn2 = norm_kernel._time(lambda: new.conv3d(x, wt, None, pad, hn, gw), 1, 20) * 1e3
    print(f"{name:26} old {to:.3f} ms  new {tn:.3f}/{tn2:.3f} ms  ratio {to / min(tn, tn2):.3f}  identical {same}")
