import itertools, json, os, sys, time
import torch, torch.nn.functional as F, triton
from tconv import conv3d, prep_weight
torch.backends.cudnn.benchmark = True
dev = "cuda"
SHAPES = {  # name: (Cin, Cout, KT, Tin, H, W, (pt, ph, pw))
    "A96_720p": (96, 96, 3, 6, 720, 1280, (0, 1, 1)),
    "B192_360": (192, 192, 3, 6, 360, 640, (0, 1, 1)),
    "C384_180": (384, 384, 3, 4, 180, 320, (0, 1, 1)),
    "D192to384_180": (192, 384, 3, 4, 180, 320, (0, 1, 1)),
    "E384_90": (384, 384, 3, 3, 90, 160, (0, 1, 1)),
    "F96_wshard": (96, 96, 3, 6, 720, 642, (0, 1, 0)),
    "G2d_192to96_720p": (192, 96, 1, 4, 720, 1280, (0, 1, 1)),
}
only = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else list(SHAPES)
out_dir = os.environ.get("OUT", ".")

def timeit(fn, reps=15):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]

def configs(ci, co, kt):
    out = []
    for BM, BN, BK, w, s in itertools.product((128, 256), (64, 128), (32, 64), (4, 8), (3, 4)):
        if ci % BK or (BM == 256 and w == 4) or (BN == 64 and co % 64 == 0 and co > 64 and False):
            continue
        smem = s * (BM * BK + BK * BN) * 2
        if smem > 200_000: continue
        out.append(dict(BM=BM, BN=BN, BK=BK, num_warps=w, STAGES=s, t2=False))
    if kt == 3:
        for BM, BN, BK, w, s in [(128, 128, 32, 8, 2), (128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (128, 64, 32, 8, 3),
                                 (64, 128, 32, 4, 3), (128, 128, 64, 8, 1), (256, 128, 32, 8, 2), (128, 64, 64, 4, 2)]:
            if ci % BK: continue
            out.append(dict(BM=BM, BN=BN, BK=BK, num_warps=w, STAGES=s, t2=True))
    return out

rows = []
for name in only:
    ci, co, kt, tin, H, W, pad = SHAPES[name]
    torch.manual_seed(0)
    x = torch.randn(1, ci, tin, H, W, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last_3d)
    w = (torch.randn(co, ci, kt, 3, 3, device=dev, dtype=torch.bfloat16) / (ci * kt * 9) ** 0.5)
    ref = F.conv3d(x, w, None, 1, pad)
    tout = tin - kt + 1
    flop = 2 * ref.numel() * ci * kt * 9
    t_cudnn = timeit(lambda: F.conv3d(x, w, None, 1, pad))
    wp = prep_weight(w)
    best = None
    print(f"== {name} Cin {ci} Cout {co} T {tin}->{tout} {H}x{W}: cuDNN {t_cudnn:.3f} ms {flop / t_cudnn / 1e9:.0f} TFLOP/s", flush=True)
    for cfg in configs(ci, co, kt):
        try:
            y = conv3d(x, w, None, pad, wprep=wp, **cfg)
            torch.cuda.synchronize()
            err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = timeit(lambda: conv3d(x, w, None, pad, wprep=wp, **cfg))
        except Exception as e:
            print(f"   {cfg} failed: {str(e).splitlines()[0][:150]}", flush=True); continue
        r = dict(shape=name, **cfg, ms=t, tflops=flop / t / 1e9, cudnn_ms=t_cudnn, rel_err=err)
        rows.append(r)
        print(f"   {cfg} {t:.3f} ms {flop / t / 1e9:.0f} TFLOP/s  x{t_cudnn / t:.2f} err {err:.2e}", flush=True)
        if best is None or t < best["ms"]: best = r
    rows.append(dict(shape=name, best=best, cudnn_ms=t_cudnn))
    del x, ref
json.dump(rows, open(os.path.join(out_dir, "conv_bench.json"), "w"), indent=1)
print("\nshape               cuDNN ms  best ms  ratio  best config")
for r in rows:
    if "best" in r and r["best"]:
        b = r["best"]
        print(f"{r['shape']:18} {r['cudnn_ms']:8.3f} {b['ms']:8.3f} {r['cudnn_ms'] / b['ms']:6.2f}  BM{b['BM']} BN{b['BN']} BK{b['BK']} w{b['num_warps']} s{b['STAGES']} t2={b['t2']} err {b['rel_err']:.1e}")
