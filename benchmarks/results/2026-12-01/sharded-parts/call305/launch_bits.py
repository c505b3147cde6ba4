"""On the GPU: the decode with the compiled kernels launched directly (triton_support.launch) against
the same decode with every launch through Triton's JIT function: equal bits?"""
import time
import torch
from diffusers import AutoencoderKLWan
import vaeshard
from vaeshard import triton_support
from vaeshard.io import NAMED_CONFIGS
dev = torch.device("cuda")
for key, shape in (("wan21", (1, 16, 5, 72, 72)), ("wan22", (1, 48, 5, 36, 36))):
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**NAMED_CONFIGS[key][1]).eval().to(dev, torch.bfloat16)
    vaeshard.parallelize(vae)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dev, torch.bfloat16)
    with torch.no_grad():
        vae.decode(z)  # compiles, keeps the compiled kernels
        t0 = time.perf_counter(); direct = vae.decode(z).sample; torch.cuda.synchronize(); t1 = time.perf_counter()
        saved = triton_support._key
        triton_support._key = lambda args, kwargs: None
        try:
            jit = vae.decode(z).sample; torch.cuda.synchronize(); t2 = time.perf_counter()
        finally:
            triton_support._key = saved
    kept = {k: len(v) for k, v in ((f, getattr(f, "_vaeshard_compiled", {})) for f in (
        __import__("vaeshard.fast", fromlist=["x"])._rms_norm_silu_kernel,
        __import__("vaeshard.box_conv", fromlist=["x"])._box_conv_kernel)) }
    print(f"{key} {shape}: equal bits {torch.equal(direct, jit)}; {t1 - t0:.3f} s direct, {t2 - t1:.3f} s JIT; keys kept {list(kept.values())}")
