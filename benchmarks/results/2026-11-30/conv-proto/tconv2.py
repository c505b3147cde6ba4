import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _conv_kernel(xd, wd, yd, b_ptr, r_ptr, Tin, Tout, Ho, Wo, PH, PW,
                 CIN: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                 RH: tl.constexpr, RW: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    BM: tl.constexpr = RH * RW
    pid0 = tl.program_id(0)
    ntiles = tl.cdiv(yd.shape[3], BN)
    n0 = (pid0 % ntiles) * BN
    pid = pid0 // ntiles
    wtiles = tl.cdiv(Wo, RW)
    htiles = tl.cdiv(Ho, RH)
    w0 = (pid % wtiles) * RW
    row = pid // wtiles
    h0 = (row % htiles) * RH
    nt = row // htiles            # n * Tout + t
    t = nt % Tout
    base_t = (nt // Tout) * Tin + t
    CH: tl.constexpr = CIN // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in tl.range(0, KT * KH * KW * CH, num_stages=STAGES, warp_specialize=WS):
        tap = i // CH
        c0 = (i % CH) * BK
        kt = tap // (KH * KW)
        kh = (tap // KW) % KH
        kw = tap % KW
        a = xd.load([base_t + kt, h0 + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
        b = wd.load([tap * CIN + c0, n0])
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        offs = n0 + tl.arange(0, BN)
        acc += tl.load(b_ptr + offs, mask=offs < yd.shape[3], other=0.0).to(tl.float32)[None, :]
    out = acc.to(yd.dtype).reshape(1, RH, RW, BN)
    yd.store([nt, h0, w0, n0], out)


def prep_weight(weight):
    co, ci, kt, kh, kw = weight.shape
    return weight.permute(2, 3, 4, 1, 0).reshape(kt * kh * kw * ci, co).contiguous()


def conv3d(x, weight, bias=None, padding=(0, 1, 1), RH=1, RW=128, BN=128, BK=32, num_warps=8, STAGES=3, WS=False,
           wprep=None, out=None):
    N, C, Tin, H, W = x.shape
    co, ci, KT, KH, KW = weight.shape
    pt, PH, PW = padding
    assert pt == 0 and ci == C and C % BK == 0
    xl = x.permute(0, 2, 3, 4, 1)
    assert xl.is_contiguous(), "channels_last_3d input"
    Tout, Ho, Wo = Tin - KT + 1, H + 2 * PH - KH + 1, W + 2 * PW - KW + 1
    if out is None:
        out = torch.empty((N, co, Tout, Ho, Wo), dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    yl = out.permute(0, 2, 3, 4, 1)
    wp = prep_weight(weight) if wprep is None else wprep
    xd = TensorDescriptor(xl, [N * Tin, H, W, C], [H * W * C, W * C, C, 1], [1, RH, RW, BK])
    yd = TensorDescriptor(yl, [N * Tout, Ho, Wo, co], [Ho * Wo * co, Wo * co, co, 1], [1, RH, RW, BN])
    wd = TensorDescriptor(wp, [KT * KH * KW * C, co], [co, 1], [BK, BN])
    b = bias if bias is not None else wp
    grid = (triton.cdiv(Wo, RW) * triton.cdiv(Ho, RH) * N * Tout * triton.cdiv(co, BN),)
    _conv_kernel[grid](xd, wd, yd, b, b, Tin, Tout, Ho, Wo, PH, PW, CIN=C, KT=KT, KH=KH, KW=KW,
                       RH=RH, RW=RW, BN=BN, BK=BK, HAS_BIAS=bias is not None, RESIDUAL=False, STAGES=STAGES, WS=WS,
                       num_warps=num_warps)
    return out
