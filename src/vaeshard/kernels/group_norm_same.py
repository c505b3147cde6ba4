"""PyTorch's CUDA GroupNorm, the same arithmetic in the same order, with more of the map in flight.

PyTorch's forward (ATen's cuda/group_norm_kernel.cu) gives each (sample, group) row of R = C/G * T*H*W
elements one block of L threads (L = 512, or 32 where R < 512). Thread t folds elements t, t + L,
t + 2L, ... into a Welford state (mean, m2, count) one after another; the block then combines the L
states by a warp shuffle-down tree (offsets 16 to 1), the 16 warps' results through shared memory
into warp 0's tree; var = m2 / count, rstd = rsqrt(var + eps) with eps cast to the input dtype; a
per-channel fold a = rstd * gamma, b = -a * mean + beta; and y = a * x + b in fp32, rounded to the
input dtype. Each thread has one load in flight, and 32 rows of 512 threads is all a typical decoder
map gives it: its statistics pass runs at a small fraction of the memory's bandwidth, and in an image
VAE's decode it takes about half of the GPU time (BENCHMARKS.md).

Here the same L chains run, each in its own lane, the next `WIDTH` elements loaded while `WIDTH` are
folded, `LANES` lanes per program, so that every SM has work; `_tree_kernel` then combines the L states in the same
tree. Where nvcc contracts a multiply and an add into one fused multiply-add (FMA), these kernels use
`tl.fma` and compile with contraction off otherwise, so each rounding is PyTorch's. The result is
PyTorch's output bit for bit; `agrees` checks that on the device before any request relies on it (a
PyTorch version whose kernel differs is then left to run its own), and the GPU parity benchmark
compares whole decodes with diffusers'. PyTorch before 2.12 rounds a bf16 or fp16 map's mean and
rstd to that dtype between its statistics and its fold; `agrees` finds which of the two it does.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.nn.functional as F

from .triton_support import launch, runs_on, tl, triton

LANES = 64  # chains per program of `_chains_kernel`
WIDTH = 16  # elements a lane of `_chains_kernel` folds per step (8, 16 or 32), the next as many loaded ahead
APPLY_BLOCK = 1024  # elements of one channel per program of `_apply_kernel`
_BIG = 512  # PyTorch's threads per row (cuda_utils::kCUDABlockReduceNumThreads); 32 below it

if triton is not None:
    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - older layouts
        from triton.language.extra.cuda import libdevice

    @triton.jit
    def _fold(x, mean, m2, n, ok):
        # WelfordOps::reduce: new_mean = mean + (x - mean) / (n + 1); m2 + delta * (x - new_mean), one FMA
        nn = n + 1.0
        delta = x - mean
        new_mean = mean + tl.math.div_rn(delta, nn)
        new_m2 = tl.fma(delta, x - new_mean, m2)
        return tl.where(ok, new_mean, mean), tl.where(ok, new_m2, m2), tl.where(ok, nn, n)

    @triton.jit
    def _tile(base, j, R, THREADS: tl.constexpr, WIDTH: tl.constexpr, bias_at, HW, PRE_BIAS: tl.constexpr):
        # each lane's next WIDTH elements, j, j + THREADS, ..., in one load (0 past the row's end); with
        # PRE_BIAS, each plus its channel's bias (bias_at: the row's first channel's) rounded to the dtype
        at = j[:, None] + tl.arange(0, WIDTH)[None, :] * THREADS
        ok = at < R
        v = tl.load(base + at, mask=ok, other=0.0)
        if PRE_BIAS:
            b = tl.load(bias_at + at // HW, mask=ok, other=0.0).to(tl.float32)
            v = tl.where(ok, (v.to(tl.float32) + b).to(v.dtype), 0.0)
        return v.to(tl.float32)

    @triton.jit
    def _fold8(xs, mean, m2, n, j, R, THREADS: tl.constexpr):
        # the 8 columns of xs (LANES, 8), elements j, j + THREADS, ..., folded in that order (those past
        # the row's end left out); the columns taken apart by splits: u = 4a + 2b + c in (LANES, 2, 2, 2)
        c0, c1 = tl.split(tl.reshape(xs, [xs.shape[0], 2, 2, 2]))
        b0c0, b1c0 = tl.split(c0)
        b0c1, b1c1 = tl.split(c1)
        x0, x4 = tl.split(b0c0)
        x2, x6 = tl.split(b1c0)
        x1, x5 = tl.split(b0c1)
        x3, x7 = tl.split(b1c1)
        mean, m2, n = _fold(x0, mean, m2, n, j < R)
        mean, m2, n = _fold(x1, mean, m2, n, j + THREADS < R)
        mean, m2, n = _fold(x2, mean, m2, n, j + 2 * THREADS < R)
        mean, m2, n = _fold(x3, mean, m2, n, j + 3 * THREADS < R)
        mean, m2, n = _fold(x4, mean, m2, n, j + 4 * THREADS < R)
        mean, m2, n = _fold(x5, mean, m2, n, j + 5 * THREADS < R)
        mean, m2, n = _fold(x6, mean, m2, n, j + 6 * THREADS < R)
        return _fold(x7, mean, m2, n, j + 7 * THREADS < R)

    @triton.jit
    def _fold_tile(xs, mean, m2, n, j, R, THREADS: tl.constexpr, WIDTH: tl.constexpr):
        # a (LANES, WIDTH) tile's columns in order, 8 at a time
        L: tl.constexpr = xs.shape[0]
        if WIDTH == 8:
            mean, m2, n = _fold8(xs, mean, m2, n, j, R, THREADS)
        elif WIDTH == 16:  # u = 8a + r: (LANES, 2, 8) -> (LANES, 8, 2), split on a
            lo, hi = tl.split(tl.permute(tl.reshape(xs, [L, 2, 8]), (0, 2, 1)))
            mean, m2, n = _fold8(lo, mean, m2, n, j, R, THREADS)
            mean, m2, n = _fold8(hi, mean, m2, n, j + 8 * THREADS, R, THREADS)
        else:  # WIDTH 32, u = 16a + 8b + r: (LANES, 2, 2, 8) -> (LANES, 8, 2, 2), split on b, then a
            b0, b1 = tl.split(tl.permute(tl.reshape(xs, [L, 2, 2, 8]), (0, 3, 1, 2)))
            a0b0, a1b0 = tl.split(b0)
            a0b1, a1b1 = tl.split(b1)
            mean, m2, n = _fold8(a0b0, mean, m2, n, j, R, THREADS)
            mean, m2, n = _fold8(a0b1, mean, m2, n, j + 8 * THREADS, R, THREADS)
            mean, m2, n = _fold8(a1b0, mean, m2, n, j + 16 * THREADS, R, THREADS)
            mean, m2, n = _fold8(a1b1, mean, m2, n, j + 24 * THREADS, R, THREADS)
        return mean, m2, n

    @triton.jit
    def _chains_kernel(
        x_ptr,
        mean_ptr,
        m2_ptr,
        n_ptr,
        R,
        bias_ptr,  # (with HW, GROUPS: where PRE_BIAS, the bias added to each element as it is read)
        HW,
        GROUPS,
        THREADS: tl.constexpr,
        LANES: tl.constexpr,
        WIDTH: tl.constexpr,
        PRE_BIAS: tl.constexpr,
    ):
        # each lane's chain WIDTH elements at a time, the next WIDTH loaded before these are folded: a
        # chain is a sequence of dependent divisions, so its loads must be issued well ahead of their use
        row = tl.program_id(0)
        lane = tl.program_id(1) * LANES + tl.arange(0, LANES)
        mean = tl.zeros([LANES], tl.float32)
        m2 = tl.zeros([LANES], tl.float32)
        n = tl.zeros([LANES], tl.float32)
        base = x_ptr + row.to(tl.int64) * R
        bias_at = bias_ptr + (row % GROUPS) * (R // HW)  # the row's first channel's bias
        STEP: tl.constexpr = THREADS * WIDTH
        cur = _tile(base, lane, R, THREADS, WIDTH, bias_at, HW, PRE_BIAS)
        for start in range(0, R, STEP):
            j = start + lane
            nxt = _tile(base, j + STEP, R, THREADS, WIDTH, bias_at, HW, PRE_BIAS)
            mean, m2, n = _fold_tile(cur, mean, m2, n, j, R, THREADS, WIDTH)
            cur = nxt
        at = row * THREADS + lane
        tl.store(mean_ptr + at, mean)
        tl.store(m2_ptr + at, m2)
        tl.store(n_ptr + at, n)

    @triton.jit
    def _combine(am, a2, an, bm, b2, bn):
        # WelfordOps::combine (a state with no elements gives the other), its two FMAs as nvcc makes them
        delta = bm - am
        count = an + bn
        nb = tl.math.div_rn(bn, tl.where(count == 0, 1.0, count))
        mean = tl.fma(delta, nb, am)
        m2 = tl.fma(delta * delta * an, nb, a2 + b2)
        mean = tl.where(an == 0, bm, tl.where(bn == 0, am, mean))
        m2 = tl.where(an == 0, b2, tl.where(bn == 0, a2, m2))
        return mean, m2, count

    @triton.jit
    def _shuffle_down(m, m2, n, W: tl.constexpr, L: tl.constexpr):
        # [W, L] -> [W, L // 2]: lane i combined with lane i + L // 2 in each of W warps
        m = tl.permute(tl.reshape(m, [W, 2, L // 2]), (0, 2, 1))
        m2 = tl.permute(tl.reshape(m2, [W, 2, L // 2]), (0, 2, 1))
        n = tl.permute(tl.reshape(n, [W, 2, L // 2]), (0, 2, 1))
        am, bm = tl.split(m)
        a2, b2 = tl.split(m2)
        an, bn = tl.split(n)
        return _combine(am, a2, an, bm, b2, bn)

    @triton.jit
    def _warp_tree(m, m2, n, W: tl.constexpr):
        # cuda_utils::WarpReduce in each of W warps: offsets 16, 8, 4, 2, 1 -> [W, 1]
        m, m2, n = _shuffle_down(m, m2, n, W, 32)
        m, m2, n = _shuffle_down(m, m2, n, W, 16)
        m, m2, n = _shuffle_down(m, m2, n, W, 8)
        m, m2, n = _shuffle_down(m, m2, n, W, 4)
        return _shuffle_down(m, m2, n, W, 2)

    @triton.jit
    def _tree_kernel(mean_ptr, m2_ptr, n_ptr, stats_ptr, eps, THREADS: tl.constexpr, LIBDEVICE: tl.constexpr):
        row = tl.program_id(0)
        at = row * THREADS + tl.arange(0, THREADS)
        W: tl.constexpr = THREADS // 32
        m = tl.reshape(tl.load(mean_ptr + at), [W, 32])
        m2 = tl.reshape(tl.load(m2_ptr + at), [W, 32])
        n = tl.reshape(tl.load(n_ptr + at), [W, 32])
        m, m2, n = _warp_tree(m, m2, n, W)
        if W > 1:
            # cuda_utils::BlockReduce: the W warps' results in warp 0's lanes, identities above them; its
            # offset-16 step meets only identities, then offsets 8..1 (W = 16)
            m = tl.reshape(m, [1, W])
            m2 = tl.reshape(m2, [1, W])
            n = tl.reshape(n, [1, W])
            m, m2, n = _shuffle_down(m, m2, n, 1, 16)
            m, m2, n = _shuffle_down(m, m2, n, 1, 8)
            m, m2, n = _shuffle_down(m, m2, n, 1, 4)
            m, m2, n = _shuffle_down(m, m2, n, 1, 2)
        var = tl.math.div_rn(tl.sum(m2, axis=1), tl.sum(n, axis=1))
        if LIBDEVICE:
            rstd = libdevice.rsqrt(var + eps)
        else:  # (Triton's interpreter has no libdevice)
            rstd = tl.math.rsqrt(var + eps)
        one = tl.arange(0, 1)
        tl.store(stats_ptr + row * 2 + one, tl.sum(m, axis=1))
        tl.store(stats_ptr + row * 2 + 1 + one, rstd)

    @triton.jit
    def _apply_kernel(
        x_ptr,
        y_ptr,
        stats_ptr,
        w_ptr,
        b_ptr,
        C,
        HW,
        PER,
        H_OUT,  # (to s_w: y's last two sizes and its strides, where y is a strided view)
        W_OUT,
        s_n,
        s_c,
        s_t,
        s_h,
        s_w,
        scale_ptr,  # (with shift_ptr: contiguous maps of x's shape, or of its blocks, where COND)
        shift_ptr,
        COND_H,  # (to BW, where BLOCKED: the maps' rows and columns, each value a BH x BW block of x's)
        COND_W,
        BH,
        BW,
        pre_bias_ptr,  # (where PRE_BIAS: one value per channel, added to x as it is read, rounded)
        STRIDED: tl.constexpr,
        COND: tl.constexpr,
        BLOCKED: tl.constexpr,
        HAS_W: tl.constexpr,
        HAS_B: tl.constexpr,
        SILU: tl.constexpr,
        BLOCK: tl.constexpr,
        LIBDEVICE: tl.constexpr,
        ROUNDED_STATS: tl.constexpr,
        PRE_BIAS: tl.constexpr,
    ):
        # ComputeFusedParamsCUDAKernel's fold, then a * x + b (one FMA each), rounded to the dtype; SiLU
        # of that (PyTorch's x / (1 + exp(-x)) in fp32, rounded again) where the norm's SiLU is fused
        nc = tl.program_id(1)
        c = nc % C
        g = nc // PER  # the (sample, group) row
        mean = tl.load(stats_ptr + g * 2)
        rstd = tl.load(stats_ptr + g * 2 + 1)
        if ROUNDED_STATS:  # PyTorch before 2.12 keeps the statistics in the input dtype in between
            mean = mean.to(y_ptr.dtype.element_ty).to(tl.float32)
            rstd = rstd.to(y_ptr.dtype.element_ty).to(tl.float32)
        a = rstd * tl.load(w_ptr + c).to(tl.float32) if HAS_W else rstd
        beta = tl.load(b_ptr + c).to(tl.float32) if HAS_B else tl.zeros_like(rstd)  # (+0, as PyTorch adds)
        b = tl.fma(-a, mean, beta)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < HW
        at = nc.to(tl.int64) * HW + offs
        dt = y_ptr.dtype.element_ty
        v = tl.load(x_ptr + at, mask=ok, other=0.0)
        if PRE_BIAS:  # the bias pass PyTorch would have made: x + bias, rounded to the dtype
            v = (v.to(tl.float32) + tl.load(pre_bias_ptr + c).to(tl.float32)).to(dt)
        y = tl.fma(a, v.to(tl.float32), b).to(dt)
        if COND:  # y * scale + shift as two of PyTorch's elementwise passes, each rounded to the dtype
            cat = at
            if BLOCKED:  # the value of the block holding element (t, h, w) of this channel
                o = offs.to(tl.int64)
                row = (o // (COND_W * BW)) % (COND_H * BH)
                t = o // (COND_W * BW * COND_H * BH)
                col = o % (COND_W * BW)
                cat = nc.to(tl.int64) * (HW // (BH * BW)) + (t * COND_H + row // BH) * COND_W + col // BW
            y = (y.to(tl.float32) * tl.load(scale_ptr + cat, mask=ok, other=0.0).to(tl.float32)).to(dt)
            y = (y.to(tl.float32) + tl.load(shift_ptr + cat, mask=ok, other=0.0).to(tl.float32)).to(dt)
        if SILU:
            yf = y.to(tl.float32)
            if LIBDEVICE:
                e = libdevice.exp(-yf)
            else:
                e = tl.exp(-yf)
            y = tl.math.div_rn(yf, 1.0 + e).to(dt)
        if STRIDED:  # y a view (a padded buffer's interior): element (n, c, t, h, w) at its strides
            o = offs.to(tl.int64)
            w = o % W_OUT
            h = (o // W_OUT) % H_OUT
            t = o // (W_OUT * H_OUT)
            at = (nc // C).to(tl.int64) * s_n + c.to(tl.int64) * s_c + t * s_t + h * s_h + w * s_w
        tl.store(y_ptr + at, y, mask=ok)


def takes(x: torch.Tensor, num_groups: int, copy: bool = False) -> bool:
    """Whether the kernels take `x` (with `copy`: a contiguous copy of it): a contiguous (N, C, ...)
    map of 3 to 5 dims in fp32, bf16 or fp16 whose C divides into `num_groups` groups, each row short
    enough for a chain's fp32 count."""
    if x.dim() not in (3, 4, 5) or not runs_on(x) or not (copy or x.is_contiguous()) or x.numel() == 0:
        return False
    c = x.shape[1]
    if num_groups <= 0 or c % num_groups or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    return x.numel() // (x.shape[0] * num_groups) < 2**31 and x.numel() < 2**62


def statistics(
    x: torch.Tensor, num_groups: int, eps: float, pre_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, rstd), fp32 (N * num_groups,) each: PyTorch's per-row statistics, as its kernel computes
    them (the module docstring); `takes(x, num_groups)` must hold. `pre_bias`: those of x plus it (one
    value per channel, x's dtype), each sum rounded to the dtype as PyTorch's bias pass rounds it."""
    stats = _statistics(x, num_groups, eps, pre_bias)
    return stats[:, 0], stats[:, 1]


@functools.lru_cache(maxsize=64)
def _eps_in(eps: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(eps, dtype=dtype))  # PyTorch casts eps to the input dtype first


def _on(device: torch.device):
    """The context that makes `device` current for Triton's launches (which go to the current CUDA
    device): a VAE may sit on another GPU than the current one."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _statistics(x: torch.Tensor, num_groups: int, eps: float, pre_bias: torch.Tensor | None = None) -> torch.Tensor:
    """`statistics` as one fp32 (N * num_groups, 2) tensor of (mean, rstd) rows."""
    _check_pre_bias(x, pre_bias)
    rows = x.shape[0] * num_groups
    r = x.numel() // rows
    threads = _BIG if r >= _BIG else 32
    lanes = min(LANES, threads)
    mean, m2, count = torch.empty(3, rows * threads, dtype=torch.float32, device=x.device)  # each lane's state
    fused = {"enable_fp_fusion": False}  # every FMA is a tl.fma: PyTorch's, and no other
    grid = (rows, threads // lanes)
    launch(
        _chains_kernel,
        grid,
        x,
        mean,
        m2,
        count,
        r,
        x if pre_bias is None else pre_bias,  # (a pointer the kernel never reads without PRE_BIAS)
        x[0, 0].numel(),
        num_groups,
        THREADS=threads,
        LANES=lanes,
        WIDTH=WIDTH,
        PRE_BIAS=pre_bias is not None,
        num_warps=max(1, lanes // 32),
        **fused,
    )
    stats = torch.empty(rows, 2, dtype=torch.float32, device=x.device)
    launch(
        _tree_kernel,
        (rows,),
        mean,
        m2,
        count,
        stats,
        _eps_in(eps, x.dtype),
        THREADS=threads,
        LIBDEVICE=x.is_cuda,
        num_warps=threads // 32,
        **fused,
    )
    return stats


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight,
    bias,
    eps: float,
    silu: bool = False,
    rounded_stats: bool | None = None,
    out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    pre_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.group_norm(x, num_groups, weight, bias, eps), then F.silu of it where `silu`, as PyTorch's CUDA
    kernels compute them (the module docstring); `takes(x, num_groups)` must hold. `rounded_stats`:
    whether the mean and rstd pass through x's dtype before the fold, as PyTorch's kernel before 2.12
    does with bf16 and fp16 input (None: as `agrees` found PyTorch doing on x's device; else not).
    `out`: where to write the result (x's shape and dtype, any strides: the interior of a convolution's
    padded input, say), returned; else a new tensor. `scale`, `shift` (both or neither: contiguous maps
    of x's dtype, of x's shape or (N, C, T, h, w) for a 5-D x of (N, C, T, h * bh, w * bw), each value
    then standing for a bh x bw block of x): the norm's output times `scale` plus `shift` before the
    SiLU, each step rounded as PyTorch's `norm * scale + shift` rounds it (CogVideoX's spatial norm).
    `pre_bias` (one value per channel, x's dtype): the norm of x plus it, each sum rounded to the dtype
    as PyTorch's bias pass rounds it (the bias of the convolution that made x, which left it out)."""
    if rounded_stats is None:
        rounded_stats = _verdicts.get(_key(x.device, x.dtype)) == _ROUNDED
    n, c = x.shape[:2]
    hw = x[0, 0].numel()
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"group_norm: out {tuple(out.shape)} {out.dtype} does not match x {tuple(x.shape)} {x.dtype}")
    cond = scale is not None or shift is not None
    blocks = _blocks(x, scale) if cond else None
    if cond and (
        not all(
            t is not None and t.shape == scale.shape and t.dtype == x.dtype and t.is_contiguous()
            for t in (scale, shift)
        )
        or (scale.shape != x.shape and blocks is None)
    ):
        raise ValueError(
            "group_norm: scale and shift must both be contiguous maps of x's dtype and of x's shape or its blocks'"
        )
    cond_sizes = (scale.shape[3], scale.shape[4], *blocks) if blocks else (1, 1, 1, 1)
    y = torch.empty_like(x) if out is None else out
    strided = not y.is_contiguous()
    # y's (h, w) sizes and (n, c, t, h, w) strides, missing spatial axes of size 1
    sizes = ((1,) * (5 - y.dim()) + tuple(y.shape[2:]))[1:] if strided else (1, 1)
    strides = y.stride()[:2] + (0,) * (5 - y.dim()) + y.stride()[2:] if strided else (0,) * 5
    with _on(x.device):
        stats = _statistics(x, num_groups, eps, pre_bias)
        w = weight if weight is not None else stats  # (a pointer the kernel never reads)
        b = bias if bias is not None else stats
        launch(
            _apply_kernel,
            (triton.cdiv(hw, APPLY_BLOCK), n * c),
            x,
            y,
            stats,
            w,
            b,
            c,
            hw,
            c // num_groups,
            *sizes,
            *strides,
            scale if cond else x,  # (pointers the kernel never reads without COND)
            shift if cond else x,
            *cond_sizes,
            stats if pre_bias is None else pre_bias,
            STRIDED=strided,
            COND=cond,
            BLOCKED=blocks is not None,
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            SILU=silu,
            BLOCK=APPLY_BLOCK,
            LIBDEVICE=x.is_cuda,
            ROUNDED_STATS=rounded_stats and x.dtype != torch.float32,
            PRE_BIAS=pre_bias is not None,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return y


def _check_pre_bias(x: torch.Tensor, pre_bias: torch.Tensor | None) -> None:
    if pre_bias is not None and (
        pre_bias.shape != (x.shape[1],) or pre_bias.dtype != x.dtype or not pre_bias.is_contiguous()
    ):
        raise ValueError(f"group_norm: pre_bias must be one value per channel of x ({x.shape[1]}) in {x.dtype}")


def _blocks(x: torch.Tensor, scale: torch.Tensor) -> tuple[int, int] | None:
    """(bh, bw) where `scale` is (N, C, T, h, w) of a 5-D x (N, C, T, h * bh, w * bw) other than x's
    own shape, else None."""
    if scale is None or scale.shape == x.shape or x.dim() != 5 or scale.dim() != 5 or scale.shape[:3] != x.shape[:3]:
        return None
    (h, w), (big_h, big_w) = scale.shape[3:], x.shape[3:]
    if h < 1 or w < 1 or big_h % h or big_w % w:
        return None
    return big_h // h, big_w // w


# --- the check on the device ----------------------------------------------------------------------

# Maps that take both of PyTorch's block sizes, rows that are and are not a multiple of 512, a count
# of elements per lane that is not a multiple of the step width, and 3- to 5-D shapes.
_CHECK_SHAPES = ((2, 64, 24, 40), (1, 32, 3, 5, 7), (1, 128, 3, 41, 37), (3, 96, 100))
_verdicts: dict = {}  # (device type, index, dtype) -> False, _FLOAT or _ROUNDED
_FLOAT, _ROUNDED = "float", "rounded"  # PyTorch's statistics between its kernels: as they are, or rounded
# GroupNorm; + SiLU; * scale + shift, then SiLU (CogVideoX's); of x plus a per-channel bias, then SiLU;
# both of the last two
VARIANTS = ("plain", "silu", "scaled", "biased", "scaled-biased")
_variant_verdicts: dict = {}  # (device type, index, dtype, variant) -> bool
_lock = threading.Lock()


def agrees(device: torch.device, dtype: torch.dtype, variant: str = "plain") -> bool:
    """Whether these kernels give PyTorch's CUDA GroupNorm bit for bit on the CUDA `device` in `dtype`, as
    `variant` (VARIANTS) applies it: GroupNorm alone, then SiLU, times a scale plus a shift and then
    SiLU, of x plus a per-channel bias (rounded) and then SiLU, or both. Checked once per device and dtype
    on small random maps (a few milliseconds once the kernels are compiled), with the statistics
    kept in fp32 between the kernels and, failing that, rounded to the dtype (PyTorch before 2.12);
    each variant after GroupNorm alone agrees, once, with the same statistics; never during a CUDA
    graph capture (False there until checked outside). A variant that disagrees leaves the others
    running."""
    if device.type != "cuda":  # (PyTorch's CPU GroupNorm sums in another order)
        return False
    if variant not in VARIANTS:
        raise ValueError(f"agrees: variant is one of {VARIANTS}, not {variant!r}")
    key = _key(device, dtype)
    verdict, done = _verdicts.get(key), _variant_verdicts.get((*key, variant))
    if verdict is not None and (not verdict or variant == "plain" or done is not None):
        return bool(verdict) and (variant == "plain" or bool(done))
    if torch.cuda.is_current_stream_capturing():
        return False
    with _lock, _on(torch.device(device.type, key[1])):
        if key not in _verdicts:
            _verdicts[key] = next((v for v in (_FLOAT, _ROUNDED) if _check(device, dtype, v == _ROUNDED)), False)
        if _verdicts[key] and variant != "plain" and (*key, variant) not in _variant_verdicts:
            _variant_verdicts[(*key, variant)] = _check(device, dtype, _verdicts[key] == _ROUNDED, variant)
    return bool(_verdicts[key]) and (variant == "plain" or _variant_verdicts[(*key, variant)])


def _key(device: torch.device, dtype: torch.dtype) -> tuple:
    """`_verdicts`' key: a CUDA device named without its index is the current one."""
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return device.type, index, dtype


def _check(device, dtype, rounded: bool, variant: str = "plain") -> bool:
    gen = torch.Generator().manual_seed(0)
    for shape in _CHECK_SHAPES:
        x = (torch.randn(shape, generator=gen) * 3 + 0.5).to(device=device, dtype=dtype)
        w = (torch.randn(shape[1], generator=gen) * 0.5 + 1).to(device=device, dtype=dtype)
        b = (torch.randn(shape[1], generator=gen) * 0.2).to(device=device, dtype=dtype)
        if variant == "plain":
            for weight, bias in ((w, b), (None, None)):
                ours = takes(x, 16) and group_norm(x, 16, weight, bias, 1e-6, rounded_stats=rounded)
                if ours is False or not torch.equal(ours, F.group_norm(x, 16, weight, bias, 1e-6)):
                    return False
        elif variant == "silu":
            fused = group_norm(x, 16, w, b, 1e-6, silu=True, rounded_stats=rounded)
            if not torch.equal(fused, F.silu(F.group_norm(x, 16, w, b, 1e-6))):
                return False
        elif variant == "biased":
            pre = (torch.randn(shape[1], generator=gen) * 2).to(device=device, dtype=dtype)
            fused = group_norm(x, 16, w, b, 1e-6, silu=True, rounded_stats=rounded, pre_bias=pre)
            biased = x + pre.reshape(1, -1, *([1] * (x.dim() - 2)))
            if not torch.equal(fused, F.silu(F.group_norm(biased, 16, w, b, 1e-6))):
                return False
        else:
            # (CogVideoX's spatial norm; drawn from the check's own generator, not the caller's)
            scale, shift = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
            pre = (torch.randn(shape[1], generator=gen) * 2).to(device=device, dtype=dtype)
            pre = pre if variant == "scaled-biased" else None
            conditioned = group_norm(x, 16, w, b, 1e-6, True, rounded, scale=scale, shift=shift, pre_bias=pre)
            x = x if pre is None else x + pre.reshape(1, -1, *([1] * (x.dim() - 2)))
            if not torch.equal(conditioned, F.silu(F.group_norm(x, 16, w, b, 1e-6) * scale + shift)):
                return False
    return True
