# the fast tier's CUDA kernels with two samples against PyTorch's (1 GPU, bf16), and the decode with parts of them off
import copy
from unittest import mock
import torch
import torch.nn.functional as F
import vaeshard
from vaeshard import box_conv, conv_kernel
from vaeshard.io import NAMED_CONFIGS
from diffusers import AutoencoderKLWan

dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
for box in (True, False):
    for cin, cout in ((96, 96), (192, 192), (96, 3)):
        x = torch.randn(2, cin, 6, 40, 72, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last_3d)
        w = torch.randn(cout, cin, 3, 3, 3, device=dev, dtype=dt) / (27 * cin) ** 0.5
        b = torch.randn(cout, device=dev, dtype=dt)
        with mock.patch.object(box_conv, "available", (lambda: True) if box else (lambda: False)):
            how = conv_kernel.plan(x, w, 1, (0, 1, 1), 1, 1)
            if how is None:
                print("box" if box else "triton", cin, cout, "no plan"); continue
            want = F.conv3d(x, w, b, 1, (0, 1, 1))
            got = conv_kernel.conv3d(x, w, b, (0, 1, 1), how, conv_kernel.cached_weight_for(how, w))
            r = torch.randn(want.shape, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last_3d)
            got2 = conv_kernel.conv3d(x, w, b, (0, 1, 1), how, conv_kernel.cached_weight_for(how, w), add_to=r.clone())
            print("box" if box else "triton", cin, cout, how.box, "plain", f"{rel(got, want):.1e}", "per sample",
                  [f"{rel(got[i], want[i]):.1e}" for i in range(2)], "add", f"{rel(got2, want + r):.1e}", flush=True)
for sub, cin, cout in ((1, 192, 96), (2, 384, 192)):
    src = torch.randn(4, sub * cin, 20, 36, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, cin, 3, 3, device=dev, dtype=dt) / (9 * cin) ** 0.5
    b = torch.randn(cout, device=dev, dtype=dt)
    how = conv_kernel.upsample_plan(src, w, sub, 36)
    frames = src.unflatten(1, (sub, cin)).flatten(0, 1)
    want = F.conv2d(F.interpolate(frames, scale_factor=2, mode="nearest"), w, b, 1, 1)
    got = conv_kernel.upsample_conv2d(src, sub, w, b, how)
    print("upsample", sub, cin, cout, how is not None, f"{rel(got, want):.1e}", flush=True)
torch.manual_seed(0)
base = AutoencoderKLWan(**NAMED_CONFIGS["wan21"][1]).eval().to(dev, dt)
z = torch.randn(2, 16, 3, 16, 32, generator=torch.Generator().manual_seed(1)).to(dev, dt)
vae = vaeshard.parallelize(copy.deepcopy(base), cuda_graphs=False)
with torch.no_grad():
    ref = torch.cat([base.decode(z[i:i + 1]).sample for i in range(2)]).float()
for name, patches in {"plan off, upsample on": [mock.patch.object(conv_kernel, "plan", lambda *a, **k: None)],
                      "plan off, upsample off": [mock.patch.object(conv_kernel, "plan", lambda *a, **k: None),
                                                 mock.patch.object(conv_kernel, "upsample_plan", lambda *a, **k: None)],
                      "box only 96": [mock.patch.object(box_conv, "PLANS", {96: box_conv.PLANS[96]}),
                                      mock.patch.object(conv_kernel, "upsample_plan", lambda *a, **k: None)]}.items():
    import contextlib
    with contextlib.ExitStack() as st:
        for p in patches:
            st.enter_context(p)
        both = vae.decode(z).sample.float()
    print(f"{name:24}", [f"{(both[i] - ref[i]).abs().max().item():.2e}" for i in range(2)], flush=True)
