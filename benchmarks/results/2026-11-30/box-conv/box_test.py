"""Gluon box convolution vs the Triton kernel and cuDNN: values and time, alone."""
import sys, os, json
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # box_conv.py beside this script; vaeshard installed
import torch, torch.nn.functional as F
import box_conv as bc
from vaeshard import conv_kernel

torch.backends.cudnn.benchmark = True
SHAPES = {
    "720p 1 GPU": (6, 720, 1280, (0, 1, 1)),
    "720p 2 GPUs by height": (6, 362, 1280, (0, 0, 1)),
    "720p 2 GPUs by width": (6, 720, 642, (0, 1, 0)),
    "480p 1 GPU": (6, 480, 832, (0, 1, 1)),
    "480p 2 GPUs by height": (6, 242, 832, (0, 0, 1)),
}
VARIANTS = {"r16 bk32 s3": bc.PLAN, "r8 bk32 s2": bc.PLAN._replace(rows=8, stages=2), "r8 bk32 s2 w4": bc.PLAN._replace(rows=8, stages=2, num_warps=4), "r16 bk32 s2": bc.PLAN._replace(stages=2)}


def med(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]

only = sys.argv[1:] 
torch.manual_seed(0)
w = (torch.randn(96, 96, 3, 3, 3, device="cuda") * 0.03).bfloat16()
bias = (torch.randn(96, device="cuda") * 0.1).bfloat16()
wk = bc.box_weight_of(w)
gk = conv_kernel.gemm_weight_of(w)
rows = []
for name, (t, h, wd, pad) in SHAPES.items():
    x = torch.randn(1, 96, t, h, wd, device="cuda").bfloat16().contiguous(memory_format=torch.channels_last_3d)
    ref = F.conv3d(x.float(), w.float(), bias.float(), 1, pad)
    flops = 2 * ref.numel() * 96 * 27
    row = {"shape": name}
    ycud = F.conv3d(x, w, bias, 1, pad)
    row["cudnn_ms"] = med(lambda: F.conv3d(x, w, None, 1, pad))
    row["cudnn_err"] = (ycud.float() - ref).abs().max().item()
    how = conv_kernel.plan(x, w, 1, pad, 1, 1)
    if how is not None:
        yt = conv_kernel.conv3d(x, w, bias, pad, how, gk)
        row["triton_ms"] = med(lambda: conv_kernel.conv3d(x, w, bias, pad, how, gk))
        row["triton_err"] = (yt.float() - ref).abs().max().item()
    for vn, plan in VARIANTS.items():
        try:
            yb = bc.conv3d(x, w, bias, pad, plan, wk)
            torch.cuda.synchronize()
            err = (yb.float() - ref).abs().max().item()
            row[vn + "_err"] = err
            row[vn + "_ms"] = med(lambda: bc.conv3d(x, w, bias, pad, plan, wk))
            row[vn + "_tflops"] = flops / row[vn + "_ms"] / 1e9
        except Exception as e:
            row[vn + "_fail"] = repr(e)[:300]
    # residual add, the first variant
    res = torch.randn_like(ycud)
    r2 = res.clone()
    try:
        bc.conv3d(x, w, bias, pad, VARIANTS["r16 bk32 s3"], wk, add_to=r2)
        row["add_err"] = (r2.float() - (ref + res.float())).abs().max().item()
    except Exception as e:
        row["add_fail"] = repr(e)[:300]
    row["ref_absmax"] = ref.abs().max().item()
    print(json.dumps(row), flush=True)
    rows.append(row)
out = os.environ.get("OUT", "/tmp")
json.dump(rows, open(os.path.join(out, "box_test.json"), "w"), indent=1)
for r in rows:
    line = f"{r['shape']:24s} cudnn {r['cudnn_ms']:.3f}"
    if "triton_ms" in r: line += f" triton {r['triton_ms']:.3f}"
    for vn in VARIANTS:
        if vn + "_ms" in r: line += f" | {vn} {r[vn+'_ms']:.3f} ({r[vn+'_tflops']:.0f} TF, err {r[vn+'_err']:.3g})"
        elif vn + "_err" in r: line += f" | {vn} err {r[vn+'_err']:.3g}"
        else: line += f" | {vn} FAIL"
    print(line + f" add_err {r.get('add_err', 'FAIL')}")
