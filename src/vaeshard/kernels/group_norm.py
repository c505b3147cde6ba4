"""GroupNorm (+ SiLU) on a channels-last map in two reads and one write: the fast tier's GroupNorm.

PyTorch's CUDA GroupNorm takes a channels-first map: given the fast tier's channels-last maps it
first copies the input to channels-first and returns a channels-first output, which the next
convolution copies back, and diffusers' SiLU after it is a pass of its own. Here:

1. `_partials_kernel` reads the map once: each program takes consecutive blocks of voxels of one
   sample, all channels (one block, or up to `PARTIAL_BLOCKS` where the map is large), and stores
   per group their sum and their sum of squared deviations from their own mean (each block's about
   its mean, merged by Chan's formula in fp32);
2. the blocks are combined per (sample, group) in float64 (Chan's formula: the deviations of each
   block's mean from the whole's weighted by the block's count; no E[x^2] - E[x]^2 cancellation;
   a sharded map's ranks then add their float64 sums in one all-reduce), giving GroupNorm's mean and
   1 / sqrt(var + eps), folded with the weight and bias into one scale and one shift per (sample,
   channel), in fp32 as PyTorch folds them;
3. `_apply_kernel` reads the map again and writes x * scale + shift, rounded to the dtype as the
   norm's output is, then SiLU of that rounded value (rounded again, as diffusers' separate SiLU
   rounds), into a new channels-last tensor or into `out` (any strides: the interior of the next
   convolution's padded input, fast/producers.py).

What differs from PyTorch: the order of the sums (the statistics in float64 from fp32 block sums).
The kernels take 3- to 5-D maps whose channel count is a power of two split into groups of a power
of two; any other input runs PyTorch's GroupNorm and SiLU (the same steps as diffusers').
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .triton_support import launch, runs_on, tl, triton
from .voxels import spatial_strides, wide

ELEMENTS = 4096  # a program's tile: all channels of up to ELEMENTS // C voxels
NUM_WARPS = 4

if triton is not None:
    from .voxels import offsets, voxel_block, voxel_block_at

    @triton.jit
    def _partials_kernel(
        x_ptr,
        sum_ptr,
        m2_ptr,
        S,
        C,
        D1,
        D2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        P,
        pb_ptr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        G: tl.constexpr,
        BLOCKS: tl.constexpr,
        PRE_BIAS: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        # per group of this program's BLOCKS consecutive blocks of voxels: the sum, and the sum of
        # squared deviations from its mean (each block's about its own mean, merged by Chan's formula)
        p = tl.program_id(0)
        count = 0.0
        mean = tl.zeros((G,), dtype=tl.float32)
        m2 = tl.zeros((G,), dtype=tl.float32)
        for i in tl.static_range(BLOCKS):
            block = p * BLOCKS + i
            n, offs_c, i0, i1, i2, mask = voxel_block_at(block, S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
            x = tl.load(x_ptr + offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2), mask=mask, other=0.0)
            if PRE_BIAS:  # a convolution's bias, added and rounded as its own pass would have
                pb = tl.load(pb_ptr + offs_c).to(tl.float32)
                x = tl.where(mask, (x.to(tl.float32) + pb[None, :]).to(x_ptr.dtype.element_ty), 0.0)
            x = tl.reshape(x.to(tl.float32), (BLOCK_S, G, BLOCK_C // G))
            rows = tl.minimum(tl.maximum(S - block * BLOCK_S, 0), BLOCK_S)
            size = (rows * (BLOCK_C // G)).to(tl.float32)
            block_mean = tl.sum(tl.sum(x, axis=2), axis=0) / tl.maximum(size, 1.0)  # (G,)
            valid = tl.reshape(mask, (BLOCK_S, G, BLOCK_C // G))
            d = tl.where(valid, x - block_mean[None, :, None], 0.0)
            block_m2 = tl.sum(tl.sum(d * d, axis=2), axis=0)
            total = count + size
            share = size / tl.maximum(total, 1.0)
            delta = block_mean - mean
            mean = mean + delta * share
            m2 = m2 + block_m2 + delta * delta * (count * share)
            count = total
        at = (n * P + p) * G + tl.arange(0, G)
        tl.store(sum_ptr + at, mean * count)
        tl.store(m2_ptr + at, m2)

    @triton.jit
    def _apply_kernel(
        x_ptr,
        y_ptr,
        a_ptr,
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
        syn,
        syc,
        sy0,
        sy1,
        sy2,
        m_ptr,
        k_ptr,
        smn,
        smc,
        sm0,
        sm1,
        sm2,
        BH,
        BW,
        pb_ptr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        SILU: tl.constexpr,
        CONDITIONED: tl.constexpr,
        PRE_BIAS: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        # y = silu?(x * a + b), a and b per (sample, channel) in fp32; rounded as GroupNorm's output is,
        # then (CONDITIONED) times m and plus k, each rounded, m and k of the map's frames at a
        # (BH, BW)-th of its rows and columns (a block of the map per entry), then as the SiLU's
        dt = y_ptr.dtype.element_ty
        n, offs_c, i0, i1, i2, mask = voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
        x = tl.load(x_ptr + offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2), mask=mask, other=0.0)
        if PRE_BIAS:  # as in _partials_kernel
            x = (x.to(tl.float32) + tl.load(pb_ptr + offs_c).to(tl.float32)[None, :]).to(dt)
        a = tl.load(a_ptr + n * C + offs_c)
        b = tl.load(b_ptr + n * C + offs_c)
        y = (x.to(tl.float32) * a[None, :] + b[None, :]).to(dt).to(tl.float32)
        if CONDITIONED:
            at = offsets(n, offs_c, i0, i1 // BH, i2 // BW, smn, smc, sm0, sm1, sm2)
            m = tl.load(m_ptr + at, mask=mask, other=0.0).to(tl.float32)
            y = (y * m).to(dt).to(tl.float32)
            k = tl.load(k_ptr + at, mask=mask, other=0.0).to(tl.float32)
            y = (y + k).to(dt).to(tl.float32)
        if SILU:  # y * sigmoid(y), exp(-y) as 2^(-y log2 e)
            y = y / (1.0 + tl.math.exp2(y * -1.4426950408889634))
        tl.store(y_ptr + offsets(n, offs_c, i0, i1, i2, syn, syc, sy0, sy1, sy2), y.to(dt), mask=mask)


def takes(x: torch.Tensor, num_groups: int) -> bool:
    """Whether the kernels take `x` with `num_groups` groups (module docstring); else `group_norm`
    runs PyTorch's steps."""
    c = x.shape[1] if x.dim() >= 2 else 0
    per = c // num_groups if num_groups else 0
    return (
        runs_on(x)
        and x.numel() > 0
        and spatial_strides(x) is not None
        and c >= num_groups > 0
        and c % num_groups == 0
        and c & (c - 1) == 0
        and per & (per - 1) == 0
        and c <= ELEMENTS
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    silu: bool,
    out: torch.Tensor | None = None,
    conditioning: tuple[torch.Tensor, torch.Tensor] | None = None,
    reduce=None,
    pre_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """silu?(F.group_norm(x, num_groups, weight, bias, eps) [* m + k]), each step rounded to x's dtype
    as PyTorch's separate operations round, into a new tensor in x's memory format or into `out`
    (x's shape and dtype, any strides, not overlapping x); the tensor written is returned.
    `conditioning` (m, k): 5-D, x's samples, channels and frames, and rows and columns that x's are a
    whole multiple of, each entry standing for its block of x (CogVideoX's spatial norm, whose
    conditioning is nearest-interpolated to x: fast/producers.py). `reduce`, where x is a rank's part
    of a sharded map: sums a small float64 tensor over the ranks in place (one all-reduce), so the
    statistics are the whole map's; with PyTorch's steps, `reduce` must be None. `pre_bias` (one value
    per channel, x's dtype): added to x first and rounded, as the bias pass of the convolution that
    made x would have (its output left without it: fast/residual_blocks.py)."""
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"group_norm: out must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(out.shape)}")
    if conditioning is not None:
        m, k = conditioning
        blocks = [a // b if b and a % b == 0 else 0 for a, b in zip(x.shape[3:], m.shape[3:])]
        if x.dim() != 5 or m.shape != k.shape or m.stride() != k.stride() or m.shape[:3] != x.shape[:3] or 0 in blocks:
            raise ValueError(f"group_norm: conditioning of {tuple(m.shape)} does not block {tuple(x.shape)}")
    if not takes(x, num_groups):
        if reduce is not None:
            raise ValueError("group_norm: a sharded map's statistics need the kernels (group_norm.takes)")
        if pre_bias is not None:
            x = x + pre_bias.reshape(1, -1, *([1] * (x.dim() - 2)))
        # (channels-first: PyTorch's CPU GroupNorm of a channels-last map loses digits where the mean is
        # far from zero; its CUDA GroupNorm makes that copy itself)
        y = F.group_norm(x.contiguous(), num_groups, weight, bias, eps)
        if conditioning is not None:
            (bh, bw), (m, k) = blocks, conditioning
            y = y * m.repeat_interleave(bh, dim=3).repeat_interleave(bw, dim=4)
            y = y + k.repeat_interleave(bh, dim=3).repeat_interleave(bw, dim=4)
        y = F.silu(y) if silu else y
        return y if out is None else out.copy_(y)
    if pre_bias is not None and (pre_bias.shape != (x.shape[1],) or pre_bias.dtype != x.dtype):
        raise ValueError(f"group_norm: pre_bias must be ({x.shape[1]},) {x.dtype}, got {tuple(pre_bias.shape)}")
    scale, shift = _scale_shift(x, num_groups, weight, bias, eps, reduce, pre_bias)
    y = torch.empty_like(x) if out is None else out
    _apply(x, y, scale, shift, silu, conditioning, pre_bias)
    return y


def _tile(c: int) -> int:
    return max(1, ELEMENTS // c)


# Tiles each `_partials_kernel` program reads, by the tiles of the whole map: one where the map has
# too few to keep every SM busy otherwise, up to PARTIAL_BLOCKS, so that a large map's partial
# statistics (which the host combines in float64, pass by pass) are that many times fewer.
PARTIAL_BLOCKS = 8
_BUSY_TILES = 8192  # tiles of a map at which each program takes two


def _blocks_per_program(tiles: int) -> int:
    blocks = 1
    while blocks < PARTIAL_BLOCKS and tiles >= _BUSY_TILES * blocks:
        blocks *= 2
    return blocks


def _scale_shift(x: torch.Tensor, num_groups: int, weight, bias, eps: float, reduce=None, pre_bias=None):
    """(scale, shift), (N, C) fp32 each: GroupNorm's statistics of `x` folded with its weight and bias.
    `reduce`: sums a float64 tensor over the ranks holding the rest of the map, in place (a sharded
    request's whole-map statistics)."""
    count, mean, m2 = _local_statistics(x, num_groups, pre_bias)
    if reduce is None:
        var = m2 / count
    else:
        # one all-reduce of (sum, sum of squares about zero, count): each rank's squares come from its
        # deviations, so in float64 nothing cancels unless the mean exceeds the spread by about 1e7
        stats = reduce(torch.stack([mean * count, m2 + mean.square() * count, count]))
        count = stats[2]
        mean = stats[0] / count
        var = stats[1] / count - mean.square()
    rstd = (var.clamp_min(0) + eps).rsqrt()
    # PyTorch's fold: scale = rstd * weight, shift = bias - mean * scale, per (sample, channel), in fp32
    per = x.shape[1] // num_groups
    rstd_c = rstd.float().repeat_interleave(per, dim=1)
    mean_c = mean.float().repeat_interleave(per, dim=1)
    scale = rstd_c if weight is None else rstd_c * weight.float()[None, :]
    shift = -mean_c * scale
    if bias is not None:
        shift = shift + bias.float()[None, :]
    return scale.contiguous(), shift.contiguous()


def _local_statistics(x: torch.Tensor, num_groups: int, pre_bias=None):
    """(count, mean, sum of squared deviations), (N, G) float64 each, of this tensor's part of the map:
    `_partials_kernel`'s blocks combined by Chan's formula."""
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = spatial_strides(x)
    s = d0 * d1 * d2
    block_s = _tile(c)
    blocks = _blocks_per_program(n * triton.cdiv(s, block_s))
    programs = triton.cdiv(s, block_s * blocks)
    sums = torch.empty(n, programs, num_groups, dtype=torch.float32, device=x.device)
    m2 = torch.empty_like(sums)
    launch(
        _partials_kernel,
        (programs, n),
        x,
        sums,
        m2,
        s,
        c,
        d1,
        d2,
        sxn,
        sxc,
        sx0,
        sx1,
        sx2,
        programs,
        sums if pre_bias is None else pre_bias,  # (a pointer the kernel never reads without it)
        BLOCK_S=block_s,
        BLOCK_C=c,
        G=num_groups,
        BLOCKS=blocks,
        PRE_BIAS=pre_bias is not None,
        WIDE=wide(x),
        num_warps=NUM_WARPS,
    )
    per = c // num_groups
    counts = torch.full((programs,), blocks * block_s * per, dtype=torch.float64, device=x.device)
    counts[-1] = (s - (programs - 1) * blocks * block_s) * per
    sums, m2 = sums.double(), m2.double()
    total = s * per
    mean = sums.sum(1) / total  # (N, G)
    block_means = sums / counts[None, :, None]
    m2 = m2.sum(1) + (counts[None, :, None] * (block_means - mean[:, None, :]).square()).sum(1)
    return torch.full_like(mean, float(total)), mean, m2


def _apply(x, y, scale, shift, silu: bool, conditioning, pre_bias=None) -> None:
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = spatial_strides(x)
    _, _, _, (syn, syc, sy0, sy1, sy2) = spatial_strides(y)
    s = d0 * d1 * d2
    block_s = _tile(c)
    if conditioning is None:
        m = k = scale  # pointers the kernel never reads
        strides, bh, bw = (0, 0, 0, 0, 0), 1, 1
    else:
        m, k = conditioning
        strides, bh, bw = m.stride(), d1 // m.shape[3], d2 // m.shape[4]
    launch(
        _apply_kernel,
        (triton.cdiv(s, block_s), n),
        x,
        y,
        scale,
        shift,
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
        m,
        k,
        *strides,
        bh,
        bw,
        scale if pre_bias is None else pre_bias,
        BLOCK_S=block_s,
        BLOCK_C=c,
        SILU=silu,
        CONDITIONED=conditioning is not None,
        PRE_BIAS=pre_bias is not None,
        WIDE=wide(x, y) if conditioning is None else wide(x, y, m),
        num_warps=NUM_WARPS,
    )
