# the library's attention alone against PyTorch's at the decode's shapes (bf16, one H200)
import torch, torch.nn.functional as F
from vaeshard import attention

def ms(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]

print(f"{'shape':36} {'pytorch ms':>10} {'vaeshard ms':>11} {'speed-up':>8} {'max |diff| vs fp32':>20}")
for name, lq, lk in (("720p 1 GPU", 14400, 14400), ("720p 2 GPUs (a rank's queries)", 7200, 14400),
                     ("480p 1 GPU", 6240, 6240), ("480p 2 GPUs", 3120, 6240)):
    torch.manual_seed(0)
    q = torch.randn(1, 1, lq, 384, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, lk, 384, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    t0 = ms(lambda: F.scaled_dot_product_attention(q, k, v))
    t1 = ms(lambda: attention.attention(q, k, v))
    e0 = (F.scaled_dot_product_attention(q, k, v).float() - ref).abs().max().item()
    e1 = (attention.attention(q, k, v).float() - ref).abs().max().item()
    print(f"{name:36} {t0:10.3f} {t1:11.3f} {t0 / t1:7.2f}x   pytorch {e0:.2e}, vaeshard {e1:.2e}")
