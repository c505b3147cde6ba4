"""Wan 2.1 720p mid-block attention (one head, d=384, 14400 tokens) : SDPA vs blocked GEMM-softmax-GEMM."""
import statistics, torch, torch.nn.functional as F
torch.manual_seed(0)
dev = "cuda"
n, d = 90 * 160, 384
q, k, v = (torch.randn(1, 1, n, d, device=dev) * s for s in (1.0, 1.0, 1.0))
q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).float()

def blocked(q, k, v, block=4096, tf32=True):
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    kt = k[0, 0].float().t() if tf32 else k[0, 0].t()
    for a in range(0, q.shape[2], block):
        qb = q[0, 0, a:a + block]
        s = (qb.float() @ kt) if tf32 else (qb @ kt).float()
        p = torch.softmax(s.mul_(scale), dim=-1).to(q.dtype)
        out[0, 0, a:a + block] = p @ v[0, 0]
    return out

def t(fn, reps=10):
    fn(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

torch.backends.cuda.matmul.allow_tf32 = True
for name, fn in [("sdpa", lambda: F.scaled_dot_product_attention(q, k, v)),
                 ("blocked tf32 4096", lambda: blocked(q, k, v)),
                 ("blocked tf32 2048", lambda: blocked(q, k, v, 2048)),
                 ("blocked bf16 4096", lambda: blocked(q, k, v, tf32=False))]:
    out = fn().float()
    e = (out - ref).abs()
    print(f"{name:20} {t(fn):7.3f} ms  max err {e.max().item():.2e} mean {e.mean().item():.2e}")
