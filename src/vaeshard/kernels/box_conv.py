"""The fast tier's 3x3x3 convolution for Wan 2.1's 96- and 192-channel layers and its 96 -> 3 head on
Hopper GPUs: a Gluon kernel that reads each input box from L2 once for the three row taps.

The Triton kernel (conv_kernel.py) loads, for each of the 27 taps, its own box of the input, so at
96 channels every input voxel crosses from L2 to shared memory 27 times, and that traffic bounds it
(BENCHMARKS.md, "Where the time goes"). Here a program computes a patch of R rows x CW columns of one
output frame with a tile of output channels (all 96, or all 192 on half the rows) and, for each
(time tap, column tap, channel step), loads one box of R + 2 rows x CW columns; the three row taps
multiply three views of that box, CW voxels apart, so the input crosses from L2 9 times (and the
weights' boxes serve R x CW voxels at once). Output channels beyond one tile are further programs'
channel tiles of the same patch (timed by benchmarks/conv_kernel.py --box-sweep, not in PLANS).
Gluon, Triton's lower-level language, exposes what this needs: the shared memory, the TMA copies
and the warp-group multiplies. One producer warp issues the copies into STAGES slots; the two
consumer warp groups (the default partition) multiply and store; the programs stay resident and
walk the tiles, so the producer copies the next tile's boxes while a tile is stored. With
`tma_out` (PLANS' 96 and 192 channels) the consumers write the output patch into a shared-memory
staging buffer and TMA copies store it (a residual to add comes into that buffer the same way,
halfway through the tile), so they start the next tile's multiplies at once: stored from
registers, the patches had kept them from multiplying 10-16% of the time (BENCHMARKS.md, "The box
convolution"). With `a_regs` (192 channels) each view's input rows are loaded into registers once
for both channel tiles; each load waits until the last step's multiplies of that view are done
(a multiply reads its registers while it runs). Alone on an H200 at Wan 2.1's 96-channel shapes it
ran 1.04-1.20x the Triton kernel before the TMA stores and 1.02-1.15x its former self with them;
in the decode of Wan 2.1 720p the TMA stores took 1.368 to 1.324 s on one GPU at 96 channels and
1.300 to 1.280 s at 192 (0.764 to 0.745 and 0.720 to 0.711 s on two).

What it computes is what conv_kernel.conv3d computes for the same arguments, with the same
epilogues: the fp32 sum of the 27 x Cin products plus the bias, rounded once; with `add_to` the
residual added and rounded again; with `norm` the next RMS norm + SiLU computed as it stores
(norm_math's steps, shared with the Triton kernels). Only the order of the sum differs. (The decode
asks for no norm here: the norm there needs the next convolution's input buffer before this one
runs, two convolution inputs alive at once, for 1% of the decode's time, conv_kernel.norms_in_epilogue.)
The padding
of the unsharded axes is the TMA box's out-of-bounds zero fill, so every buffer layout the fast tier
makes (halo rows, halo or zero columns, rows of any width) is taken as it is. With `causal` (a
causal convolution's time padding, conv_kernel.Front) the input holds only the new frames and the
producer copies the boxes of the two frames before a sample's first from the cache tensor, through
descriptors of its own (frames the cache lacks: a frame coordinate of -1, the zero fill), so no
cache is copied in front of the frames: the same sums as on the copied buffer. Alone that runs up
to 10% slower at the 96-channel full-resolution shapes (reading through the second descriptors,
not where the data lies: BENCHMARKS.md); in the decode the copies saved outweigh it.

Where it runs (`runs`): a CUDA device of compute capability 9.0 and a Triton whose Gluon takes the
shifted views (`available`: a view of a shared-memory slot that starts CW rows in is a slice of CW
rows reinterpreted as the longer view; Triton 3.6 compiles it, Triton 3.9's verifier rejects it,
and vaeshard then runs the Triton kernel, with one warning). Triton's interpreter cannot run Gluon:
on CPU the tests compile it for sm_90 and check where it is chosen; its values are checked on the
GPU (benchmarks/gpu_parity.py, benchmarks/conv_kernel.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import NamedTuple

import torch

from . import norm_math
from .triton_support import frame_stride, launch, triton

try:  # Gluon: Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.runtime.jit import constexpr_function
except Exception:  # pragma: no cover - depends on the installation
    gluon = None


class BoxPlan(NamedTuple):
    """The kernel's tiling: output patches of `rows` x `cols` voxels, a program's output channels as
    two tiles (`block_n` + `block_n2`; more output channels than that are several programs' channel
    tiles of the same patch), `block_k` input channels per step, `stages` slots of copies in
    flight, `num_warps` consumer warps, `producer_regs` registers per thread of the producer warp;
    `a_regs`: each view's input rows multiplied from registers (loaded once for both channel
    tiles); `tma_out`: the output patch staged in shared memory and stored by TMA copies (a norm
    epilogue stores from registers regardless)."""

    rows: int = 16
    cols: int = 16
    block_n: int = 64
    block_n2: int = 32
    block_k: int = 32
    stages: int = 4
    num_warps: int = 8
    producer_regs: int = 40
    a_regs: bool = False
    tma_out: bool = False


# The tilings measured fastest on an H200 (BENCHMARKS.md, "The box convolution"), by output
# channels. 96 (Wan 2.1's full-resolution layers): 16 x 16 voxels, TMA stores, 3 slots (the staging
# buffers' 48 KB leave no room for 4; 720p, 1 GPU: 2.86-2.88 ms against 3.13-3.36 with 4 slots and
# stores from registers, 3.05-3.07 before; 2 slots 0.84-0.90x of cuDNN; the rows in registers 2.98-3.05).
# 192 (its half-resolution layers): 8 x 16 voxels with all 192 channels (2.60 ms against 2.86 for two
# channel tiles of 96 on 16 x 16 voxels and 2.87 for the Triton kernel), TMA stores and the rows in
# registers, 3 slots (2.42 against 2.61-2.89 ms; by height 1.27 against 1.34-1.41). Not here: 384
# channels (0.71-0.91x of cuDNN) and Wan 2.2's 256 (0.70-1.04x), benchmarks/conv_kernel.py
# --box-sweep, where other tilings are measured before a count joins PLANS. 3 (the head's 96 -> 3
# convolution, on cuDNN's Ampere-generation kernel otherwise): one accumulator of 16 channels, 13
# of them the weights' zero fill, not stored.
PLAN = BoxPlan(stages=3, tma_out=True)
PLANS = {96: PLAN, 192: BoxPlan(rows=8, block_n=128, block_n2=64, stages=3, tma_out=True, a_regs=True),
         3: BoxPlan(block_n=16, block_n2=0)}


def available() -> bool:
    """Whether this Triton's Gluon compiles the kernel (for sm_90; no GPU needed): Gluon present and
    its verifier taking the kernel's shifted views. Checked once per process, with a warning where
    Gluon is present and the kernel does not compile."""
    return _compiles()


def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `conv3d` runs for this input and weight: output channels in PLANS (96, 192, 3), input
    channels a multiple of the channel step, bf16 or fp16, a CUDA device of compute capability 9.0,
    and `available()`."""
    how = PLANS.get(weight.shape[0])
    return (how is not None and weight.shape[1] % how.block_k == 0 and x.dtype in (torch.bfloat16, torch.float16)
            and _on_hopper(x) and available())


def _on_hopper(x: torch.Tensor) -> bool:
    """Whether `x` lives on a CUDA device of compute capability 9.0 (the warp-group multiplies)."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)


if gluon is not None:
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # (its 3.9 name, its 3.6 name)
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

    @constexpr_function
    def _pow2(n):
        return 1 << (n - 1).bit_length()

    @constexpr_function
    def _flat(layout):  # a TMA box's shared layout for the 2-D tile of its rows
        return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width,
                                    element_bitwidth=layout.element_bitwidth, rank=2)

    def _as(part, shape, layout, _semantic):
        # a slice of shared memory seen with another shape and layout (`_reinterpret` in Triton
        # 3.6, `reinterpret` later)
        cast = part.reinterpret if hasattr(part, "reinterpret") else part._reinterpret
        return cast(part.dtype, shape, layout, _semantic=_semantic)

    @_builtin
    def _view(buf, start, length, shape, layout, _semantic=None):
        # `shape` from row `start` of a slot on: a slice of `length` rows there (a slice must start at
        # a multiple of its length) reinterpreted as the view; every start is a multiple of 8 rows,
        # the swizzle's period
        return _as(buf.slice(start, length, _semantic=_semantic), shape, layout, _semantic)

    @_builtin
    def _columns(buf, start, length, shape, layout, _semantic=None):
        # columns `start` to `start + length` of a staging buffer as a TMA box's shared tile
        return _as(buf.slice(start, length, dim=1, _semantic=_semantic), shape, layout, _semantic)

    @gluon.jit
    def _waited(acc, acc2, groups: gl.constexpr, TWO: gl.constexpr):
        # the accumulators once at most `groups` of the multiplies' steps (one warp-group multiply
        # per accumulator each) are still running: as tensors again
        if TWO:
            acc, acc2 = warpgroup_mma_wait(num_outstanding=2 * groups, deps=(acc, acc2))
        else:
            acc = warpgroup_mma_wait(num_outstanding=groups, deps=(acc,))
        return acc, acc2

    @gluon.jit
    def _tma_patch(desc, nt, h0, w0, n0, buf, bar, LOAD: gl.constexpr):
        # a patch of one accumulator's channels between global memory and its staging buffer, in
        # boxes of the descriptor's channels (at most 64: a 128-byte swizzle)
        OC: gl.constexpr = desc.block_type.shape[3]
        for q in gl.static_range(buf.shape[1] // OC):
            view = _columns(buf, q * OC, OC, desc.block_type.shape, desc.layout)
            if LOAD:
                _tma_load(desc, [nt, h0, w0, n0 + q * OC], bar, view)
            else:
                _tma_store(desc, [nt, h0, w0, n0 + q * OC], view)

    @gluon.jit
    def _tile_origin(tile, TILES, TILES_W, Tout, Tin, R: gl.constexpr, CW: gl.constexpr, NC: gl.constexpr,
                     BNC: gl.constexpr):
        # tile -> (sample * Tout + output frame, its first input frame, first row, first column,
        # first output channel); a patch's NC channel tiles are neighbours, so the programs that
        # run them together read its boxes from L2 while they are there
        n0 = (tile % NC) * BNC
        patch = tile // NC
        t = patch % TILES
        nt = patch // TILES
        return nt, (nt // Tout) * Tin + nt % Tout, (t // TILES_W) * R, (t % TILES_W) * CW, n0

    @gluon.jit
    def _producer(xd, xd2, cd, cd2, wd, wd2, a_bufs, b_bufs, b2_bufs, ready, empty, Tin, Tout, Tc, PH, PW, TILES_W,
                  TILES, TOTAL, CIN: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr,
                  BN: gl.constexpr, NC: gl.constexpr, BNC: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        # one warp: for every step of every tile of this program, wait for a free slot, then copy
        # the box of R + 2 rows (R rows, then 2: boxes are powers of two) and the three row taps'
        # weight tiles into it. CAUSAL: the input holds only the new frames (Tin = Tout); the two
        # frames before a sample's first come from the cache (cd, Tc frames a sample: its last
        # ones), zeros where it has fewer (a frame coordinate of -1: the box's zero fill)
        CH: gl.constexpr = CIN // BK
        STEPS: gl.constexpr = 9 * CH
        TWO: gl.constexpr = BNC > BN  # a second channel tile (else wd2 is not read)
        nbytes: gl.constexpr = (xd.block_type.nbytes + xd2.block_type.nbytes
                                + 3 * (wd.block_type.nbytes + TWO * wd2.block_type.nbytes))
        counter = 0
        for tile in range(gl.program_id(0), TOTAL, gl.num_programs(0)):
            nt, t_in, h0, w0, n0 = _tile_origin(tile, TILES, TILES_W, Tout, Tin, R, CW, NC, BNC)
            for j in range(STEPS):  # j = (time tap, column tap, channel step)
                s = counter % STAGES
                mbarrier.wait(empty.index(s), ((counter // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, nbytes)
                kt = j // (3 * CH)
                kw = (j // CH) % 3
                c0 = (j % CH) * BK
                a = a_bufs.index(s)
                if CAUSAL:
                    v = nt % Tout + kt  # the frame among the sample's two causal frames and its new ones
                    if v < 2:
                        c = v - 2 + Tc  # the cache's frame, if it has it
                        f = ((nt // Tout) * Tc + c + 1) * (c >= 0).to(gl.int32) - 1
                        _input_box(cd, cd2, a, f, h0 - PH, w0 + kw - PW, c0, bar, R, CW)
                    else:
                        _input_box(xd, xd2, a, (nt // Tout) * Tin + v - 2, h0 - PH, w0 + kw - PW, c0, bar, R, CW)
                else:
                    _input_box(xd, xd2, a, t_in + kt, h0 - PH, w0 + kw - PW, c0, bar, R, CW)
                for kh in gl.static_range(3):
                    k = ((kt * 3 + kh) * 3 + kw) * CIN + c0
                    _tma_load(wd, [n0, k], bar, b_bufs.index(s * 3 + kh))
                    if TWO:
                        _tma_load(wd2, [n0 + BN, k], bar, b2_bufs.index(s * 3 + kh))
                counter += 1

    @gluon.jit
    def _input_box(xd, xd2, a, f, h, w, c0, bar, R: gl.constexpr, CW: gl.constexpr):
        # the box of R + 2 rows from row h, column w, channel c0 of frame f into slot a
        _tma_load(xd, [f, h, w, c0], bar, _view(a, 0, R * CW, xd.block_type.shape, xd.layout))
        _tma_load(xd2, [f, h + R, w, c0], bar, _view(a, R * CW, 2 * CW, xd2.block_type.shape, xd2.layout))

    @gluon.jit
    def _consumer(a_bufs, b_bufs, b2_bufs, ready, empty, od, od2, o_buf, o2_buf, res_bar, y_ptr, b_ptr, g_ptr, nb_ptr,
                  p_ptr, scale, eps, Tin, Tout, Ho, Wo, TILES_W, TILES, TOTAL, SF, SR, SC,
                  CIN: gl.constexpr, COUT: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr,
                  BN: gl.constexpr, BN2: gl.constexpr, NC: gl.constexpr, HAS_BIAS: gl.constexpr, ADD: gl.constexpr,
                  NORM: gl.constexpr, NORM_BIAS: gl.constexpr, PRE_BIAS: gl.constexpr, SILU: gl.constexpr,
                  STAGES: gl.constexpr, A_REGS: gl.constexpr, TMA_OUT: gl.constexpr, num_warps: gl.constexpr):
        # the two warp groups: per step, the three row taps' products from views of the slot's box
        # CW voxels apart (each step's products waited for one step later, its slot then freed);
        # per tile, the epilogue and the store
        BM: gl.constexpr = R * CW
        STEPS: gl.constexpr = 9 * (CIN // BK)
        TWO: gl.constexpr = BN2 > 0  # a second accumulator (else acc2 stands in, unused)
        N2: gl.constexpr = BN2 + BN * (1 - TWO)  # acc2's width (BN where it only stands in)
        mma1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, N2, 16])
        counter = 0
        done = 0  # tiles this program has finished (the phase of res_bar)
        for tile in range(gl.program_id(0), TOTAL, gl.num_programs(0)):
            nt, t_in, h0, w0, n0 = _tile_origin(tile, TILES, TILES_W, Tout, Tin, R, CW, NC, BN + BN2)
            acc = gl.zeros((BM, BN), gl.float32, layout=mma1)
            acc2 = gl.zeros((BM, N2), gl.float32, layout=mma2)
            prev = 0
            if A_REGS:
                dot1: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma1, k_width=2)
                dot2: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2, k_width=2)
            for j in range(STEPS):
                s = counter % STAGES
                mbarrier.wait(ready.index(s), (counter // STAGES) & 1)
                a = a_bufs.index(s)
                if TMA_OUT and ADD:
                    if j == STEPS // 2:  # the last tile's store has left the staging buffers by now: the
                        # residual copied into them
                        tma.store_wait(0)
                        gl.thread_barrier()
                        mbarrier.expect(res_bar, (BN + TWO * BN2) * BM * (od.dtype.primitive_bitwidth // 8))
                        _tma_patch(od, nt, h0, w0, n0, o_buf, res_bar, True)
                        if TWO:
                            _tma_patch(od2, nt, h0, w0, n0 + BN, o2_buf, res_bar, True)
                if A_REGS:
                    # each view's rows loaded into registers once and multiplied by both channel
                    # tiles (as a shared-memory operand they are read once per tile); the registers
                    # are rewritten only once the previous step's products of the same view are done
                    for kh in gl.static_range(3):
                        acc, acc2 = _waited(acc, acc2, 2, TWO)
                        if kh == 2:  # the previous step's products are all done: its slot is free
                            mbarrier.arrive(empty.index(prev), count=1, pred=j > 0)
                        rows = _view(a, kh * CW, CW, [BM, BK], b_bufs.type.layout).load(dot1)
                        acc = warpgroup_mma(rows, b_bufs.index(s * 3 + kh).permute((1, 0)), acc, is_async=True)
                        if TWO:
                            acc2 = warpgroup_mma(gl.convert_layout(rows, dot2), b2_bufs.index(s * 3 + kh).permute((1, 0)),
                                                 acc2, is_async=True)
                    acc, acc2 = _waited(acc, acc2, 3, TWO)  # (blocks nothing: tensors again)
                else:
                    for kh in gl.static_range(3):
                        view = _view(a, kh * CW, CW, [BM, BK], b_bufs.type.layout)
                        acc = warpgroup_mma(view, b_bufs.index(s * 3 + kh).permute((1, 0)), acc, is_async=True)
                        if TWO:
                            acc2 = warpgroup_mma(view, b2_bufs.index(s * 3 + kh).permute((1, 0)), acc2, is_async=True)
                    acc, acc2 = _waited(acc, acc2, 3, TWO)
                    mbarrier.arrive(empty.index(prev), count=1, pred=j > 0)
                prev = s
                counter += 1
            acc, acc2 = _waited(acc, acc2, 0, TWO)
            mbarrier.arrive(empty.index(prev), count=1)
            if TMA_OUT:
                _epilogue_tma(acc, acc2, od, od2, o_buf, o2_buf, res_bar, done & 1, b_ptr, nt, h0, w0, n0, COUT, BM,
                              BN, BN2, HAS_BIAS, ADD, mma1, mma2)
            else:
                _epilogue(acc, acc2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, nt, h0, w0, n0, Ho, Wo, SF, SR,
                          SC, COUT, BM, BN, BN2, CW, HAS_BIAS, ADD, NORM, NORM_BIAS, PRE_BIAS, SILU, mma1, mma2)
            done += 1
        if TMA_OUT:  # the last store has read its staging buffer before the program ends
            tma.store_wait(0)

    @gluon.jit
    def _epilogue_tma(acc, acc2, od, od2, o_buf, o2_buf, res_bar, phase, b_ptr, nt, h0, w0, n0, COUT: gl.constexpr,
                      BM: gl.constexpr, BN: gl.constexpr, BN2: gl.constexpr, HAS_BIAS: gl.constexpr,
                      ADD: gl.constexpr, mma1: gl.constexpr, mma2: gl.constexpr):
        # the bias and the residual (ADD) as `_epilogue` adds them, the patch written into shared
        # memory and stored by TMA copies, which clip it at the output's edges; the multiplies of the
        # next tile start while it is stored. The residual is in o_buf already (copied in during the
        # tile); without one, the last tile's store must have left o_buf first.
        dt: gl.constexpr = od.dtype
        TWO: gl.constexpr = BN2 > 0
        acc = acc + 0.0  # (as in _epilogue: no multiply serialised)
        acc2 = acc2 + 0.0
        if HAS_BIAS:
            offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma1))
            acc = acc + gl.load(b_ptr + offs_n, mask=offs_n < COUT, other=0.0).to(gl.float32)[None, :]
            if TWO:
                offs_n2 = n0 + BN + gl.arange(0, acc2.shape[1], layout=gl.SliceLayout(0, mma2))
                acc2 = acc2 + gl.load(b_ptr + offs_n2, mask=offs_n2 < COUT, other=0.0).to(gl.float32)[None, :]
        if ADD:  # (conv + bias) rounded, plus the old value, rounded again: PyTorch's two adds
            mbarrier.wait(res_bar, phase)
            acc = acc.to(dt).to(gl.float32) + o_buf.load(mma1).to(gl.float32)
            if TWO:
                acc2 = acc2.to(dt).to(gl.float32) + o2_buf.load(mma2).to(gl.float32)
        else:
            tma.store_wait(0)
            gl.thread_barrier()
        o_buf.store(acc.to(dt))
        if TWO:
            o2_buf.store(acc2.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        _tma_patch(od, nt, h0, w0, n0, o_buf, res_bar, False)
        if TWO:
            _tma_patch(od2, nt, h0, w0, n0 + BN, o2_buf, res_bar, False)

    @gluon.jit
    def _epilogue(acc, acc2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, nt, h0, w0, n0, Ho, Wo, SF, SR, SC,
                  COUT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BN2: gl.constexpr, CW: gl.constexpr,
                  HAS_BIAS: gl.constexpr, ADD: gl.constexpr, NORM: gl.constexpr, NORM_BIAS: gl.constexpr,
                  PRE_BIAS: gl.constexpr, SILU: gl.constexpr, mma1: gl.constexpr, mma2: gl.constexpr):
        # conv_kernel's epilogues with explicit layouts: bias, then the residual (ADD) or the norm of
        # the voxel's channels (NORM: one channel tile, so the program holds all of them), then the store
        # (BN2 = 0: one accumulator; channels past COUT, the weights' zero fill, are not stored)
        dt: gl.constexpr = y_ptr.dtype.element_ty
        TWO: gl.constexpr = BN2 > 0
        # the accumulators moved into new registers first: an epilogue that reads them in place (no
        # bias: a convolution whose bias the next norm adds) makes ptxas serialise every warp-group
        # multiply of the kernel (its note C7514); + 0.0 changes no value but a zero's sign
        acc = acc + 0.0
        acc2 = acc2 + 0.0
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma1))
        offs_n2 = n0 + BN + gl.arange(0, acc2.shape[1], layout=gl.SliceLayout(0, mma2))
        if HAS_BIAS:
            acc = acc + gl.load(b_ptr + offs_n, mask=offs_n < COUT, other=0.0).to(gl.float32)[None, :]
            if TWO:
                acc2 = acc2 + gl.load(b_ptr + offs_n2, mask=offs_n2 < COUT, other=0.0).to(gl.float32)[None, :]
        if NORM:  # the convolution's output as it would have been stored, then the norm's steps (one
            # channel tile holds every channel: conv3d refuses the rest)
            acc = acc.to(dt).to(gl.float32)
            acc2 = acc2.to(dt).to(gl.float32)
            if PRE_BIAS:
                acc = norm_math.plus_bias(acc, p_ptr, offs_n, COUT, dt)
                acc2 = norm_math.plus_bias(acc2, p_ptr, offs_n2, COUT, dt)
            squares = gl.sum(acc * acc, axis=1) + gl.convert_layout(gl.sum(acc2 * acc2, axis=1),
                                                                     gl.SliceLayout(1, mma1))
            inv = norm_math.inverse_norm(squares, eps)
            acc = norm_math.normalized(acc, inv, g_ptr, nb_ptr, offs_n, COUT, scale, NORM_BIAS, SILU, dt)
            acc2 = norm_math.normalized(acc2, gl.convert_layout(inv, gl.SliceLayout(1, mma2)), g_ptr, nb_ptr,
                                        offs_n2, COUT, scale, NORM_BIAS, SILU, dt)
        _store(acc, y_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, offs_n, COUT, BM, CW, ADD, mma1)
        if TWO:
            _store(acc2, y_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, offs_n2, COUT, BM, CW, ADD, mma2)

    @gluon.jit
    def _store(acc, y_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, offs_n, COUT: gl.constexpr, BM: gl.constexpr,
               CW: gl.constexpr, ADD: gl.constexpr, layout: gl.constexpr):
        # the patch's voxels past the output's last row or column are not stored
        offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        row = h0 + offs_m // CW
        col = w0 + offs_m % CW
        off = nt.to(gl.int64) * SF + row * SR + col * SC
        mask = ((row < Ho) & (col < Wo))[:, None] & (offs_n < COUT)[None, :]
        at = y_ptr + off[:, None] + offs_n[None, :]
        dt: gl.constexpr = y_ptr.dtype.element_ty
        if ADD:  # (conv + bias) rounded, plus the old value, rounded again: PyTorch's two adds
            acc = acc.to(dt).to(gl.float32) + gl.load(at, mask=mask, other=0.0).to(gl.float32)
        gl.store(at, acc.to(dt), mask=mask)

    @gluon.jit
    def _box_conv_kernel(
        xd, xd2, cd, cd2, wd, wd2, od, od2, y_ptr, b_ptr, g_ptr, nb_ptr, p_ptr, scale, eps, Tin, Tout, Tc, Ho, Wo, PH,
        PW, TILES_W, TILES, TOTAL, SF, SR, SC,
        CIN: gl.constexpr, COUT: gl.constexpr, R: gl.constexpr, CW: gl.constexpr, BK: gl.constexpr,
        BN: gl.constexpr, BN2: gl.constexpr, HAS_BIAS: gl.constexpr, ADD: gl.constexpr, NORM: gl.constexpr,
        NORM_BIAS: gl.constexpr, PRE_BIAS: gl.constexpr, SILU: gl.constexpr, STAGES: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, A_REGS: gl.constexpr, TMA_OUT: gl.constexpr, CAUSAL: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        ROWS: gl.constexpr = (R + 2) * CW
        NC: gl.constexpr = (COUT + BN + BN2 - 1) // (BN + BN2)  # channel tiles per patch (the last may be part one)
        a_bufs = gl.allocate_shared_memory(wd.dtype, [STAGES, _pow2(ROWS), BK], wd2.layout)
        b_bufs = gl.allocate_shared_memory(wd.dtype, [STAGES * 3, BN, BK], wd.layout)
        if BN2 > 0:
            b2_bufs = gl.allocate_shared_memory(wd.dtype, [STAGES * 3, BN2, BK], wd2.layout)
        else:  # one channel tile: the second's buffers stand in, never read
            b2_bufs = b_bufs
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        mbarrier.init(res_bar, count=1)
        if TMA_OUT:  # the output patch's staging buffers (the residual's too)
            o_buf = gl.allocate_shared_memory(od.dtype, [R * CW, BN], _flat(od.layout))
            if BN2 > 0:
                o2_buf = gl.allocate_shared_memory(od.dtype, [R * CW, BN2], _flat(od2.layout))
            else:
                o2_buf = o_buf
        else:
            o_buf = a_bufs
            o2_buf = a_bufs
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, b2_bufs, ready, empty, od, od2, o_buf, o2_buf, res_bar, y_ptr, b_ptr, g_ptr,
                         nb_ptr, p_ptr, scale, eps, Tin, Tout, Ho, Wo, TILES_W, TILES, TOTAL, SF, SR, SC, CIN, COUT, R,
                         CW, BK, BN, BN2, NC, HAS_BIAS, ADD, NORM, NORM_BIAS, PRE_BIAS, SILU, STAGES, A_REGS, TMA_OUT,
                         num_warps)),
            (_producer, (xd, xd2, cd, cd2, wd, wd2, a_bufs, b_bufs, b2_bufs, ready, empty, Tin, Tout, Tc, PH, PW,
                         TILES_W, TILES, TOTAL, CIN, R, CW, BK, BN, NC, BN + BN2, STAGES, CAUSAL)),
        ], [1], [PRODUCER_REGS])


def box_weight_of(weight: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin, 3, 3, 3) -> (Cout, 27 * Cin): each output channel's row of (tap, input channel),
    taps in (t, h, w) order (the weight tiles' input channels innermost, as the multiplies read them)."""
    return weight.detach().permute(0, 2, 3, 4, 1).reshape(weight.shape[0], -1).contiguous()


@functools.lru_cache(maxsize=None)
def out_layout(channels: int):
    """The shared-memory layout of the TMA boxes of an output patch of `channels` channels (4-D; boxes
    of at most 64 channels, 128 bytes, the widest swizzle)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * channels), element_bitwidth=16, rank=4)


@functools.lru_cache(maxsize=None)
def descriptor_layouts(how: BoxPlan = PLAN):
    """The shared-memory layouts of the input boxes (4-D) and weight tiles (2-D): rows of block_k
    channels, swizzled by their width."""
    swizzle = 2 * how.block_k
    return (gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=4),
            gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2))


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding, out: torch.Tensor,
           box_weight: torch.Tensor, add: bool = False, norm=None, how: BoxPlan | None = None, causal: bool = False,
           cache: torch.Tensor | None = None) -> torch.Tensor:
    """conv_kernel.conv3d's computation for a convolution `runs` takes, into `out` (a view
    conv_kernel.takes_out accepts; with `add`, `out` holds the residual and the sum replaces it);
    `norm`: a conv_kernel.NormEpilogue with its bias a tensor or None. `box_weight`:
    `box_weight_of(weight)`. `how`: PLANS' tiling for the output channels unless given. Returns `out`.
    `causal`: `x` holds only new frames (as many as the output) and the two frames before each
    sample's first are `cache`'s last ((N, C, 1 or 2, H, W) of `x`'s rows and columns, channels-last:
    conv_kernel.takes_front), zeros before them or without a cache: the time padding is read where
    it lies, never copied in front of the frames."""
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    how = how if how is not None else PLANS[cout]
    per_tile = how.block_n + how.block_n2
    if (cout > per_tile and cout % per_tile) or (norm is not None and cout > per_tile):
        raise ValueError(f"box_conv.conv3d: {cout} output channels in tiles of {per_tile}"
                         + (" with the norm in the epilogue (one tile holds every channel)" if norm is not None else ""))
    _, ph, pw = padding
    tout, ho, wo = out.shape[2:]
    r, cw, bk = how.rows, how.cols, how.block_k
    box_layout, _ = descriptor_layouts(how)
    tma_out = how.tma_out and norm is None
    xl = x.permute(0, 2, 3, 4, 1)  # (N, T, H, W, C): the channels-last memory in order
    shape, strides = [n * tin, h, w, c], [h * w * c, w * c, c, 1]
    xd = GluonDescriptor(xl, shape, strides, [1, r, cw, bk], box_layout)
    xd2 = GluonDescriptor(xl, shape, strides, [1, 2, cw, bk], box_layout)
    wd, wd2 = _weight_descriptors(box_weight, how)
    cd, cd2, tc = xd, xd2, 0  # (stand-ins for the cache; without one, a causal frame is the zero fill)
    if causal and cache is not None:
        tc = cache.shape[2]
        cl = cache.permute(0, 2, 3, 4, 1)
        cshape = [n * tc, h, w, c]
        cd, cd2 = (GluonDescriptor(cl, cshape, strides, [1, rows, cw, bk], box_layout) for rows in (r, 2))
    od, od2 = xd, xd2  # (stand-ins, not read, without TMA stores)
    if tma_out:  # the output as (N * T, H, W, C) (conv_kernel.takes_out: samples follow each other's frames)
        ol = out.permute(0, 2, 3, 4, 1)
        oshape, ostrides = [n * tout, ho, wo, cout], [frame_stride(out), out.stride(3), out.stride(4), 1]
        od, od2 = (GluonDescriptor(ol, oshape, ostrides, [1, r, cw, min(64, bn)], out_layout(bn))
                   for bn in (how.block_n, how.block_n2 or how.block_n))
    tiles_w = triton.cdiv(wo, cw)
    tiles = triton.cdiv(ho, r) * tiles_w
    total = n * tout * tiles * triton.cdiv(cout, per_tile)
    programs = min(total, _multiprocessors(x.device))
    unused = box_weight  # a pointer for the arguments a launch does not read
    gamma = unused if norm is None else norm.gamma
    norm_bias = None if norm is None else norm.bias
    pre_bias = None if norm is None else norm.pre_bias
    launch(_box_conv_kernel, (programs,),
        xd, xd2, cd, cd2, wd, wd2, od, od2, out, unused if bias is None else bias, gamma,
        unused if norm_bias is None else norm_bias, unused if pre_bias is None else pre_bias,
        float(1.0 if norm is None else norm.scale), float(1e-12 if norm is None else norm.eps), tin, tout, tc, ho, wo, ph,
        pw, tiles_w, tiles, total,
        frame_stride(out), out.stride(3), out.stride(4),
        CIN=c, COUT=cout, R=r, CW=cw, BK=bk, BN=how.block_n, BN2=how.block_n2, HAS_BIAS=bias is not None,
        ADD=add, NORM=norm is not None, NORM_BIAS=norm_bias is not None, PRE_BIAS=pre_bias is not None,
        SILU=bool(norm is not None and norm.silu), STAGES=how.stages, PRODUCER_REGS=how.producer_regs,
        A_REGS=how.a_regs, TMA_OUT=tma_out, CAUSAL=causal, num_warps=how.num_warps,
    )
    return out


_WEIGHT_DESCRIPTORS = "_vaeshard_box_descriptors"


def _weight_descriptors(box_weight: torch.Tensor, how: BoxPlan):
    """The descriptors of the weight's two channel tiles for the plan `how`, made once per weight
    layout tensor (kept on it: conv_kernel.cached_box_weight keeps that tensor from call to call)
    instead of at every launch, which the host pays for at every convolution."""
    kept = box_weight.__dict__.setdefault(_WEIGHT_DESCRIPTORS, {})
    if how not in kept:
        cout, k = box_weight.shape
        _, w_layout = descriptor_layouts(how)
        kept[how] = tuple(GluonDescriptor(box_weight, [cout, k], [k, 1], [bn, how.block_k], w_layout)
                          for bn in (how.block_n, how.block_n2 or how.block_n))
    return kept[how]


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def compile_for_hopper(how: BoxPlan = PLAN, cin: int = 96, cout: int = 96, add: bool = False, norm: bool = False,
                       bias: bool | None = None, causal: bool = False):
    """The kernel compiled for sm_90 without a GPU (Triton's own ptxas), for `available` and the tests;
    `bias`: whether it adds one (default: unless `norm`, whose pre-bias it then adds); `causal`: the
    time padding read from a cache (conv3d's `causal`)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    box_layout, w_layout = descriptor_layouts(how)
    r, cw, bk = how.rows, how.cols, how.block_k

    def desc(block, layout):
        return f"tensordesc<bf16[{', '.join(map(str, block))}],{layout!r}>"

    kernel = _box_conv_kernel
    tma_out = how.tma_out and not norm
    bn2 = how.block_n2 or how.block_n
    constants = dict(CIN=cin, COUT=cout, R=r, CW=cw, BK=bk, BN=how.block_n, BN2=how.block_n2, TMA_OUT=tma_out,
                     HAS_BIAS=not norm if bias is None else bias,
                     ADD=add, NORM=norm, NORM_BIAS=False, PRE_BIAS=norm, SILU=True, STAGES=how.stages,
                     PRODUCER_REGS=how.producer_regs, A_REGS=how.a_regs, CAUSAL=causal, num_warps=how.num_warps)
    types = {"xd": desc([1, r, cw, bk], box_layout), "xd2": desc([1, 2, cw, bk], box_layout),
             "cd": desc([1, r, cw, bk], box_layout), "cd2": desc([1, 2, cw, bk], box_layout),
             "wd": desc([how.block_n, bk], w_layout), "wd2": desc([bn2, bk], w_layout),
             "od": desc([1, r, cw, min(64, how.block_n)], out_layout(how.block_n)) if tma_out else desc([1, r, cw, bk], box_layout),
             "od2": desc([1, r, cw, min(64, bn2)], out_layout(bn2)) if tma_out else desc([1, 2, cw, bk], box_layout),
             "y_ptr": "*bf16", "b_ptr": "*bf16", "g_ptr": "*bf16", "nb_ptr": "*bf16", "p_ptr": "*bf16",
             "scale": "fp32", "eps": "fp32"}
    names = kernel.arg_names
    types = {a: types.get(a, "constexpr" if a in constants else "i32") for a in names}
    source = GluonASTSource(kernel, types, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": how.num_warps})


@functools.lru_cache(maxsize=None)
def _compiles() -> bool:
    if gluon is None or triton is None:
        return False
    try:
        with _quiet_stderr():  # (the compiler's own diagnostics for the failure; the warning says it)
            compile_for_hopper()
    except Exception as err:  # noqa: BLE001 - any failure means: not with this Triton
        warnings.warn(f"vaeshard: the Gluon convolution kernel does not compile with Triton {triton.__version__} "
                      f"({type(err).__name__}); the Triton kernel and cuDNN run Wan's 96- and 192-channel convolutions and its head instead",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


@contextlib.contextmanager
def _quiet_stderr():
    """The process's stderr (file descriptor 2, where MLIR prints) sent to the null device for a while."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
