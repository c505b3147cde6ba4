"""The Gluon program of box_conv's convolution (its device code): a producer warp that issues the TMA
copies of the input boxes and weight tiles into shared-memory slots, and consumer warp groups that
multiply each box's three row views and store the output patch. box_conv.py chooses the tiling,
makes the descriptors and launches it; this module only defines the kernel and its helpers, where
this Triton has Gluon (`gluon` is None otherwise)."""

from __future__ import annotations

from . import norm_math
from .triton_support import triton

try:  # Gluon: Triton 3.5 and later, in a version triton_support supports
    if triton is None:
        raise ImportError("no supported Triton")
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor  # noqa: F401 - box_conv's
    from triton.runtime.jit import constexpr_function
except Exception:  # pragma: no cover - depends on the installation
    gluon = None


if gluon is not None:
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # (its 3.9 name, its 3.6 name)
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # the CTA-wide barrier: `barrier` since Triton 3.7 (which takes `cluster=`, False by default),
    # `thread_barrier` before; both emit the same barrier op
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    @constexpr_function
    def _pow2(n):
        return 1 << (n - 1).bit_length()

    @constexpr_function
    def _flat(layout):  # a TMA box's shared layout for the 2-D tile of its rows
        return gl.NVMMASharedLayout(
            swizzle_byte_width=layout.swizzle_byte_width, element_bitwidth=layout.element_bitwidth, rank=2
        )

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
    def _tile_origin(
        tile, TILES, TILES_W, Tout, Tin, R: gl.constexpr, CW: gl.constexpr, NC: gl.constexpr, BNC: gl.constexpr
    ):
        # tile -> (sample * Tout + output frame, its first input frame, first row, first column,
        # first output channel); a patch's NC channel tiles are neighbours, so the programs that
        # run them together read its boxes from L2 while they are there
        n0 = (tile % NC) * BNC
        patch = tile // NC
        t = patch % TILES
        nt = patch // TILES
        return nt, (nt // Tout) * Tin + nt % Tout, (t // TILES_W) * R, (t % TILES_W) * CW, n0

    @gluon.jit
    def _producer(
        xd,
        xd2,
        cd,
        cd2,
        wd,
        wd2,
        a_bufs,
        b_bufs,
        b2_bufs,
        ready,
        empty,
        Tin,
        Tout,
        Tc,
        PH,
        PW,
        TILES_W,
        TILES,
        TOTAL,
        CIN: gl.constexpr,
        R: gl.constexpr,
        CW: gl.constexpr,
        BK: gl.constexpr,
        BN: gl.constexpr,
        NC: gl.constexpr,
        BNC: gl.constexpr,
        STAGES: gl.constexpr,
        CAUSAL: gl.constexpr,
    ):
        # one warp: for every step of every tile of this program, wait for a free slot, then copy
        # the box of R + 2 rows (R rows, then 2: boxes are powers of two) and the three row taps'
        # weight tiles into it. CAUSAL: the input holds only the new frames (Tin = Tout); the two
        # frames before a sample's first come from the cache (cd, Tc frames a sample: its last
        # ones), zeros where it has fewer (a frame coordinate of -1: the box's zero fill)
        CH: gl.constexpr = CIN // BK
        STEPS: gl.constexpr = 9 * CH
        TWO: gl.constexpr = BNC > BN  # a second channel tile (else wd2 is not read)
        nbytes: gl.constexpr = (
            xd.block_type.nbytes + xd2.block_type.nbytes + 3 * (wd.block_type.nbytes + TWO * wd2.block_type.nbytes)
        )
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
    def _consumer(
        a_bufs,
        b_bufs,
        b2_bufs,
        ready,
        empty,
        od,
        od2,
        o_buf,
        o2_buf,
        res_bar,
        y_ptr,
        b_ptr,
        g_ptr,
        nb_ptr,
        p_ptr,
        scale,
        eps,
        Tin,
        Tout,
        Ho,
        Wo,
        TILES_W,
        TILES,
        TOTAL,
        SF,
        SR,
        SC,
        CIN: gl.constexpr,
        COUT: gl.constexpr,
        R: gl.constexpr,
        CW: gl.constexpr,
        BK: gl.constexpr,
        BN: gl.constexpr,
        BN2: gl.constexpr,
        NC: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        ADD: gl.constexpr,
        NORM: gl.constexpr,
        NORM_BIAS: gl.constexpr,
        PRE_BIAS: gl.constexpr,
        SILU: gl.constexpr,
        STAGES: gl.constexpr,
        A_REGS: gl.constexpr,
        TMA_OUT: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # the two warp groups: per step, the three row taps' products from views of the slot's box
        # CW voxels apart (each step's products waited for one step later, its slot then freed);
        # per tile, the epilogue and the store
        BM: gl.constexpr = R * CW
        STEPS: gl.constexpr = 9 * (CIN // BK)
        TWO: gl.constexpr = BN2 > 0  # a second accumulator (else acc2 stands in, unused)
        N2: gl.constexpr = BN2 + BN * (1 - TWO)  # acc2's width (BN where it only stands in)
        mma1: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 16]
        )
        mma2: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N2, 16]
        )
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
                        _barrier()
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
                            acc2 = warpgroup_mma(
                                gl.convert_layout(rows, dot2),
                                b2_bufs.index(s * 3 + kh).permute((1, 0)),
                                acc2,
                                is_async=True,
                            )
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
                _epilogue_tma(
                    acc,
                    acc2,
                    od,
                    od2,
                    o_buf,
                    o2_buf,
                    res_bar,
                    done & 1,
                    b_ptr,
                    nt,
                    h0,
                    w0,
                    n0,
                    COUT,
                    BM,
                    BN,
                    BN2,
                    HAS_BIAS,
                    ADD,
                    mma1,
                    mma2,
                )
            else:
                _epilogue(
                    acc,
                    acc2,
                    y_ptr,
                    b_ptr,
                    g_ptr,
                    nb_ptr,
                    p_ptr,
                    scale,
                    eps,
                    nt,
                    h0,
                    w0,
                    n0,
                    Ho,
                    Wo,
                    SF,
                    SR,
                    SC,
                    COUT,
                    BM,
                    BN,
                    BN2,
                    CW,
                    HAS_BIAS,
                    ADD,
                    NORM,
                    NORM_BIAS,
                    PRE_BIAS,
                    SILU,
                    mma1,
                    mma2,
                )
            done += 1
        if TMA_OUT:  # the last store has read its staging buffer before the program ends
            tma.store_wait(0)

    @gluon.jit
    def _epilogue_tma(
        acc,
        acc2,
        od,
        od2,
        o_buf,
        o2_buf,
        res_bar,
        phase,
        b_ptr,
        nt,
        h0,
        w0,
        n0,
        COUT: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        BN2: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        ADD: gl.constexpr,
        mma1: gl.constexpr,
        mma2: gl.constexpr,
    ):
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
            _barrier()
        o_buf.store(acc.to(dt))
        if TWO:
            o2_buf.store(acc2.to(dt))
        fence_async_shared()
        _barrier()
        _tma_patch(od, nt, h0, w0, n0, o_buf, res_bar, False)
        if TWO:
            _tma_patch(od2, nt, h0, w0, n0 + BN, o2_buf, res_bar, False)

    @gluon.jit
    def _epilogue(
        acc,
        acc2,
        y_ptr,
        b_ptr,
        g_ptr,
        nb_ptr,
        p_ptr,
        scale,
        eps,
        nt,
        h0,
        w0,
        n0,
        Ho,
        Wo,
        SF,
        SR,
        SC,
        COUT: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        BN2: gl.constexpr,
        CW: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        ADD: gl.constexpr,
        NORM: gl.constexpr,
        NORM_BIAS: gl.constexpr,
        PRE_BIAS: gl.constexpr,
        SILU: gl.constexpr,
        mma1: gl.constexpr,
        mma2: gl.constexpr,
    ):
        # conv3d's epilogues with explicit layouts: bias, then the residual (ADD) or the norm of
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
            squares = gl.sum(acc * acc, axis=1) + gl.convert_layout(
                gl.sum(acc2 * acc2, axis=1), gl.SliceLayout(1, mma1)
            )
            inv = norm_math.inverse_norm(squares, eps)
            acc = norm_math.normalized(acc, inv, g_ptr, nb_ptr, offs_n, COUT, scale, NORM_BIAS, SILU, dt)
            acc2 = norm_math.normalized(
                acc2,
                gl.convert_layout(inv, gl.SliceLayout(1, mma2)),
                g_ptr,
                nb_ptr,
                offs_n2,
                COUT,
                scale,
                NORM_BIAS,
                SILU,
                dt,
            )
        _store(acc, y_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, offs_n, COUT, BM, CW, ADD, mma1)
        if TWO:
            _store(acc2, y_ptr, nt, h0, w0, Ho, Wo, SF, SR, SC, offs_n2, COUT, BM, CW, ADD, mma2)

    @gluon.jit
    def _store(
        acc,
        y_ptr,
        nt,
        h0,
        w0,
        Ho,
        Wo,
        SF,
        SR,
        SC,
        offs_n,
        COUT: gl.constexpr,
        BM: gl.constexpr,
        CW: gl.constexpr,
        ADD: gl.constexpr,
        layout: gl.constexpr,
    ):
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
    def box_conv_kernel(
        xd,
        xd2,
        cd,
        cd2,
        wd,
        wd2,
        od,
        od2,
        y_ptr,
        b_ptr,
        g_ptr,
        nb_ptr,
        p_ptr,
        scale,
        eps,
        Tin,
        Tout,
        Tc,
        Ho,
        Wo,
        PH,
        PW,
        TILES_W,
        TILES,
        TOTAL,
        SF,
        SR,
        SC,
        CIN: gl.constexpr,
        COUT: gl.constexpr,
        R: gl.constexpr,
        CW: gl.constexpr,
        BK: gl.constexpr,
        BN: gl.constexpr,
        BN2: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        ADD: gl.constexpr,
        NORM: gl.constexpr,
        NORM_BIAS: gl.constexpr,
        PRE_BIAS: gl.constexpr,
        SILU: gl.constexpr,
        STAGES: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        A_REGS: gl.constexpr,
        TMA_OUT: gl.constexpr,
        CAUSAL: gl.constexpr,
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
        fence_async_shared()  # (the barriers' initialisation made visible to the TMA copies that complete them)
        if TMA_OUT:  # the output patch's staging buffers (the residual's too)
            o_buf = gl.allocate_shared_memory(od.dtype, [R * CW, BN], _flat(od.layout))
            if BN2 > 0:
                o2_buf = gl.allocate_shared_memory(od.dtype, [R * CW, BN2], _flat(od2.layout))
            else:
                o2_buf = o_buf
        else:
            o_buf = a_bufs
            o2_buf = a_bufs
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        b2_bufs,
                        ready,
                        empty,
                        od,
                        od2,
                        o_buf,
                        o2_buf,
                        res_bar,
                        y_ptr,
                        b_ptr,
                        g_ptr,
                        nb_ptr,
                        p_ptr,
                        scale,
                        eps,
                        Tin,
                        Tout,
                        Ho,
                        Wo,
                        TILES_W,
                        TILES,
                        TOTAL,
                        SF,
                        SR,
                        SC,
                        CIN,
                        COUT,
                        R,
                        CW,
                        BK,
                        BN,
                        BN2,
                        NC,
                        HAS_BIAS,
                        ADD,
                        NORM,
                        NORM_BIAS,
                        PRE_BIAS,
                        SILU,
                        STAGES,
                        A_REGS,
                        TMA_OUT,
                        num_warps,
                    ),
                ),
                (
                    _producer,
                    (
                        xd,
                        xd2,
                        cd,
                        cd2,
                        wd,
                        wd2,
                        a_bufs,
                        b_bufs,
                        b2_bufs,
                        ready,
                        empty,
                        Tin,
                        Tout,
                        Tc,
                        PH,
                        PW,
                        TILES_W,
                        TILES,
                        TOTAL,
                        CIN,
                        R,
                        CW,
                        BK,
                        BN,
                        NC,
                        BN + BN2,
                        STAGES,
                        CAUSAL,
                    ),
                ),
            ],
            [1],
            [PRODUCER_REGS],
        )
        # quiescent now (every copy waited for): PTX wants a barrier invalidated before its shared
        # memory serves anything else, as it does for the next program on this multiprocessor
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))
        mbarrier.invalidate(res_bar)
