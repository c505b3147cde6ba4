"""The fast tier's kernels for a ViT decoder's token blocks (MiniMax-H3's `MiniMaxH3VideoTransformerBlock`).

diffusers' block spends more GPU time in elementwise passes than in its matrix products: each norm
copies the residual stream to float32 and back, the residual update is a multiply and an add of its
own, and the rotary embedding is built from chunks, negations and concatenations. Three kernels replace
those passes:

- `swiglu`: the feed-forward's `hidden * silu(gate)` in one pass, rounded as diffusers' two operations.
- `residual_rms`: the residual update `h + d * scale` (float32, as diffusers promotes it) and the RMS
  norm of the result (float32, then rounded to the norm's output dtype), one read of each input and one
  write of each output. Without `d`, the norm alone (the first block's, of the input tokens).
- `qk_norm_rope`: a head's RMS norm without weights (float32, rounded to the input's dtype, as
  diffusers' `norm_q(query.float()).to(query.dtype)`), then the rotary embedding of its first
  `2 * half` channels with the cosine and sine rounded to that dtype and each product and the sum
  rounded as PyTorch's separate operations round them; the other channels pass.

What differs from diffusers: the order of the norms' sums and, in `residual_rms`, the update's
rounding (the GPU may fuse the multiply and the add). The kernels take the shapes they were written for
(module docstring of fast/token_blocks.py); anything else runs diffusers' block.
"""

from __future__ import annotations

import torch

from .triton_support import launch, runs_on, tl, triton

ROWS = 4  # tokens per program of `residual_rms`
TOKENS = 32  # tokens per program of `qk_norm_rope`
SWIGLU_BLOCK = 1024  # outputs per program of `swiglu`

if triton is not None:

    @triton.jit
    def _residual_rms_kernel(
        h_ptr,
        d_ptr,
        s_ptr,
        w_ptr,
        h_out_ptr,
        y_ptr,
        rows,
        eps,
        N: tl.constexpr,
        BLOCK_R: tl.constexpr,
        DELTA: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, N)
        mask = r[:, None] < rows
        at = r[:, None] * N + cols[None, :]
        h = tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if DELTA:  # diffusers: h + d * scale, in the dtype PyTorch promotes them to (ROUND: not float32)
            hdt = h_out_ptr.dtype.element_ty
            d = tl.load(d_ptr + at, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(s_ptr + cols).to(tl.float32)
            ds = d * s[None, :]
            if ROUND:
                ds = ds.to(hdt).to(tl.float32)
            h = h + ds
            if ROUND:
                h = h.to(hdt).to(tl.float32)
            tl.store(h_out_ptr + at, h.to(hdt), mask=mask)
        w = tl.load(w_ptr + cols).to(tl.float32)
        inv = tl.rsqrt(tl.sum(h * h, axis=1) / N + eps)
        y = h * inv[:, None] * w[None, :]
        tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(
        x_ptr,
        cos_ptr,
        sin_ptr,
        y_ptr,
        tokens,
        L,
        scn,
        sct,
        eps,
        H: tl.constexpr,
        D: tl.constexpr,
        HALF: tl.constexpr,
        HB: tl.constexpr,
        PB: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        # x, y: (tokens, H, D) contiguous; cos, sin: (N, L, 2 * HALF) float32 at strides (scn, sct, 1)
        dt = y_ptr.dtype.element_ty
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        head = tl.program_id(1)
        live = t < tokens
        row = t[:, None] * (H * D) + head * D
        j = tl.arange(0, HB)
        p = tl.arange(0, PB)
        half = live[:, None] & (j[None, :] < HALF)
        rest = live[:, None] & (p[None, :] < D - 2 * HALF)
        lo = tl.load(x_ptr + row + j[None, :], mask=half, other=0.0).to(tl.float32)
        hi = tl.load(x_ptr + row + HALF + j[None, :], mask=half, other=0.0).to(tl.float32)
        ps = tl.load(x_ptr + row + 2 * HALF + p[None, :], mask=rest, other=0.0).to(tl.float32)
        ss = tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1) + tl.sum(ps * ps, axis=1)
        inv = tl.rsqrt(ss / D + eps)[:, None]
        lo = (lo * inv).to(dt).to(tl.float32)
        hi = (hi * inv).to(dt).to(tl.float32)
        ps = (ps * inv).to(dt)
        at = (t // L) * scn + (t % L) * sct
        c_lo = tl.load(cos_ptr + at[:, None] + j[None, :], mask=half, other=0.0).to(dt).to(tl.float32)
        c_hi = tl.load(cos_ptr + at[:, None] + HALF + j[None, :], mask=half, other=0.0).to(dt).to(tl.float32)
        s_lo = tl.load(sin_ptr + at[:, None] + j[None, :], mask=half, other=0.0).to(dt).to(tl.float32)
        s_hi = tl.load(sin_ptr + at[:, None] + HALF + j[None, :], mask=half, other=0.0).to(dt).to(tl.float32)
        # diffusers: x_rot * cos + cat(-x_hi, x_lo) * sin, each product and the sum rounded
        out_lo = (lo * c_lo).to(dt).to(tl.float32) + (-hi * s_lo).to(dt).to(tl.float32)
        out_hi = (hi * c_hi).to(dt).to(tl.float32) + (lo * s_hi).to(dt).to(tl.float32)
        tl.store(y_ptr + row + j[None, :], out_lo.to(dt), mask=half)
        tl.store(y_ptr + row + HALF + j[None, :], out_hi.to(dt), mask=half)
        tl.store(y_ptr + row + 2 * HALF + p[None, :], ps, mask=rest)

    @triton.jit
    def _swiglu_kernel(x_ptr, y_ptr, n, width, BLOCK: tl.constexpr):
        # x: (rows, 2 * width) contiguous, [hidden | gate]; y: (rows, width) = hidden * silu(gate), the
        # SiLU rounded to y's dtype before the product (rounded again), as diffusers' two operations
        dt = y_ptr.dtype.element_ty
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = i < n
        row, col = i // width, i % width
        h = tl.load(x_ptr + row * (2 * width) + col, mask=live, other=0.0).to(tl.float32)
        g = tl.load(x_ptr + row * (2 * width) + width + col, mask=live, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.math.exp2(g * -1.4426950408889634))).to(dt).to(tl.float32)
        tl.store(y_ptr + i, (h * a).to(dt), mask=live)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def takes_rows(h: torch.Tensor) -> bool:
    """Whether `residual_rms` takes rows of `h` (CUDA or the interpreter, a power-of-two width)."""
    n = h.shape[-1]
    return runs_on(h) and h.is_contiguous() and n & (n - 1) == 0 and 16 <= n <= 8192


def stream_dtype(h, d, scale) -> torch.dtype:
    """The dtype of diffusers' `h + d * scale` (PyTorch's promotion)."""
    return torch.promote_types(h.dtype, torch.promote_types(d.dtype, scale.dtype))


def residual_rms(h, d, scale, weight, eps: float, out_dtype, h_out=None):
    """(h', y): h' = h + d * scale in the dtype PyTorch promotes them to (`stream_dtype`; computed in
    float32 and, for a lower one, rounded as the two operations round), or h itself where `d` is None;
    y = rms_norm(h', weight, eps) in float32, rounded to `out_dtype`. `h_out`: where h' is written (a
    contiguous tensor of h's shape and that dtype, `h` itself allowed; default: a new one)."""
    n = h.shape[-1]
    rows = h.numel() // n
    y = torch.empty(h.shape, dtype=out_dtype, device=h.device)
    if d is not None:
        dtype = stream_dtype(h, d, scale)
        if h_out is None:
            h_out = torch.empty(h.shape, dtype=dtype, device=h.device)
        elif h_out.dtype != dtype or h_out.shape != h.shape or not h_out.is_contiguous():
            raise ValueError(f"residual_rms: h_out must be contiguous, {tuple(h.shape)} and {dtype}")
        d = d.contiguous()
    launch(
        _residual_rms_kernel,
        (triton.cdiv(rows, ROWS),),
        h,
        d if d is not None else h,
        scale if scale is not None else weight,
        weight,
        h_out if d is not None else h,
        y,
        rows,
        eps,
        N=n,
        BLOCK_R=ROWS,
        DELTA=d is not None,
        ROUND=d is not None and h_out.dtype != torch.float32,
        num_warps=8,
    )
    return (h_out if d is not None else h), y


def qk_norm_rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (N, L, heads * D), a projection's output; cos, sin: (N, L, 1, R) float32, diffusers' rotary
    embedding (R <= D, even). Returns (N, L, heads, D) in x's dtype: each head RMS-normed and rotated
    as diffusers' processor does (module docstring)."""
    n, length, width = x.shape
    d = width // heads
    r = cos.shape[-1]
    x = x.contiguous()
    y = torch.empty(n, length, heads, d, dtype=x.dtype, device=x.device)
    tokens = n * length
    launch(
        _qk_norm_rope_kernel,
        (triton.cdiv(tokens, TOKENS), heads),
        x,
        cos,
        sin,
        y,
        tokens,
        length,
        cos.stride(0),
        cos.stride(1),
        eps,
        H=heads,
        D=d,
        HALF=r // 2,
        HB=_pow2(r // 2),
        PB=_pow2(max(1, d - r)),
        BLOCK_T=TOKENS,
        num_warps=4,
    )
    return y


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """diffusers' `SwiGLU` after its projection: `hidden * silu(gate)` of `x`'s two halves (last axis),
    each operation rounded to x's dtype as PyTorch's separate operations round, in one pass."""
    x = x.contiguous()
    width = x.shape[-1] // 2
    y = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
    n = y.numel()
    launch(_swiglu_kernel, (triton.cdiv(n, SWIGLU_BLOCK),), x, y, n, width, BLOCK=SWIGLU_BLOCK, num_warps=4)
    return y
