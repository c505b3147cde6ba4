"""The arithmetic of the RMS norms (+ SiLU) on one block of voxels, as Triton device functions: one
place for it, shared by the fast tier's norm kernel (norm.py) and the convolution kernels' epilogues
that normalise as they store (conv3d.py, box_conv.py), so they round at the same steps.

The steps follow diffusers' `WanRMS_norm` and the SiLU after it, rounding to the tensor dtype `dt`
where diffusers materialises a tensor: (a convolution's bias added -> dt), normalize in fp32 -> dt,
* scale -> dt, * gamma -> dt, + bias -> dt, SiLU in fp32 -> dt (the caller's store). In fp32 the
roundings vanish. What differs from PyTorch: the order of the sum of squares, and the division by
the norm taken as one reciprocal per voxel times each channel.

`inverse_rms` and `rms_scaled` are the other kind, diffusers' `RMSNorm` without weights (LTX-Video's,
over channels): x * rsqrt(mean(x^2) + eps) in fp32, rounded to dt once, SiLU in fp32 -> dt.
`rounded_square`, `per_channel_rms` and `rms_divided` are LTX-2's `PerChannelRMSNorm`, which computes
in the tensor dtype: x^2 -> dt, mean -> dt, + eps -> dt, sqrt -> dt, x / rms -> dt, SiLU -> dt.
"""

from __future__ import annotations

from .triton_support import tl, triton

if triton is not None:

    @triton.jit
    def plus_bias(x, p_ptr, offs_c, C, dt):
        """x + a per-channel bias, rounded to dt (a convolution's bias pass), in fp32; 0 past C."""
        p = tl.load(p_ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
        return (x + p[None, :]).to(dt).to(tl.float32)

    @triton.jit
    def inverse_norm(squares, eps):
        """1 / max(||x||, eps) per voxel, from its sum of squares (F.normalize's denominator)."""
        return 1.0 / tl.maximum(tl.sqrt(squares), eps)

    @triton.jit
    def normalized(x, inv, w_ptr, b_ptr, offs_c, C, scale, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, dt):
        """silu?(x * inv * scale * gamma + bias) with diffusers' roundings, in fp32 (the caller rounds
        it to dt as it stores)."""
        y = (x * inv[:, None]).to(dt).to(tl.float32)
        y = (y * scale).to(dt).to(tl.float32)
        w = tl.load(w_ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
        y = (y * w[None, :]).to(dt).to(tl.float32)
        if HAS_BIAS:
            b = tl.load(b_ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
            y = (y + b[None, :]).to(dt).to(tl.float32)
        if SILU:  # y * sigmoid(y); exp(-y) as 2^(-y log2 e), one instruction fewer per element than tl.exp
            y = y / (1.0 + tl.math.exp2(y * -1.4426950408889634))
        return y

    @triton.jit
    def inverse_rms(squares, C, eps):
        """1 / sqrt(mean(x^2) + eps) per voxel, from its sum of squares over `C` channels (RMSNorm's
        rsqrt of the fp32 variance plus eps)."""
        return 1.0 / tl.sqrt(squares / C + eps)

    @triton.jit
    def rms_scaled(x, inv, SILU: tl.constexpr, dt):
        """silu?(x * inv) rounded as diffusers' weightless RMSNorm (to dt once) and the SiLU after it,
        in fp32 (the caller rounds it to dt as it stores)."""
        y = (x * inv[:, None]).to(dt).to(tl.float32)
        if SILU:
            y = y / (1.0 + tl.math.exp2(y * -1.4426950408889634))
        return y

    @triton.jit
    def rounded_square(x, dt):
        """x^2 rounded to dt (PerChannelRMSNorm's `x**2` in the tensor dtype), in fp32."""
        return (x * x).to(dt).to(tl.float32)

    @triton.jit
    def per_channel_rms(squares, C, eps, dt):
        """sqrt(mean(x^2) + eps) per voxel from its sum of rounded squares over `C` channels, rounded
        as PerChannelRMSNorm's steps are (the mean, the sum with eps, the root: each to dt)."""
        mean = (squares / C).to(dt).to(tl.float32)
        return tl.sqrt((mean + eps).to(dt).to(tl.float32)).to(dt).to(tl.float32)

    @triton.jit
    def rms_divided(x, rms, SILU: tl.constexpr, dt):
        """silu?(x / rms) rounded as PerChannelRMSNorm's division (to dt) and the SiLU after it, in fp32."""
        y = (x / rms[:, None]).to(dt).to(tl.float32)
        if SILU:
            y = y / (1.0 + tl.math.exp2(y * -1.4426950408889634))
        return y
