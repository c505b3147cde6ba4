"""An experiment, not part of the library (BENCHMARKS.md, "Tried in this version and not kept"): the
3x3x3 convolution for 96 output channels as a Gluon kernel on Hopper GPUs that reads each input box
from L2 once for the three row taps.

vaeshard's Triton kernel (src/vaeshard/conv_kernel.py) loads, for each of the 27 taps, its own box
of the input, so every input voxel crosses from L2 to shared memory 27 times. Here a program
computes a patch of R rows x CW columns of one output frame (all 96 channels) and, for each (time
tap, column tap, channel step), loads one box of R + 2 rows x CW columns; the three row taps are
three views of that box, CW voxels apart, that the warp-group multiplies read directly. Gluon
(Triton's lower-level language) exposes the shared memory, the TMA copies and the multiplies; the
pipeline (STAGES boxes in flight, each step's multiplies waited for one step later) is written out.
Values: as the Triton kernel (the fp32 sum of 27 x Cin products plus the bias, rounded once; `add_to`
as its residual epilogue); no norm epilogue. Constraints met on the way: Gluon's boxes and
allocations are powers of two (the R + 2 rows take two copies and one shared buffer), and a slice
must start at a multiple of its length, so each view is a short slice reinterpreted as the longer
view, which Triton 3.6 accepts and Triton 3.9's verifier rejects.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import triton

try:  # Gluon: Triton 3.5 and later
    from triton.experimental import gluon
    from triton.runtime.jit import constexpr_function
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except Exception:  # pragma: no cover - depends on the installation
    gluon = None


class BoxPlan(NamedTuple):
    """How `conv3d` tiles a convolution: output patches of `rows` x `cols` voxels, all output
    channels as two tiles (`block_n` + `block_n2`), `block_k` input channels per step."""

    rows: int = 16
    cols: int = 16
    block_n: int = 64
    block_n2: int = 32
    block_k: int = 32
    stages: int = 3
    num_warps: int = 8


PLAN = BoxPlan()


def available() -> bool:
    """Whether Gluon is installed (it compiles anywhere; it runs on Hopper GPUs)."""
    return gluon is not None


if gluon is not None:

    # the TMA copy into shared memory: `async_copy_global_to_shared` in Triton 3.6, `async_load` in 3.9
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

    @constexpr_function
    def _buffer_rows(rows, stages, bn, bn2):
        # shared memory rows (block_k channels each) for `stages` slots of one input box of `rows`
        # rows and three row taps' weight tiles, rounded up to a power of two (Gluon's allocations)
        need = stages * (rows + 3 * (bn + bn2))
        return 1 << (need - 1).bit_length()

    @_builtin
    def _view(buf, start, align, shape, layout, _semantic=None):
        # `shape` from row `start` of the one buffer on: a slice of `align` rows there (a slice's
        # start must be a multiple of its length) reinterpreted as the longer view, rows of the same
        # width and swizzle; every start is a multiple of 8 rows, the swizzle's period. (Gluon names
        # the reinterpretation `_reinterpret` in Triton 3.6 and `reinterpret` in 3.9.)
        part = buf.slice(start, align, _semantic=_semantic)
        cast = part.reinterpret if hasattr(part, "reinterpret") else part._reinterpret
        return cast(buf.dtype, shape, layout, _semantic=_semantic)

    @gluon.jit
    def _load_step(xd, xd2, wd, wd2, buf, bar, j, t_in, h0, w0, PH, PW, SLOT: gl.constexpr,
                   CIN: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr, BN: gl.constexpr,
                   BN2: gl.constexpr, STAGES: gl.constexpr):
        # step j = (time tap, column tap, channel step): one box of R + 2 rows (two copies: R rows,
        # then 2; boxes are powers of two) and the three row taps' weights, into slot SLOT
        CH: gl.constexpr = CIN // BK
        ROWS: gl.constexpr = (R + 2) * CW
        WROWS: gl.constexpr = STAGES * ROWS + SLOT * 3 * (BN + BN2)
        kt = j // (3 * CH)
        kw = (j // CH) % 3
        c0 = (j % CH) * BK
        nbytes: gl.constexpr = (xd.block_type.nbytes + xd2.block_type.nbytes
                                + 3 * (wd.block_type.nbytes + wd2.block_type.nbytes))
        mbarrier.expect(bar, nbytes)
        top = _view(buf, SLOT * ROWS, CW, xd.block_type.shape, xd.layout)
        bottom = _view(buf, SLOT * ROWS + R * CW, CW, xd2.block_type.shape, xd2.layout)
        _tma_load(xd, [t_in + kt, h0 - PH, w0 + kw - PW, c0], bar, top)
        _tma_load(xd2, [t_in + kt, h0 - PH + R, w0 + kw - PW, c0], bar, bottom)
        for kh in gl.static_range(3):
            k = ((kt * 3 + kh) * 3 + kw) * CIN + c0
            w1 = _view(buf, WROWS + kh * (BN + BN2), BN2, [BN, BK], wd.layout)
            w2 = buf.slice(WROWS + kh * (BN + BN2) + BN, BN2)
            _tma_load(wd, [0, k], bar, w1)
            _tma_load(wd2, [BN, k], bar, w2)

    @gluon.jit
    def _step(xd, xd2, wd, wd2, buf, bars, acc, acc2, i, phase, t_in, h0, w0, PH, PW, s: gl.constexpr,
              CIN: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr, BN: gl.constexpr,
              BN2: gl.constexpr, STAGES: gl.constexpr, BM: gl.constexpr):
        # step i from slot s: its three row taps' products (each from a view of the box CW voxels
        # further in), then the load of step i + STAGES - 1 into the slot the previous step used
        ROWS: gl.constexpr = (R + 2) * CW
        STEPS: gl.constexpr = 9 * (CIN // BK)
        mbarrier.wait(bars.index(s), phase)
        for kh in gl.static_range(3):
            view = _view(buf, s * ROWS + kh * CW, CW, [BM, BK], wd2.layout)
            w1 = _view(buf, STAGES * ROWS + (s * 3 + kh) * (BN + BN2), BN2, [BN, BK], wd2.layout)
            w2 = buf.slice(STAGES * ROWS + (s * 3 + kh) * (BN + BN2) + BN, BN2)
            acc = warpgroup_mma(view, w1.permute((1, 0)), acc, is_async=True)
            acc2 = warpgroup_mma(view, w2.permute((1, 0)), acc2, is_async=True)
        # this step's six products may run on; the previous step's are done: its slot is free
        acc, acc2 = warpgroup_mma_wait(num_outstanding=6, deps=(acc, acc2))
        if i + STAGES - 1 < STEPS:
            _load_step(xd, xd2, wd, wd2, buf, bars.index((s + STAGES - 1) % STAGES), i + STAGES - 1, t_in,
                       h0, w0, PH, PW, (s + STAGES - 1) % STAGES, CIN, R, CW, BK, BN, BN2, STAGES)
        return acc, acc2

    @gluon.jit
    def _box_conv_kernel(
        xd, xd2, wd, wd2, y_ptr, b_ptr, Tin, Tout, Ho, Wo, PH, PW, TILES_W, TILES, SF, SR, SC,
        CIN: gl.constexpr, COUT: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr,
        BN: gl.constexpr, BN2: gl.constexpr, HAS_BIAS: gl.constexpr, ADD: gl.constexpr, STAGES: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BM: gl.constexpr = R * CW
        ROWS: gl.constexpr = (R + 2) * CW
        CH: gl.constexpr = CIN // BK
        STEPS: gl.constexpr = 9 * CH
        gl.static_assert(BN % BN2 == 0)
        pid = gl.program_id(0)
        tile = pid % TILES
        nt = pid // TILES  # sample * Tout + output frame
        t_in = (nt // Tout) * Tin + nt % Tout
        h0 = (tile // TILES_W) * R
        w0 = (tile % TILES_W) * CW

        # one allocation holds every slot's input box and weight tiles (rows of BK channels, the
        # weights' swizzle), so that a box of R + 2 rows may sit in it whole
        buf = gl.allocate_shared_memory(wd.dtype, [_buffer_rows(ROWS, STAGES, BN, BN2), BK], wd2.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)

        mma1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN2, 16])
        acc = gl.zeros((BM, BN), gl.float32, layout=mma1)
        acc2 = gl.zeros((BM, BN2), gl.float32, layout=mma2)

        for s in gl.static_range(STAGES - 1):
            _load_step(xd, xd2, wd, wd2, buf, bars.index(s), s, t_in, h0, w0, PH, PW, s, CIN, R, CW, BK, BN, BN2,
                       STAGES)
        for it in range(STEPS // STAGES):
            for s in gl.static_range(STAGES):
                acc, acc2 = _step(xd, xd2, wd, wd2, buf, bars, acc, acc2, it * STAGES + s, it & 1, t_in, h0, w0,
                                  PH, PW, s, CIN, R, CW, BK, BN, BN2, STAGES, BM)
        for s in gl.static_range(STEPS % STAGES):  # the last steps, when the slots do not divide them
            acc, acc2 = _step(xd, xd2, wd, wd2, buf, bars, acc, acc2, (STEPS // STAGES) * STAGES + s,
                              (STEPS // STAGES) & 1, t_in, h0, w0, PH, PW, s, CIN, R, CW, BK, BN, BN2, STAGES, BM)
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))

        _store_patch(acc, y_ptr, b_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, 0, COUT, BM, BN, CW, HAS_BIAS, ADD, mma1)
        _store_patch(acc2, y_ptr, b_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, BN, COUT, BM, BN2, CW, HAS_BIAS, ADD, mma2)

    @gluon.jit
    def _store_patch(acc, y_ptr, b_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, n0: gl.constexpr, COUT: gl.constexpr,
                     BM: gl.constexpr, BN: gl.constexpr, CW: gl.constexpr, HAS_BIAS: gl.constexpr, ADD: gl.constexpr,
                     layout: gl.constexpr):
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        row = h0 + offs_m // CW
        col = w0 + offs_m % CW
        dt: gl.constexpr = y_ptr.dtype.element_ty
        if HAS_BIAS:
            acc = acc + gl.load(b_ptr + offs_n).to(gl.float32)[None, :]
        off = nt.to(gl.int64) * SF + row * SR + col * SC
        mask = ((row < Ho) & (col < Wo))[:, None] & (offs_n < COUT)[None, :]
        at = y_ptr + off[:, None] + offs_n[None, :]
        if ADD:  # (conv + bias) rounded, plus the old value, rounded again: PyTorch's two adds
            acc = acc.to(dt).to(gl.float32) + gl.load(at, mask=mask, other=0.0).to(gl.float32)
        gl.store(at, acc.to(dt), mask=mask)


def box_weight_of(weight: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin, 3, 3, 3) -> (Cout, 27 * Cin): each output channel's row of (tap, input channel),
    taps in (t, h, w) order (the weight tiles' K axis innermost, as the multiplies read them)."""
    cout = weight.shape[0]
    return weight.detach().permute(0, 2, 3, 4, 1).reshape(cout, -1).contiguous()


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding, how: BoxPlan = PLAN,
           box_weight: torch.Tensor | None = None, add_to: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """`F.conv3d(x, weight, bias, 1, padding)` (3x3x3, no time padding) as a channels-last tensor, or
    into `out`, or added to `add_to` in place (see conv_kernel.conv3d, whose arguments these are)."""
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    pt, ph, pw = (padding, padding, padding) if isinstance(padding, int) else tuple(padding)
    tout, ho, wo = tin - 2 + 2 * pt, h - 2 + 2 * ph, w - 2 + 2 * pw
    if add_to is not None:
        out = add_to
    elif out is None:
        out = torch.empty((n, cout, tout, ho, wo), dtype=x.dtype, device=x.device,
                          memory_format=torch.channels_last_3d)
    if out.numel() == 0:
        return out
    wk = box_weight if box_weight is not None else box_weight_of(weight)
    r, cw, bk = how.rows, how.cols, how.block_k
    xl = x.permute(0, 2, 3, 4, 1)
    box_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * bk, element_bitwidth=16, rank=4)
    shape, strides = [n * tin, h, w, c], [h * w * c, w * c, c, 1]
    xd = GluonDescriptor(xl, shape, strides, [1, r, cw, bk], box_layout)
    xd2 = GluonDescriptor(xl, shape, strides, [1, 2, cw, bk], box_layout)
    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * bk, element_bitwidth=16, rank=2)
    wd = GluonDescriptor(wk, [cout, 27 * c], [27 * c, 1], [how.block_n, bk], w_layout)
    wd2 = GluonDescriptor(wk, [cout, 27 * c], [27 * c, 1], [how.block_n2, bk], w_layout)
    tiles_w = triton.cdiv(wo, cw)
    tiles = triton.cdiv(ho, r) * tiles_w
    _box_conv_kernel[(n * tout * tiles,)](
        xd, xd2, wd, wd2, out, wk if bias is None else bias, tin, tout, ho, wo, ph, pw, tiles_w, tiles,
        out.stride(2), out.stride(3), out.stride(4),
        CIN=c, COUT=cout, R=r, CW=cw, BK=bk, BN=how.block_n, BN2=how.block_n2, HAS_BIAS=bias is not None,
        ADD=add_to is not None, STAGES=how.stages, num_warps=how.num_warps,
    )
    return out
