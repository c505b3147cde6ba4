"""box_conv's kernel as PyTorch computes its contract, for CPU tests of the convolutions the fast tier
hands it (its values are checked on a GPU: benchmarks/gpu_parity.py, benchmarks/conv_kernel.py).

`install` makes conv_kernel take CPU tensors (its `runs_on`), box_conv "run" every 3x3x3
convolution of a half-precision tensor, and box_conv.conv3d compute what the kernel computes from
the same arguments: the sum in fp64 (the kernel's fp32 sum, without its own order), the bias added
before the one rounding, a residual (`add`) added after it and rounded again, and with `causal`
the two frames before each sample's first taken from the cache's last frames, zeros before them.
In a module of its own: rank processes import it."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from vaeshard.kernels import box_conv
from vaeshard.kernels import conv3d as conv_kernel


def install(set_attr, calls: list) -> None:
    """`set_attr(obj, name, value)` (monkeypatch.setattr, or setattr in a process of its own); each
    call appends (output channels, causal, the cache's frames or None, the input's data_ptr) to
    `calls`."""
    set_attr(conv_kernel, "runs_on", lambda x: True)  # CPU tensors stand in for CUDA ones
    set_attr(
        box_conv, "runs", lambda x, w: x.dtype in (torch.float16, torch.bfloat16) and tuple(w.shape[2:]) == (3, 3, 3)
    )

    def conv3d(x, weight, bias, padding, out, box_weight, add=False, norm=None, how=None, causal=False, cache=None):
        calls.append((weight.shape[0], causal, None if cache is None else cache.shape[2], x.data_ptr()))
        return reference_conv3d(x, weight, bias, padding, out, add, norm, causal, cache)

    set_attr(box_conv, "conv3d", conv3d)


@contextlib.contextmanager
def installed(calls: list):
    """`install` for the block's duration, everything set back after (a pooled rank process's own)."""
    saved = []

    def set_attr(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    try:
        install(set_attr, calls)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def reference_conv3d(x, weight, bias, padding, out, add=False, norm=None, causal=False, cache=None):
    """box_conv.conv3d's result from its arguments (see the module's text), written into `out`."""
    assert norm is None, "the decode asks box_conv for no norm (conv_kernel.norms_in_epilogue)"
    assert out.shape[2] == x.shape[2] - 2 * (not causal)
    if causal:
        n, c, _, h, w = x.shape
        front = x.new_zeros(n, c, 2, h, w)
        if cache is not None:  # as the kernel reads it: conv_kernel.takes_front, the input's geometry
            assert conv_kernel.takes_front(cache, x.dtype, x.device), cache.stride()
            assert cache.shape[:2] == x.shape[:2] and cache.shape[3:] == x.shape[3:], (cache.shape, x.shape)
            front[:, :, 2 - cache.shape[2] :] = cache
        x = torch.cat([front, x], dim=2)
    y = F.conv3d(x.double().contiguous(), weight.double(), None if bias is None else bias.double(), padding=padding)
    if add:
        y = y.to(out.dtype).double() + out.double()
    return out.copy_(y.to(out.dtype))


def decode_both_ways(rank, world, mode, samples=1, settings=None):
    """One rank of a fp16 decode (then an encode) of the small Wan 2.1 in the fast tier with the
    stand-in installed (this process's own: a fresh rank process, or the caller's with everything
    set back after): twice, the causal convolutions reading their time padding where it lies
    (the route's front) and the head's norm writing into its convolution's buffer
    (wan_blocks.FastCoderHead), then both declining (the frames copied into the buffers; diffusers' own
    head: the norm's output cloned for the cache, then copied into the buffer). Returns
    (the stand-in's calls and the input buffers made in the first decode, the stand-in's calls in
    the second, whether the two ways' decodes and encodes are equal bit for bit, and the larger of
    the first way's max / mean differences to diffusers' fp32 decode and encode). A buffer: (the
    convolution's output channels and time padding, new frames, buffer frames, read where it lies?)."""
    import vaeshard
    from vaeshard.families.wan import blocks as wan_blocks
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.layers import convs

    from .models import build, latent

    saved = []

    def set_attr(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    calls, buffers = [], []
    try:
        install(set_attr, calls)
        input_buffer = convs.HaloCausalConv3d.input_buffer

        def spy(self, like, cache_x, halo_rows=None, shape=None):
            buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
            buffers.append((self.out_channels, self._padding[4], new.shape[2], buf.shape[2], front is not None))
            return buf, new, ready, front

        set_attr(convs.HaloCausalConv3d, "input_buffer", spy)
        vae = build("wan21")
        z = latent((samples, 4, 3, 4, 8))  # three decoder calls: caches of none, one and two frames
        torch.manual_seed(1)
        video = torch.rand(samples, 3, 9, 32, 64) * 2 - 1  # (the encoder's caches too)
        with torch.no_grad():
            ref, ref_latent = vae.decode(z).sample, vae.encode(video).latent_dist.mean
        vae.to(torch.float16)
        vaeshard.parallelize(vae, mode=mode, fast=vaeshard.FastOptions(**settings or {}))
        apart = vae.decode(z.to(torch.float16)).sample
        first, made = list(calls), list(buffers)
        encoded = vae.encode(video.to(torch.float16)).latent_dist.mean
        calls.clear()
        set_attr(conv_kernel, "reads_front", lambda like, weight, cache: False)
        set_attr(wan_blocks, "_head_fast_path", lambda part: False)
        copied = vae.decode(z.to(torch.float16)).sample
        encoded_copied = vae.encode(video.to(torch.float16)).latent_dist.mean
        vaeshard.unparallelize(vae)
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
    err, err_latent = (apart.float() - ref).abs(), (encoded.float() - ref_latent).abs()
    return (
        first,
        made,
        list(calls),
        torch.equal(apart, copied) and torch.equal(encoded, encoded_copied),
        max(err.max().item(), err_latent.max().item()),
        max(err.mean().item(), err_latent.mean().item()),
    )
