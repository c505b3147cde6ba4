"""Depth-to-space with a channel-repeating shortcut added, in one pass (the fast tier's upsamplers).

A DC-AE-style upsampler (HunyuanVideo 1.5's `HunyuanVideo15Upsample`) ends in

    out = d2s(y) + d2s(repeat(x))      (or repeat(d2s(x)): the same map, see below)

where `y`, the output of its convolution, packs each output voxel's phases as channel blocks:
output voxel (t * ft + i, h * fs + j, w * fs + k) of channel c is y's channel q * C + c at voxel
(t, h, w), with the phase q = (i * fs + j) * fs + k and C the output channels; and the shortcut
repeats each of x's Cin channels R = P * C / Cin times (P = ft * fs * fs phases) and moves it the same
way, so that output channel c of phase q reads x's channel (q * C + c) // R at (t, h, w). diffusers
writes it as three copies (the rearranges, the repeat) and an add over the upsampled frames, on
channels-first maps; here each output voxel's C channels are read from both sources and stored once,
channels-last. The add is PyTorch's (fp32, rounded once to the dtype), so the values are diffusers'
bits given the same `y`.
"""

from __future__ import annotations

import torch

from .triton_support import launch, runs_on, tl, triton

if triton is not None:
    from .voxels import upsampled_block


def _channels_dense(t: torch.Tensor) -> bool:
    return t.dim() == 5 and t.stride(1) == 1


def d2s_add(y: torch.Tensor, x: torch.Tensor, factor_t: int, factor_s: int) -> torch.Tensor | None:
    """The upsampled map d2s(y) + the repeated, moved x (module docstring), (N, C, T * ft, H * fs,
    W * fs) channels-last, by one Triton pass where it runs (CUDA or the interpreter) and both inputs
    are 5-D with dense channels, of one dtype and voxel grid; None elsewhere (the caller runs
    diffusers' steps)."""
    phases = factor_t * factor_s * factor_s
    n, packed, t, h, w = y.shape
    if (
        not runs_on(y)
        or y.dtype != x.dtype
        or not (_channels_dense(y) and _channels_dense(x))
        or x.shape[0] != n
        or tuple(x.shape[2:]) != (t, h, w)
        or packed % phases
        or (phases * (packed // phases)) % x.shape[1]
    ):
        return None
    c = packed // phases
    repeats = phases * c // x.shape[1]
    out = torch.empty(
        (n, c, t * factor_t, h * factor_s, w * factor_s), dtype=y.dtype, device=y.device,
        memory_format=torch.channels_last_3d,
    )  # fmt: skip
    if not out.numel():
        return out
    block_c = min(128, triton.next_power_of_2(c))
    block_v = max(1, 4096 // block_c)
    voxels = out.shape[2] * out.shape[3] * out.shape[4]
    grid = (triton.cdiv(voxels, block_v), triton.cdiv(c, block_c), n)
    so, sy, sx = out.stride(), y.stride(), x.stride()
    launch(
        _d2s_add_kernel,
        grid,
        out,
        y,
        x,
        voxels,
        c,
        out.shape[3],
        out.shape[4],
        so[0], so[2], so[3], so[4],
        sy[0], sy[2], sy[3], sy[4],
        sx[0], sx[2], sx[3], sx[4],
        FT=factor_t,
        FS=factor_s,
        R=repeats,
        BLOCK_V=block_v,
        BLOCK_C=block_c,
        num_warps=4,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _d2s_add_kernel(
        out_ptr,
        y_ptr,
        x_ptr,
        V,
        C,
        H2,
        W2,
        son,
        sot,
        soh,
        sow,
        syn,
        syt,
        syh,
        syw,
        sxn,
        sxt,
        sxh,
        sxw,
        FT: tl.constexpr,
        FS: tl.constexpr,
        R: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # a program takes BLOCK_V output voxels of sample program_id(2) and BLOCK_C channels
        # (voxels.upsampled_block: 64-bit voxel offsets, as a 720p map passes 2**31 elements over a few
        # frames); every tensor has dense channels (stride 1)
        dt = out_ptr.dtype.element_ty
        nn, c, t2, h2, w2, q, mask = upsampled_block(V, C, H2, W2, FT, FS, BLOCK_V, BLOCK_C)
        t, h, w = t2 // FT, h2 // FS, w2 // FS
        y_at = nn * syn + t * syt + h * syh + w * syw + q * C
        val = tl.load(y_ptr + y_at[:, None] + c[None, :], mask=mask, other=0.0)
        x_at = nn * sxn + t * sxt + h * sxh + w * sxw
        a = tl.load(x_ptr + x_at[:, None] + (q[:, None] * C + c[None, :]) // R, mask=mask, other=0.0)
        val = (val.to(tl.float32) + a.to(tl.float32)).to(dt)
        out_at = nn * son + t2 * sot + h2 * soh + w2 * sow
        tl.store(out_ptr + out_at[:, None] + c[None, :], val, mask=mask)
