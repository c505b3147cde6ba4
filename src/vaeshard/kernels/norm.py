"""The fast tier's elementwise kernels: the RMS norms (+ SiLU) in one pass (Wan's, and the
weightless mean-square one of LTX-Video), a convolution's bias (and
a residual) added in one pass, and Wan 2.2's duplicating shortcut added in place.

Each rounds to the tensor dtype at the steps PyTorch's separate operations round (norm_math holds
the norm's arithmetic); each has an eager PyTorch path with the same steps where Triton cannot run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import norm_math
from .conv3d import dense_channels_last
from .triton_support import launch, runs_on, tl, triton
from .voxels import spatial_strides as _spatial_strides
from .voxels import wide as _wide

if triton is not None:
    from .voxels import offsets as _offsets
    from .voxels import upsampled_block as _upsampled_block
    from .voxels import voxel_block as _voxel_block

    @triton.jit
    def _rms_norm_silu_kernel(
        x_ptr,
        y_ptr,
        w_ptr,
        b_ptr,
        p_ptr,
        S,
        C,
        D1,
        D2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        syn,
        syc,
        sy0,
        sy1,
        sy2,
        scale,
        eps,
        HAS_BIAS: tl.constexpr,
        PRE_BIAS: tl.constexpr,
        SILU: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        CHUNKS: tl.constexpr,
        WIDE: tl.constexpr,
        KIND: tl.constexpr = 0,
    ):
        # One program: one sample n and BLOCK_S voxels, all C channels (_voxel_block), held as
        # CHUNKS blocks of BLOCK_C channels (1 to 3; C = CHUNKS * BLOCK_C, or C <= BLOCK_C with
        # CHUNKS == 1). Wan's channel counts are 3 x 2^k: three full blocks keep every lane busy
        # where one block of the next power of two would leave a quarter of them masked, and this
        # kernel is bound by its instruction count, not by memory (`benchmarks/kernel_costs.py sass`
        # counts them, `kernel_costs.py norm` times the kernel against a copy).
        # Every spatial dim has its own stride, so x and y may be any strided views (a slice of a
        # larger buffer, too). Channels-last tensors load contiguous channel rows, contiguous ones
        # contiguous voxel rows; both coalesce.
        # The arithmetic is norm_math's (diffusers' WanRMS_norm step by step, with its roundings; with
        # KIND 1, its weightless RMSNorm: `inverse_rms`, `rms_scaled`; KIND 2, LTX-2's PerChannelRMSNorm:
        # `rounded_square`, `per_channel_rms`, `rms_divided`).
        # PRE_BIAS: the preceding convolution's bias, added to x first and rounded to the dtype.
        dt = y_ptr.dtype.element_ty
        n, offs_c, i0, i1, i2, mask = _voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
        x_at = _offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2)
        y_at = _offsets(n, offs_c, i0, i1, i2, syn, syc, sy0, sy1, sy2)
        x0 = _norm_load(x_ptr, x_at, p_ptr, offs_c, mask, C, PRE_BIAS, dt)
        squares = tl.sum(_square(x0, dt, KIND), axis=1)
        if CHUNKS >= 2:
            x1 = _norm_load(x_ptr + BLOCK_C * sxc, x_at, p_ptr + BLOCK_C, offs_c, mask, C, PRE_BIAS, dt)
            squares += tl.sum(_square(x1, dt, KIND), axis=1)
        if CHUNKS >= 3:
            x2 = _norm_load(x_ptr + 2 * BLOCK_C * sxc, x_at, p_ptr + 2 * BLOCK_C, offs_c, mask, C, PRE_BIAS, dt)
            squares += tl.sum(_square(x2, dt, KIND), axis=1)
        if KIND == 1:
            inv = norm_math.inverse_rms(squares, C, eps)
        elif KIND == 2:
            inv = norm_math.per_channel_rms(squares, C, eps, dt)  # (the root itself: the store divides by it)
        else:
            inv = norm_math.inverse_norm(squares, eps)
        _norm_store(x0, inv, y_ptr, y_at, w_ptr, b_ptr, offs_c, mask, C, scale, HAS_BIAS, SILU, dt, KIND)
        if CHUNKS >= 2:
            _norm_store(
                x1,
                inv,
                y_ptr + BLOCK_C * syc,
                y_at,
                w_ptr + BLOCK_C,
                b_ptr + BLOCK_C,
                offs_c,
                mask,
                C,
                scale,
                HAS_BIAS,
                SILU,
                dt,
                KIND,
            )
        if CHUNKS >= 3:
            _norm_store(
                x2,
                inv,
                y_ptr + 2 * BLOCK_C * syc,
                y_at,
                w_ptr + 2 * BLOCK_C,
                b_ptr + 2 * BLOCK_C,
                offs_c,
                mask,
                C,
                scale,
                HAS_BIAS,
                SILU,
                dt,
                KIND,
            )

    @triton.jit
    def _square(x, dt, KIND: tl.constexpr):
        # the squares a norm sums: rounded to dt first for LTX-2's PerChannelRMSNorm (KIND 2)
        if KIND == 2:
            return norm_math.rounded_square(x, dt)
        return x * x

    @triton.jit
    def _norm_load(x_ptr, at, p_ptr, offs_c, mask, C, PRE_BIAS: tl.constexpr, dt):
        # one block of channels in fp32 (0 where masked), the convolution's bias added and rounded
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if PRE_BIAS:
            x = tl.where(mask, norm_math.plus_bias(x, p_ptr, offs_c, C, dt), 0.0)
        return x

    @triton.jit
    def _norm_store(
        x,
        inv,
        y_ptr,
        at,
        w_ptr,
        b_ptr,
        offs_c,
        mask,
        C,
        scale,
        HAS_BIAS: tl.constexpr,
        SILU: tl.constexpr,
        dt,
        KIND: tl.constexpr = 0,
    ):
        if KIND == 1:
            y = norm_math.rms_scaled(x, inv, SILU, dt)
        elif KIND == 2:
            y = norm_math.rms_divided(x, inv, SILU, dt)
        else:
            y = norm_math.normalized(x, inv, w_ptr, b_ptr, offs_c, C, scale, HAS_BIAS, SILU, dt)
        tl.store(y_ptr + at, y.to(dt), mask=mask)


if triton is not None:

    @triton.jit
    def _bias_residual_kernel(
        x_ptr,
        h_ptr,
        b_ptr,
        S,
        C,
        D1,
        D2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        shn,
        shc,
        sh0,
        sh1,
        sh2,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        INTO_H: tl.constexpr,
        RESIDUAL: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        # x <- (x + bias) + h in place (h <- it with INTO_H), rounding to the dtype after each add as
        # PyTorch's two separate adds do (a convolution's bias pass, then the residual add).
        # Without RESIDUAL: x <- x + bias (h is not read), as PyTorch's bias pass alone.
        dt = x_ptr.dtype.element_ty
        n, offs_c, i0, i1, i2, mask = _voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
        x_at = _offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2)
        x = tl.load(x_ptr + x_at, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
        if RESIDUAL:
            x = (x + b[None, :]).to(dt).to(tl.float32)
            h_at = _offsets(n, offs_c, i0, i1, i2, shn, shc, sh0, sh1, sh2)
            h = tl.load(h_ptr + h_at, mask=mask, other=0.0).to(tl.float32)
            if INTO_H:
                tl.store(h_ptr + h_at, (x + h).to(dt), mask=mask)
            else:
                tl.store(x_ptr + x_at, (x + h).to(dt), mask=mask)
        else:
            tl.store(x_ptr + x_at, (x + b[None, :]).to(dt), mask=mask)


if triton is not None:

    @triton.jit
    def _add_duplicated_kernel(
        out_ptr,
        src_ptr,
        V,
        C,
        T2,
        H2,
        W2,
        son,
        sot,
        soh,
        sow,
        ssn,
        sst,
        ssh,
        ssw,
        FT: tl.constexpr,
        FS: tl.constexpr,
        PER: tl.constexpr,
        REPEATS: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # out[n, c, t * FT + i, h * FS + j, w * FS + k] += src[n, c * PER + q // REPEATS, t, h, w] with
        # q = (i * FS + j) * FS + k (PER * REPEATS = FT * FS * FS): a program takes BLOCK_V output voxels
        # (T2 x H2 x W2 of sample n = program_id(2)) and BLOCK_C channels, both tensors channels-last;
        # the sum in fp32, rounded once, as PyTorch's add
        dt = out_ptr.dtype.element_ty
        n, c, t2, h2, w2, q, mask = _upsampled_block(V, C, H2, W2, FT, FS, BLOCK_V, BLOCK_C)
        out_at = n * son + t2 * sot + h2 * soh + w2 * sow
        src_at = n * ssn + (t2 // FT) * sst + (h2 // FS) * ssh + (w2 // FS) * ssw + q // REPEATS
        o = tl.load(out_ptr + out_at[:, None] + c[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.load(src_ptr + src_at[:, None] + (c * PER)[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_at[:, None] + c[None, :], (o + x).to(dt), mask=mask)


def add_duplicated_(out: torch.Tensor, src: torch.Tensor, factor_t: int, factor_s: int, repeats: int) -> bool:
    """out[n, c, t * ft + i, h * fs + j, w * fs + k] += src[n, c * per + q // repeats, t, h, w] with
    q = (i * fs + j) * fs + k and per = ft * fs * fs / repeats (Wan 2.2's duplicating shortcut, see
    families/wan/blocks.py `_dup_up_views`), in place, by one Triton pass where it runs (CUDA or the
    interpreter; both tensors `dense_channels_last`, of one dtype). Returns whether it ran (else the
    caller adds through views, with the same bits: one fp32 add rounded once)."""
    factor = factor_t * factor_s * factor_s
    if (
        not runs_on(out)
        or out.dtype != src.dtype
        or out.dim() != 5
        or src.dim() != 5
        or factor % repeats
        or out.numel() == 0
        or not (dense_channels_last(out) and dense_channels_last(src))
    ):
        return False
    n, c, t2, h2, w2 = out.shape
    block_c = min(128, triton.next_power_of_2(c))
    block_v = max(1, 4096 // block_c)
    grid = (triton.cdiv(t2 * h2 * w2, block_v), triton.cdiv(c, block_c), n)
    launch(
        _add_duplicated_kernel,
        grid,
        out,
        src,
        t2 * h2 * w2,
        c,
        t2,
        h2,
        w2,
        out.stride(0),
        out.stride(2),
        out.stride(3),
        out.stride(4),
        src.stride(0),
        src.stride(2),
        src.stride(3),
        src.stride(4),
        FT=factor_t,
        FS=factor_s,
        PER=factor // repeats,
        REPEATS=repeats,
        BLOCK_V=block_v,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return True


def fused_bias_add_available(x: torch.Tensor) -> bool:
    """Whether `add_bias_and_residual_` and `add_bias_` run as one kernel for `x` (CUDA with Triton).
    Only there is it worth leaving a convolution's bias out: PyTorch adds it in a separate pass on
    CUDA anyway, while CPU convolutions fold it in (so leaving it out on CPU would cost a pass and
    change bits)."""
    return runs_on(x)


def add_bias_(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x <- x + bias in place (one value per channel), rounded once to x's dtype as PyTorch's add
    rounds; one Triton pass on CUDA. Returns `x`."""
    if not _bias_kernel_takes(x):
        return x.add_(_per_channel(bias, x))
    _bias_pass(x, bias, None, False)
    return x


def add_bias_and_residual_(
    x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, into_residual: bool = False
) -> torch.Tensor:
    """x <- (x + bias) + residual in place (bias: one value per channel), in one pass on CUDA.

    Rounds after each add exactly as `conv(...)` with its bias followed by `+ residual` does in
    PyTorch (whose cuDNN path adds a convolution's bias in a separate pass). Returns `x`; with
    `into_residual` the sum is written into `residual` instead (the same bits: addition commutes)
    and `residual` is returned, so the caller can drop `x`.
    """
    if bias is None or not _bias_kernel_takes(x) or residual.shape != x.shape or residual.dtype != x.dtype:
        if bias is not None:
            x.add_(_per_channel(bias, x))
        return residual.add_(x) if into_residual else x.add_(residual)
    _bias_pass(x, bias, residual, into_residual)
    return residual if into_residual else x


def _per_channel(bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return bias.reshape(1, -1, *([1] * (x.ndim - 2)))


def _bias_kernel_takes(x: torch.Tensor) -> bool:
    return fused_bias_add_available(x) and x.numel() > 0 and 3 <= x.ndim <= 5


def _bias_pass(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None, into_residual: bool) -> None:
    """One launch of `_bias_residual_kernel`: x + bias, plus `residual` where one is given."""
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = _spatial_strides(x)
    shn, shc, sh0, sh1, sh2 = _spatial_strides(residual)[3] if residual is not None else (sxn, sxc, sx0, sx1, sx2)
    s = d0 * d1 * d2
    block_s, block_c, options = _tile(c)
    launch(
        _bias_residual_kernel,
        (triton.cdiv(s, block_s), n),
        x,
        x if residual is None else residual,
        bias.reshape(-1),
        s,
        c,
        d1,
        d2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        shn,
        shc,
        sh0,
        sh1,
        sh2,
        BLOCK_S=block_s,
        BLOCK_C=block_c,
        INTO_H=into_residual,
        RESIDUAL=residual is not None,
        WIDE=_wide(x) if residual is None else _wide(x, residual),
        **options,
    )


# The per-program tile of the two kernels above: all channels of up to `max_voxels` voxels, about
# `elements` elements (counting the channels padded to a power of two), run by `num_warps` warps.
# `benchmarks/kernel_costs.py norm` times the choices on a GPU; this one measured fastest summed over the
# Wan 2.1 720p shapes on an H200 (docs/tuning.md, entry `kernels/norm.py TILE`).
TILE = {"elements": 4096, "max_voxels": 128, "num_warps": 2}


def _tile(c: int):
    """(voxels per program, channel block, launch options) for `c` channels: one block of the next
    power of two (the bias + residual kernel)."""
    block_c = triton.next_power_of_2(c)
    block_s = max(1, min(TILE["max_voxels"], TILE["elements"] // block_c))
    return block_s, block_c, {"num_warps": TILE["num_warps"]}


def _channel_blocks(c: int) -> tuple[int, int]:
    """(channel block, blocks) covering `c` channels in the norm kernel: `c` itself if a power of two,
    three blocks of c/3 if that is one of at least 16 (Wan's 96, 192, 384), otherwise one masked
    block of the next power of two."""
    if c & (c - 1) == 0:
        return c, 1
    third = c // 3
    if c % 3 == 0 and third >= 16 and third & (third - 1) == 0:
        return third, 3
    return triton.next_power_of_2(c), 1


def rms_norm(
    x: torch.Tensor,
    gamma: torch.Tensor,
    bias,
    scale: float,
    silu: bool,
    eps: float = 1e-12,
    pre_bias=None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """silu?(x / max(||x||_C, eps) * scale * gamma + bias) in one pass, rounded as diffusers rounds.

    `pre_bias` (one value per channel) is added to `x` first, as a convolution's bias would have been.
    The result goes to a new tensor in the input's memory format, or into `out` (same shape as `x`,
    any strides, e.g. the new-frames view of a convolution's input buffer; `x` itself works too, as
    each voxel's channels are read before they are written); the tensor written is returned.
    """
    if not (runs_on(x) and x.numel() > 0 and _spatial_strides(x) is not None):
        # the same steps in eager PyTorch (CPU, or shapes the kernel does not take)
        if pre_bias is not None:
            x = x + pre_bias.reshape(1, -1, *([1] * (x.ndim - 2)))
        y = F.normalize(x.float(), dim=1, eps=eps).to(x.dtype) * scale * gamma + bias
        y = F.silu(y) if silu else y
        return out.copy_(y) if out is not None else y
    has_bias = isinstance(bias, torch.Tensor)
    return _norm_pass(x, out, gamma, bias if has_bias else None, pre_bias, scale, eps, silu, kind=0)


def mean_rms_norm(x: torch.Tensor, eps: float, silu: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu?(x * rsqrt(mean_C(x^2) + eps)) over dim 1 in one pass: diffusers' `RMSNorm` without
    weights (its fp32 variance, one rounding to the dtype) and the SiLU after it. `out` as in
    `rms_norm`; the tensor written is returned."""
    if not (runs_on(x) and x.numel() > 0 and _spatial_strides(x) is not None):
        y = (x * torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + eps)).to(x.dtype)
        y = F.silu(y) if silu else y
        return out.copy_(y) if out is not None else y
    return _norm_pass(x, out, None, None, None, 1.0, eps, silu, kind=1)


def per_channel_rms_norm(x: torch.Tensor, eps: float, silu: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu?(x / sqrt(mean_C(x^2) + eps)) over dim 1 in one pass: LTX-2's `PerChannelRMSNorm` (each step
    in the tensor dtype, as diffusers computes it) and the SiLU after it. `out` as in `rms_norm`; the
    tensor written is returned."""
    if not (runs_on(x) and x.numel() > 0 and _spatial_strides(x) is not None):
        y = x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + eps)
        y = F.silu(y) if silu else y
        return out.copy_(y) if out is not None else y
    return _norm_pass(x, out, None, None, None, 1.0, eps, silu, kind=2)


def _norm_pass(x, out, gamma, bias, pre_bias, scale, eps, silu, kind) -> torch.Tensor:
    """One launch of `_rms_norm_silu_kernel` (Triton runs on x's device)."""
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = _spatial_strides(x)
    y = out if out is not None else torch.empty_like(x)  # same memory format
    if y.shape != x.shape or y.dtype != x.dtype:
        raise ValueError(f"rms_norm: out must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(y.shape)}, {y.dtype}")
    _, _, _, (syn, syc, sy0, sy1, sy2) = _spatial_strides(y)
    s = d0 * d1 * d2
    block_s, _, options = _tile(c)
    block_c, chunks = _channel_blocks(c)
    unused = x  # a pointer the kernel never reads (no weight, bias or pre-bias)
    grid = (triton.cdiv(s, block_s), n)
    launch(
        _rms_norm_silu_kernel,
        grid,
        x,
        y,
        unused if gamma is None else gamma.reshape(-1),
        unused if bias is None else bias.reshape(-1),
        unused if pre_bias is None else pre_bias.reshape(-1),
        s,
        c,
        d1,
        d2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        syn,
        syc,
        sy0,
        sy1,
        sy2,
        float(scale),
        float(eps),
        HAS_BIAS=bias is not None,
        PRE_BIAS=pre_bias is not None,
        SILU=silu,
        BLOCK_S=block_s,
        BLOCK_C=block_c,
        CHUNKS=chunks,
        WIDE=_wide(x, y),
        KIND=kind,
        **options,
    )
    return y
