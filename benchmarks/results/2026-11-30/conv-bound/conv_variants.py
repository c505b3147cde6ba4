"""Timing experiments on the 3x3x3 kernel's main loop (row tiles, plain epilogue). Variants with
wrong values exist only to locate the bound: KW=1 loads one input box per (kt, kh, c) step and uses
it for the three kw taps (a third of the input traffic)."""
import argparse, sys, torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
sys.path.insert(0, "src")
from vaeshard import conv_kernel

@triton.jit
def exp_kernel(xd, wd, yd, wd2, yd2, Tin, Tout, H, W, Ho, Wo, PH, PW, TILES,
               CIN: tl.constexpr, COUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BN2: tl.constexpr,
               BK: tl.constexpr, STAGES: tl.constexpr, KW: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid % TILES
    nt = pid // TILES
    t_in = (nt // Tout) * Tin + nt % Tout
    h0 = tile // tl.cdiv(Wo, BM)
    w0 = (tile % tl.cdiv(Wo, BM)) * BM
    CH: tl.constexpr = CIN // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc2 = tl.zeros((BM, BN2 if BN2 > 0 else 16), dtype=tl.float32)
    if KW == 1:
        for i in tl.range(0, 9 * CH, num_stages=STAGES):
            tap = i // CH
            c0 = (i % CH) * BK
            kt = tap // 3
            kh = tap % 3
            a = xd.load([t_in + kt, h0 + kh - PH, w0 - PW, c0]).reshape(BM, BK)
            for kw in tl.static_range(3):
                b = wd.load([(tap * 3 + kw) * CIN + c0, 0])
                acc = tl.dot(a, b, acc)
                if BN2 > 0:
                    b2 = wd2.load([(tap * 3 + kw) * CIN + c0, BN])
                    acc2 = tl.dot(a, b2, acc2)
    else:
        for i in tl.range(0, 27 * CH, num_stages=STAGES):
            tap = i // CH
            c0 = (i % CH) * BK
            kt = tap // 9
            kh = (tap // 3) % 3
            kw = tap % 3
            a = xd.load([t_in + kt, h0 + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
            b = wd.load([tap * CIN + c0, 0])
            acc = tl.dot(a, b, acc)
            if BN2 > 0:
                b2 = wd2.load([tap * CIN + c0, BN])
                acc2 = tl.dot(a, b2, acc2)
    yd.store([nt, h0, w0, 0], acc.to(tl.bfloat16).reshape(1, 1, BM, BN))
    if BN2 > 0:
        yd2.store([nt, h0, w0, BN], acc2.to(tl.bfloat16).reshape(1, 1, BM, BN2))

def run_exp(x, weight, how, kw, out):
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    ho, wo, tout = h, w, tin - 2
    wk = conv_kernel.gemm_weight_of(weight)
    bm, bn, bk = how.block_m, how.block_n, how.block_k
    xd = TensorDescriptor(x.permute(0, 2, 3, 4, 1), [n * tin, h, w, c], [h * w * c, w * c, c, 1], [1, 1, bm, bk])
    y = out.permute(0, 2, 3, 4, 1)
    def boxes(width):
        return (TensorDescriptor(wk, [27 * c, cout], [cout, 1], [bk, width]),
                TensorDescriptor(y, [n * tout, ho, wo, cout], list(out.stride()[2:]) + [1], [1, 1, bm, width]))
    wd, yd = boxes(bn)
    wd2, yd2 = boxes(how.block_n2) if how.block_n2 else (wd, yd)
    tiles = ho * triton.cdiv(wo, bm)
    exp_kernel[(n * tout * tiles,)](xd, wd, yd, wd2, yd2, tin, tout, h, w, ho, wo, 1, 1, tiles,
        CIN=c, COUT=cout, BM=bm, BN=bn, BN2=how.block_n2, BK=bk, STAGES=how.stages, KW=kw, GROUP=1,
        num_warps=how.num_warps)
    return out

def ms(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]

@triton.jit
def rows2_kernel(xd, wd, yd, wd2, yd2, Tin, Tout, H, W, Ho, Wo, PH, PW, TILES,
                 CIN: tl.constexpr, COUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BN2: tl.constexpr,
                 BK: tl.constexpr, STAGES: tl.constexpr):
    # two vertically adjacent output rows per program (h0, h0 + 1): the four input rows h0 - PH ...
    # h0 + 3 - PH are each loaded once per (kt, kw, c) step and used for both rows' taps
    pid = tl.program_id(0)
    tile = pid % TILES
    nt = pid // TILES
    t_in = (nt // Tout) * Tin + nt % Tout
    per_row = tl.cdiv(Wo, BM)
    h0 = (tile // per_row) * 2
    w0 = (tile % per_row) * BM
    CH: tl.constexpr = CIN // BK
    top = tl.zeros((BM, BN), dtype=tl.float32)
    bot = tl.zeros((BM, BN), dtype=tl.float32)
    top2 = tl.zeros((BM, BN2), dtype=tl.float32)
    bot2 = tl.zeros((BM, BN2), dtype=tl.float32)
    for i in tl.range(0, 9 * CH, num_stages=STAGES):
        step = i // CH
        c0 = (i % CH) * BK
        kt = step // 3
        kw = step % 3
        col = w0 + kw - PW
        a0 = xd.load([t_in + kt, h0 - PH, col, c0]).reshape(BM, BK)
        a1 = xd.load([t_in + kt, h0 + 1 - PH, col, c0]).reshape(BM, BK)
        a2 = xd.load([t_in + kt, h0 + 2 - PH, col, c0]).reshape(BM, BK)
        a3 = xd.load([t_in + kt, h0 + 3 - PH, col, c0]).reshape(BM, BK)
        k0 = (kt * 9 + kw) * CIN + c0  # tap (kt, kh, kw) is row (kt * 9 + kh * 3 + kw) * CIN
        b0 = wd.load([k0, 0])
        b1 = wd.load([k0 + 3 * CIN, 0])
        b2 = wd.load([k0 + 6 * CIN, 0])
        top = tl.dot(a0, b0, top)
        top = tl.dot(a1, b1, top)
        top = tl.dot(a2, b2, top)
        bot = tl.dot(a1, b0, bot)
        bot = tl.dot(a2, b1, bot)
        bot = tl.dot(a3, b2, bot)
        c0_ = wd2.load([k0, BN])
        c1_ = wd2.load([k0 + 3 * CIN, BN])
        c2_ = wd2.load([k0 + 6 * CIN, BN])
        top2 = tl.dot(a0, c0_, top2)
        top2 = tl.dot(a1, c1_, top2)
        top2 = tl.dot(a2, c2_, top2)
        bot2 = tl.dot(a1, c0_, bot2)
        bot2 = tl.dot(a2, c1_, bot2)
        bot2 = tl.dot(a3, c2_, bot2)
    yd.store([nt, h0, w0, 0], top.to(yd.dtype).reshape(1, 1, BM, BN))
    yd.store([nt, h0 + 1, w0, 0], bot.to(yd.dtype).reshape(1, 1, BM, BN))
    yd2.store([nt, h0, w0, BN], top2.to(yd2.dtype).reshape(1, 1, BM, BN2))
    yd2.store([nt, h0 + 1, w0, BN], bot2.to(yd2.dtype).reshape(1, 1, BM, BN2))


def run_rows2(x, weight, how, out, padding=(0, 1, 1)):
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    _, ph, pw = padding
    ho, wo, tout = h + 2 * ph - 2, w + 2 * pw - 2, tin - 2
    wk = conv_kernel.gemm_weight_of(weight)
    bm, bn, bk = how.block_m, how.block_n, how.block_k
    xd = TensorDescriptor(x.permute(0, 2, 3, 4, 1), [n * tin, h, w, c], [h * w * c, w * c, c, 1], [1, 1, bm, bk])
    y = out.permute(0, 2, 3, 4, 1)
    def boxes(width):
        return (TensorDescriptor(wk, [27 * c, cout], [cout, 1], [bk, width]),
                TensorDescriptor(y, [n * tout, ho, wo, cout], list(out.stride()[2:]) + [1], [1, 1, bm, width]))
    wd, yd = boxes(bn)
    wd2, yd2 = boxes(how.block_n2)
    tiles = triton.cdiv(ho, 2) * triton.cdiv(wo, bm)
    rows2_kernel[(n * tout * tiles,)](xd, wd, yd, wd2, yd2, tin, tout, h, w, ho, wo, ph, pw, tiles,
        CIN=c, COUT=cout, BM=bm, BN=bn, BN2=how.block_n2, BK=bk, STAGES=how.stages, num_warps=how.num_warps)
    return out


@triton.jit
def rows2b_kernel(xd, wd, yd, wd2, yd2, Tin, Tout, H, W, Ho, Wo, PH, PW, TILES,
                  CIN: tl.constexpr, COUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BN2: tl.constexpr,
                  BK: tl.constexpr, STAGES: tl.constexpr):
    # two vertically adjacent output rows per program sharing each weight box (not the input boxes)
    pid = tl.program_id(0)
    tile = pid % TILES
    nt = pid // TILES
    t_in = (nt // Tout) * Tin + nt % Tout
    per_row = tl.cdiv(Wo, BM)
    h0 = (tile // per_row) * 2
    w0 = (tile % per_row) * BM
    CH: tl.constexpr = CIN // BK
    top = tl.zeros((BM, BN), dtype=tl.float32)
    bot = tl.zeros((BM, BN), dtype=tl.float32)
    top2 = tl.zeros((BM, BN2), dtype=tl.float32)
    bot2 = tl.zeros((BM, BN2), dtype=tl.float32)
    for i in tl.range(0, 27 * CH, num_stages=STAGES):
        tap = i // CH
        c0 = (i % CH) * BK
        kt = tap // 9
        kh = (tap // 3) % 3
        kw = tap % 3
        a = xd.load([t_in + kt, h0 + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
        a1 = xd.load([t_in + kt, h0 + 1 + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
        b = wd.load([tap * CIN + c0, 0])
        b2 = wd2.load([tap * CIN + c0, BN])
        top = tl.dot(a, b, top)
        bot = tl.dot(a1, b, bot)
        top2 = tl.dot(a, b2, top2)
        bot2 = tl.dot(a1, b2, bot2)
    yd.store([nt, h0, w0, 0], top.to(yd.dtype).reshape(1, 1, BM, BN))
    yd.store([nt, h0 + 1, w0, 0], bot.to(yd.dtype).reshape(1, 1, BM, BN))
    yd2.store([nt, h0, w0, BN], top2.to(yd2.dtype).reshape(1, 1, BM, BN2))
    yd2.store([nt, h0 + 1, w0, BN], bot2.to(yd2.dtype).reshape(1, 1, BM, BN2))


def run_rows2b(x, weight, how, out, padding=(0, 1, 1)):
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    _, ph, pw = padding
    ho, wo, tout = h + 2 * ph - 2, w + 2 * pw - 2, tin - 2
    wk = conv_kernel.gemm_weight_of(weight)
    bm, bn, bk = how.block_m, how.block_n, how.block_k
    xd = TensorDescriptor(x.permute(0, 2, 3, 4, 1), [n * tin, h, w, c], [h * w * c, w * c, c, 1], [1, 1, bm, bk])
    y = out.permute(0, 2, 3, 4, 1)
    def boxes(width):
        return (TensorDescriptor(wk, [27 * c, cout], [cout, 1], [bk, width]),
                TensorDescriptor(y, [n * tout, ho, wo, cout], list(out.stride()[2:]) + [1], [1, 1, bm, width]))
    wd, yd = boxes(bn)
    wd2, yd2 = boxes(how.block_n2)
    tiles = triton.cdiv(ho, 2) * triton.cdiv(wo, bm)
    rows2b_kernel[(n * tout * tiles,)](xd, wd, yd, wd2, yd2, tin, tout, h, w, ho, wo, ph, pw, tiles,
        CIN=c, COUT=cout, BM=bm, BN=bn, BN2=how.block_n2, BK=bk, STAGES=how.stages, num_warps=how.num_warps)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cout", type=int, default=96)
    ap.add_argument("--only-lib", action="store_true", help="run the library's kernel 3 times (for ncu)")
    args = ap.parse_args()
    c = args.cout
    h, w = (720, 1280) if c == 96 else (360, 640)
    torch.manual_seed(0)
    x = torch.randn(1, c, 6, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    weight = torch.randn(c, c, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * c) ** 0.5
    how = conv_kernel.plan(x, weight, 1, (0, 1, 1), 1, 1)
    flop = 2 * 4 * h * w * c * c * 27
    if args.only_lib:
        for _ in range(3):
            conv_kernel.conv3d(x, weight, None, (0, 1, 1), how)
        torch.cuda.synchronize(); sys.exit(0)
    out = torch.empty(1, c, 4, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    ref = torch.nn.functional.conv3d(x, weight, None, 1, (0, 1, 1))
    lib = conv_kernel.conv3d(x, weight, None, (0, 1, 1), how)
    print(f"cout {c} plan {how}")
    print(f"lib vs cudnn max rel {((lib.float()-ref.float()).abs().max() / ref.float().abs().max()).item():.2e}")
    rows = [("cudnn", lambda: torch.nn.functional.conv3d(x, weight, None, 1, (0, 1, 1))),
            ("lib", lambda: conv_kernel.conv3d(x, weight, None, (0, 1, 1), how))]
    variants = [("exp kw3", how, 0), ("exp kw1 s2 (wrong values)", how._replace(stages=2), 1)]
    for name, hw, kw in variants:
        rows.append((name, lambda hw=hw, kw=kw: run_exp(x, weight, hw, kw, out)))
    r2 = []
    if c == 96:
        r2 = [how._replace(block_m=128, stages=2), how._replace(block_m=128, stages=3),
              how._replace(block_m=64, stages=3, num_warps=4), how._replace(block_m=64, stages=4, num_warps=4),
              how._replace(block_m=128, stages=2, num_warps=4)]
    else:
        r2 = [how._replace(block_m=64, stages=2, num_warps=4), how._replace(block_m=64, stages=2, num_warps=8)]
    for hw in r2:
        try:
            o2 = run_rows2(x, weight, hw, torch.zeros_like(out))
            err = ((o2.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        except Exception as e:
            print("rows2", hw, "failed", str(e)[:200]); continue
        rows.append((f"rows2 {hw.block_m} s{hw.stages} w{hw.num_warps} (err {err:.1e})",
                     lambda hw=hw: run_rows2(x, weight, hw, out)))
    for extra in ([dict(stages=2), dict(stages=2, block_k=32), dict(block_m=64, stages=2, num_warps=4)] if c == 192 else [dict(stages=2), dict(stages=4)]):
        hw = how._replace(**extra)
        rows.append((f"lib {extra}", lambda hw=hw: conv_kernel.conv3d(x, weight, None, (0, 1, 1), hw)))
    if c == 96:
        for hw in (how._replace(stages=3, num_warps=16), how._replace(stages=2, num_warps=16), how._replace(stages=4, num_warps=16)):
            try:
                o2 = run_rows2b(x, weight, hw, torch.zeros_like(out))
                err = ((o2.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                rows.append((f"rows2b 2x{hw.block_m} s{hw.stages} w{hw.num_warps} (err {err:.1e})",
                             lambda hw=hw: run_rows2b(x, weight, hw, out)))
            except Exception as e:
                print("rows2b", hw, "failed", str(e)[:200])
    rows.append(("lib again", lambda: conv_kernel.conv3d(x, weight, None, (0, 1, 1), how)))
    for name, fn in rows:
        try:
            t = ms(fn)
            print(f"{name:40s} {t:7.3f} ms {flop / t / 1e9:6.0f} TFLOP/s")
        except Exception as e:
            print(f"{name:40s} failed: {type(e).__name__}: {str(e)[:200]}")
