"""A rank's part of tests/test_kernels/test_conv_kernel.py's sharded decode through the Triton kernel: in a module
of its own, since the rank processes import it (the test module builds large example tensors at
import)."""

import torch


def sharded_through_the_kernel(rank, world, mode, samples=1):
    """One rank of a sharded fp16 decode of the small Wan 2.1 through the Triton kernel, in Triton's
    interpreter (set before this process imported Triton): the kernel calls' (wrapping tiles?,
    residual added in the epilogue?, next norm computed in the epilogue?), the upsamplers' phase
    convolutions' halo (rows, columns), the (query, key) tokens of the fast tier's attention calls, and the
    max / mean difference to diffusers' fp32 decode; `samples` latents in one request."""
    import vaeshard
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.kernels import triton_support

    from . import interpreter
    from .models import build, latent

    assert triton_support.interpreting()
    interpreter.for_model_decodes()
    conv_kernel.TILE = conv_kernel.ConvPlan(wrap=False, block_m=16, block_n=32)  # the model's 32 channels
    from vaeshard.kernels import attention
    from vaeshard.kernels import phases as upsample

    upsampled = []  # (halo rows, halo columns) of each upsampling convolution's source (by phases)
    calls = []
    attended = []  # (query tokens, key tokens) of each attention on the fast tier's own
    by_phases, kernel, own_attention = upsample.conv2d_by_phases, conv_kernel.conv3d, attention.attention
    upsample.conv2d_by_phases = lambda *a, **k: upsampled.append(a[3]) or by_phases(*a, **k)
    conv_kernel.conv3d = lambda *a, **k: (
        calls.append((a[4].wrap, (a[6] if len(a) > 6 else k.get("add_to")) is not None, k.get("norm") is not None))
        or kernel(*a, **k)
    )
    attention.attention = lambda q, k, v: attended.append((q.shape[2], k.shape[2])) or own_attention(q, k, v)
    try:  # (set back after: a process may decode several cases)
        vae = build("wan21")
        z = latent((samples, 4, 2, 4, 16))
        with torch.no_grad():
            ref = vae.decode(z).sample
        vae.to(torch.float16)
        vaeshard.parallelize(vae, mode=mode)
        out = vae.decode(z.to(torch.float16)).sample
    finally:
        upsample.conv2d_by_phases, conv_kernel.conv3d, attention.attention = by_phases, kernel, own_attention
    err = (out.float() - ref).abs()
    return calls, upsampled, attended, err.max().item(), err.mean().item()


def sharded_cases(rank, world, cases):
    """`sharded_through_the_kernel` for each (mode, samples) of `cases` on the same ranks (one launch
    of fresh rank processes, which import Triton in its interpreter, for all of them): by case."""
    return {case: sharded_through_the_kernel(rank, world, *case) for case in cases}
