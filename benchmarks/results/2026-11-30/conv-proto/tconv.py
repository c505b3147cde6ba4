"""Prototype: causal/spatial conv3d (stride 1, dilation 1) as a Triton implicit GEMM with TMA descriptors.
x: (N, Cin, Tin, H, W) channels_last_3d; time not padded (the buffer holds the causal frames);
spatial zero padding (ph, pw) comes from the descriptor's out-of-bounds fill."""
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _conv_kernel(xd, wd, yd, b_ptr, Tin, Tout, Ho, Wo, PH, PW,
                 CIN: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n0 = tl.program_id(1) * BN
    wtiles = tl.cdiv(Wo, BM)
    w0 = (pid % wtiles) * BM
    row = pid // wtiles
    h = row % Ho
    nt = row // Ho            # n * Tout + t
    t = nt % Tout
    base_t = (nt // Tout) * Tin + t
    CH: tl.constexpr = CIN // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in tl.range(0, KT * KH * KW * CH, num_stages=STAGES):
        tap = i // CH
        c0 = (i % CH) * BK
        kt = tap // (KH * KW)
        kh = (tap // KW) % KH
        kw = tap % KW
        a = xd.load([base_t + kt, h + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
        b = wd.load([tap * CIN + c0, n0])
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        offs = n0 + tl.arange(0, BN)
        acc += tl.load(b_ptr + offs, mask=offs < yd.shape[3], other=0.0).to(tl.float32)[None, :]
    yd.store([nt, h, w0, n0], acc.to(yd.dtype).reshape(1, 1, BM, BN))


@triton.jit
def _conv_kernel_t2(xd, wd, yd, b_ptr, Tin, Tout, Ho, Wo, PH, PW,
                    CIN: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
                    STAGES: tl.constexpr):
    """Two output frames per program (KT == 3): each input frame tile loaded once for both."""
    pid = tl.program_id(0)
    n0 = tl.program_id(1) * BN
    wtiles = tl.cdiv(Wo, BM)
    w0 = (pid % wtiles) * BM
    row = pid // wtiles
    h = row % Ho
    pair = row // Ho
    tpairs = tl.cdiv(Tout, 2)
    t = (pair % tpairs) * 2
    bidx = pair // tpairs
    base_t = bidx * Tin + t
    CH: tl.constexpr = CIN // BK
    KS: tl.constexpr = KH * KW
    acc0 = tl.zeros((BM, BN), dtype=tl.float32)
    acc1 = tl.zeros((BM, BN), dtype=tl.float32)
    last = t + 1 >= Tout  # odd Tout: the second frame does not exist
    for i in tl.range(0, KS * CH, num_stages=STAGES):
        s = i // CH
        c0 = (i % CH) * BK
        kh = s // KW
        kw = s % KW
        hh = h + kh - PH
        ww = w0 + kw - PW
        b0 = wd.load([(0 * KS + s) * CIN + c0, n0])
        b1 = wd.load([(1 * KS + s) * CIN + c0, n0])
        b2 = wd.load([(2 * KS + s) * CIN + c0, n0])
        a0 = xd.load([base_t + 0, hh, ww, c0]).reshape(BM, BK)
        a1 = xd.load([base_t + 1, hh, ww, c0]).reshape(BM, BK)
        a2 = xd.load([base_t + 2, hh, ww, c0]).reshape(BM, BK)
        acc0 = tl.dot(a0, b0, acc0)
        acc0 = tl.dot(a1, b1, acc0)
        acc0 = tl.dot(a2, b2, acc0)
        acc1 = tl.dot(a1, b0, acc1)
        acc1 = tl.dot(a2, b1, acc1)
        a3 = xd.load([base_t + 3 - last.to(tl.int32), hh, ww, c0]).reshape(BM, BK)
        acc1 = tl.dot(a3, b2, acc1)
    if HAS_BIAS:
        offs = n0 + tl.arange(0, BN)
        bias = tl.load(b_ptr + offs, mask=offs < yd.shape[3], other=0.0).to(tl.float32)[None, :]
        acc0 += bias
        acc1 += bias
    nt = bidx * Tout + t
    yd.store([nt, h, w0, n0], acc0.to(yd.dtype).reshape(1, 1, BM, BN))
    if not last:
        yd.store([nt + 1, h, w0, n0], acc1.to(yd.dtype).reshape(1, 1, BM, BN))


def prep_weight(weight):
    """(Cout, Cin, KT, KH, KW) -> (KT*KH*KW*Cin, Cout) contiguous, rows ordered tap-major."""
    co, ci, kt, kh, kw = weight.shape
    return weight.permute(2, 3, 4, 1, 0).reshape(kt * kh * kw * ci, co).contiguous()


def conv3d(x, weight, bias=None, padding=(0, 1, 1), BM=128, BN=128, BK=32, num_warps=8, STAGES=3,
           t2=False, wprep=None, out=None):
    N, C, Tin, H, W = x.shape
    co, ci, KT, KH, KW = weight.shape
    pt, PH, PW = padding
    assert pt == 0 and ci == C and C % BK == 0
    xl = x.permute(0, 2, 3, 4, 1)  # (N, T, H, W, C) view of channels-last memory
    assert xl.is_contiguous(), "channels_last_3d input"
    Tout, Ho, Wo = Tin - KT + 1, H + 2 * PH - KH + 1, W + 2 * PW - KW + 1
    if out is None:
        out = torch.empty((N, co, Tout, Ho, Wo), dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    yl = out.permute(0, 2, 3, 4, 1)
    wp = prep_weight(weight) if wprep is None else wprep
    xd = TensorDescriptor(xl, [N * Tin, H, W, C], [H * W * C, W * C, C, 1], [1, 1, BM, BK])
    yd = TensorDescriptor(yl, [N * Tout, Ho, Wo, co], [Ho * Wo * co, Wo * co, co, 1], [1, 1, BM, BN])
    wd = TensorDescriptor(wp, [KT * KH * KW * C, co], [co, 1], [BK, BN])
    wtiles = triton.cdiv(Wo, BM)
    b = bias if bias is not None else wp
    if t2:
        assert KT == 3
        grid = (wtiles * Ho * N * triton.cdiv(Tout, 2), triton.cdiv(co, BN))
        _conv_kernel_t2[grid](xd, wd, yd, b, Tin, Tout, Ho, Wo, PH, PW, CIN=C, KT=KT, KH=KH, KW=KW,
                              BM=BM, BN=BN, BK=BK, HAS_BIAS=bias is not None, STAGES=STAGES, num_warps=num_warps)
    else:
        grid = (wtiles * Ho * N * Tout, triton.cdiv(co, BN))
        _conv_kernel[grid](xd, wd, yd, b, Tin, Tout, Ho, Wo, PH, PW, CIN=C, KT=KT, KH=KH, KW=KW,
                           BM=BM, BN=BN, BK=BK, HAS_BIAS=bias is not None, STAGES=STAGES, num_warps=num_warps)
    return out
