"""The 3x3 convolution of a nearest 2x upsampling, computed from the source frames by phases.

Each output voxel (2 i + p, 2 j + q) of `conv2d(upsample2x(x), w)` (stride 1, padding 1) reads
only two source rows and two source columns: on each axis, phase 0 takes the source rows i - 1 and
i with the weight taps w[0] and w[1] + w[2], phase 1 the rows i and i + 1 with w[0] + w[1] and
w[2]. So the four phases (p, q) are four 2x2 convolutions of the source, run here as one
convolution with 4 x Cout output channels (`phase_weight`) and a padding of one row and column a
side; phase (p, q) is its channel block 2 p + q, rows p ... p + h - 1, columns q ... q + w - 1. It
computes 16 products per output voxel and input channel instead of 36, the upsampled frames (four
times the source) are never made, and one pass (`interleave_phases`: a Triton kernel where it runs,
PyTorch's strided adds elsewhere) puts the phases' voxels in place and adds the bias, rounding
once, as PyTorch's bias pass after a cuDNN convolution rounds; where the upsampled frames get a
duplicating shortcut added next (Wan 2.2's up blocks), that pass adds it too (`Addend`), rounding as
the separate add would.

The values differ from the convolution of the upsampled frames by the rounding of the summed
weights to the weight's dtype and by the order of the sums (the fast tier's tolerance; the exact
tier runs diffusers' own upsampling and convolution). Where a sharded request's source has a halo
row a side on its sharded axis (the neighbours' rows, zeros at the global edges), that axis takes
no padding: the halo rows are the rows the padding would have read.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import weights
from .triton_support import launch, runs_on, tl, triton

# Per axis: the source taps (rows) of phase 0 and 1, each a sum of the 3x3 kernel's taps there.
_TAPS = (((0,), (1, 2)), ((0, 1), (2,)))


class Addend(NamedTuple):
    """A duplicating shortcut's source (Wan 2.2's `DupUp3D`) that the interleaving pass adds into the
    upsampled frames as it stores them: output voxel (sample n, channel c, frame t * factor_t + i, row
    h * factor_s + j, column w * factor_s + k) gets src[n, c * per + q // repeats, t, h, w], with q = (i
    * factor_s + j) * factor_s + k and per = factor_t * factor_s^2 / repeats (the map of
    kernels/norm.py's `add_duplicated_`), rounded once more after the bias, as the separate add
    rounds. `frames`: output frames per sample; `first`: the output frame (over samples and frames)
    the output tensor's first frame is."""

    src: torch.Tensor
    factor_t: int
    factor_s: int
    repeats: int
    frames: int
    first: int = 0


def takes_addend(like: torch.Tensor, addend: Addend) -> bool:
    """Whether the interleaving pass for output frames like `like` (channels-last, its dtype) adds
    `addend` as it stores: where the Triton kernel runs, one dtype, the source 5-D with dense
    channels, and repeats that divide the sub-voxels. Where it does, the decode measured faster than
    with the add in a pass of its own after it (docs/tuning.md, entry `kernels/phases.py
    takes_addend`)."""
    src = addend.src
    factor = addend.factor_t * addend.factor_s**2
    return (
        runs_on(like)
        and src.dtype == like.dtype
        and src.dim() == 5
        and src.stride(1) == 1
        and factor % addend.repeats == 0
    )


def takes(conv: torch.nn.Conv2d) -> bool:
    """Whether `conv` is a convolution `conv2d_by_phases` computes for an upsampled input: 3x3,
    stride 1, padding 1 (zeros), no dilation, one group."""
    return (
        tuple(conv.kernel_size) == (3, 3)
        and tuple(conv.stride) == (1, 1)
        and tuple(conv.padding) == (1, 1)
        and tuple(conv.dilation) == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
    )


def phase_weight(weight: torch.Tensor) -> torch.Tensor:
    """The (4 Cout, Cin, 2, 2) weight of the four phases of a (Cout, Cin, 3, 3) weight (channel block
    2 p + q: phase (p, q)), each tap the sum of the 3x3 taps it stands for, summed in fp64 and
    rounded once to the weight's dtype."""
    cout, cin = weight.shape[:2]
    w = weight.detach().to(torch.float64)
    out = w.new_zeros((2, 2, cout, cin, 2, 2))
    for p, rows in enumerate(_TAPS):
        for q, cols in enumerate(_TAPS):
            for a, row_taps in enumerate(rows):
                for b, col_taps in enumerate(cols):
                    out[p, q, :, :, a, b] = w[:, :, list(row_taps)][:, :, :, list(col_taps)].sum(dim=(2, 3))
    return out.reshape(4 * cout, cin, 2, 2).to(weight.dtype).contiguous(memory_format=torch.channels_last)


def cached_phase_weight(weight: torch.Tensor) -> torch.Tensor:
    """`phase_weight(weight)`, kept on the weight tensor (kernels/weights.py)."""
    return weights.kept(weight, "phases", phase_weight)


def conv2d_by_phases(
    src: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    halo: tuple[int, int] = (0, 0),
    phases: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    addend: Addend | None = None,
) -> torch.Tensor:
    """`F.conv2d(F.interpolate(src, scale_factor=2, mode="nearest"), weight, bias, padding=1)` for a
    3x3 `weight` (`takes`), by phases: a channels-last (F, Cout, 2 h, 2 w) tensor, or written into
    `out` (a tensor of that shape, say frames of a larger one), which is returned.

    `src`: (F, Cin, h + 2 halo[0], w + 2 halo[1]) frames; `halo` (0 or 1 per axis): rows (columns)
    a side that are the neighbours' source rows (a sharded axis), taken instead of padding.
    `phases`: `phase_weight(weight)`, if the caller keeps it. `addend`: added as the phases are
    interleaved (`interleave_phases`)."""
    if weight.shape[2:] != (3, 3) or src.dim() != 4 or any(h not in (0, 1) for h in halo):
        raise ValueError(
            f"conv2d_by_phases: a 3x3 weight, (F, C, H, W) frames and halos of 0 or 1, got "
            f"{tuple(weight.shape)}, {tuple(src.shape)}, {halo}"
        )
    if phases is None:
        phases = phase_weight(weight)
    padding = (1 - halo[0], 1 - halo[1])
    y = F.conv2d(src.contiguous(memory_format=torch.channels_last), phases, None, 1, padding)
    f, _, rows, cols = y.shape  # (F, 4 Cout, h + 1, w + 1)
    shape = (f, weight.shape[0], 2 * (rows - 1), 2 * (cols - 1))
    if out is None:
        out = torch.empty(shape, dtype=y.dtype, device=y.device, memory_format=torch.channels_last)
    elif tuple(out.shape) != shape:
        raise ValueError(f"conv2d_by_phases: out has the shape {tuple(out.shape)}, {shape} expected")
    return interleave_phases(y, bias, out, addend)


def interleave_phases(
    y: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, addend: Addend | None = None
) -> torch.Tensor:
    """out[f, c, 2 i + p, 2 j + q] = y[f, (2 p + q) Cout + c, i + p, j + q] + bias[c], rounded once;
    returns `out`. One Triton pass where it runs (CUDA, or the interpreter) and both tensors are
    channels-last with dense channels; else four strided adds (or copies), the same bits. `addend`
    (only where `takes_addend`; ValueError otherwise): its source added into each voxel as stored,
    rounded once more."""
    f, cout, rows2, cols2 = out.shape
    if addend is not None and not takes_addend(out, addend):
        raise ValueError("interleave_phases: the interleaving pass cannot add this addend (takes_addend)")
    if (
        runs_on(out)
        and out.numel()
        and y.dtype == out.dtype
        and out.stride(1) == 1
        and y.stride(1) == 1
        and (bias is None or bias.dtype == out.dtype)
    ):
        block_c = min(128, triton.next_power_of_2(cout))
        block_v = max(1, 4096 // block_c)
        voxels = rows2 * cols2
        grid = (triton.cdiv(voxels, block_v), triton.cdiv(cout, block_c), f)
        # (no addend: a stand-in that adds nothing, ADD=False, whose pointer and strides go unread)
        a = addend or Addend(y.unsqueeze(2), 1, 1, 1, frames=1)
        ss = a.src.stride()
        launch(
            _interleave_kernel,
            grid,
            out,
            y,
            bias if bias is not None else y,
            a.src,
            voxels,
            cout,
            cols2,
            out.stride(0),
            out.stride(2),
            out.stride(3),
            y.stride(0),
            y.stride(2),
            y.stride(3),
            a.frames,
            a.first,
            ss[0],
            ss[2],
            ss[3],
            ss[4],
            HAS_BIAS=bias is not None,
            ADD=addend is not None,
            FT=a.factor_t,
            FS=a.factor_s,
            PER=a.factor_t * a.factor_s**2 // a.repeats,
            REPEATS=a.repeats,
            BLOCK_V=block_v,
            BLOCK_C=block_c,
            num_warps=4,
        )
        return out
    if addend is not None:
        raise ValueError("interleave_phases: an addend needs the Triton pass (dense channels, one dtype)")
    rows, cols = rows2 // 2, cols2 // 2
    for p in range(2):
        for q in range(2):
            phase = y[:, (2 * p + q) * cout : (2 * p + q + 1) * cout, p : p + rows, q : q + cols]
            target = out[:, :, p::2, q::2]
            if bias is None:
                target.copy_(phase)
            else:
                torch.add(phase, bias.reshape(1, -1, 1, 1), out=target)
    return out


if triton is not None:

    @triton.jit
    def _interleave_kernel(
        out_ptr,
        y_ptr,
        b_ptr,
        s_ptr,
        V,
        C,
        W2,
        sof,
        soh,
        sow,
        syf,
        syh,
        syw,
        T2,
        FIRST,
        ssn,
        sst,
        ssh,
        ssw,
        HAS_BIAS: tl.constexpr,
        ADD: tl.constexpr,
        FT: tl.constexpr,
        FS: tl.constexpr,
        PER: tl.constexpr,
        REPEATS: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # a program takes BLOCK_V output voxels (of frame program_id(2)) and BLOCK_C channels; output
        # voxel (r, s) = (2 i + p, 2 j + q) is phase 2 p + q's voxel (i + p, j + q), both tensors with
        # dense channels (stride 1); the bias added in fp32, rounded once; with ADD, the addend's
        # source voxel (Addend) added in fp32 and rounded again
        dt = out_ptr.dtype.element_ty
        fr = tl.program_id(2).to(tl.int64)
        v = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        s = v % W2
        r = v // W2
        p = r % 2
        q = s % 2
        out_at = fr * sof + r * soh + s * sow
        y_at = fr * syf + (r // 2 + p) * syh + (s // 2 + q) * syw + (2 * p + q) * C
        mask = (v < V)[:, None] & (c < C)[None, :]
        x = tl.load(y_ptr + y_at[:, None] + c[None, :], mask=mask, other=0.0)
        if HAS_BIAS:
            b = tl.load(b_ptr + c, mask=c < C, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) + b[None, :]).to(dt)
        if ADD:
            g = FIRST + fr  # the output frame over samples and frames
            n = g // T2
            t2 = g % T2
            sv = ((t2 % FT) * FS + r % FS) * FS + s % FS  # the sub-voxel
            src_at = n * ssn + (t2 // FT) * sst + (r // FS) * ssh + (s // FS) * ssw + sv // REPEATS
            a = tl.load(s_ptr + src_at[:, None] + (c * PER)[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + a.to(tl.float32)).to(dt)
        tl.store(out_ptr + out_at[:, None] + c[None, :], x, mask=mask)
