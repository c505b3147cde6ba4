# where does the fast tier's two-sample decode differ from its one-sample decodes? (1 GPU, bf16, Wan 2.1 config)
import contextlib, copy
from unittest import mock
import torch
import vaeshard
from vaeshard import box_conv, conv_kernel
from vaeshard.io import NAMED_CONFIGS
from diffusers import AutoencoderKLWan

torch.manual_seed(0)
base = AutoencoderKLWan(**NAMED_CONFIGS["wan21"][1]).eval().to("cuda", torch.bfloat16)
z = torch.randn(2, 16, 3, 16, 32, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)
with torch.no_grad():
    ref = torch.cat([base.decode(z[i:i + 1]).sample for i in range(2)]).float()
vae = vaeshard.parallelize(copy.deepcopy(base))
OLD = {96: box_conv.BoxPlan(), 192: box_conv.BoxPlan(rows=8, block_n=128, block_n2=64), 3: box_conv.PLANS[3]}
variants = {
    "default": ({}, []),
    "no graphs": (dict(cuda_graphs=False), []),
    "box old plans": (dict(cuda_graphs=False), [mock.patch.object(box_conv, "PLANS", OLD)]),
    "no box": (dict(cuda_graphs=False), [mock.patch.object(box_conv, "available", lambda: False)]),
    "no triton convs": (dict(cuda_graphs=False, triton_convs=False), []),
    "no upsample kernel": (dict(cuda_graphs=False), [mock.patch.object(conv_kernel, "upsample_plan", lambda *a, **k: None)]),
}
for name, (opts, patches) in variants.items():
    try:
        vaeshard.parallelize(vae, **opts)
        with contextlib.ExitStack() as st:
            for p in patches:
                st.enter_context(p)
            both = vae.decode(z).sample.float()
            single = torch.cat([vae.decode(z[i:i + 1]).sample for i in range(2)]).float()
        d = [(both[i] - single[i]).abs().max().item() for i in range(2)]
        r = [(both[i] - ref[i]).abs().max().item() for i in range(2)]
        s = [(single[i] - ref[i]).abs().max().item() for i in range(2)]
        print(f"{name:20} two vs one: {d[0]:.2e} {d[1]:.2e}   two vs diffusers: {r[0]:.2e} {r[1]:.2e}   one vs diffusers: {s[0]:.2e} {s[1]:.2e}", flush=True)
    except Exception as e:
        print(f"{name:20} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
