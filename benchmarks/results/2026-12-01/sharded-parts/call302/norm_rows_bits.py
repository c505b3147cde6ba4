"""On the GPU: the fused norm of a shard's edge rows, normed by the neighbour as part of its buffer,
against the same rows received (a contiguous (N, T, rows, W, C) tensor) and normed alone: equal bits?"""
import torch
from vaeshard import fast
torch.manual_seed(0)
dev = torch.device("cuda")
for c, h, w in ((96, 362, 1280), (192, 182, 640), (384, 94, 320)):
    x = torch.randn(1, c, 2, h, w, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last_3d) * 3
    gamma = torch.randn(c, 1, 1, 1, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(c, 1, 1, 1, device=dev, dtype=torch.bfloat16) * 0.1
    whole = fast.rms_norm(x, gamma, bias, c ** 0.5, silu=True)
    order = (0, 2, 3, 4, 1)
    for at in (0, h - 2):
        rows = x.narrow(3, at, 2).permute(order).contiguous().permute(0, 4, 1, 2, 3)
        out = torch.empty_like(whole).narrow(3, at, 2)
        fast.rms_norm(rows, gamma, bias, c ** 0.5, silu=True, out=out)
        print(f"c={c} rows {at}..{at + 1}: equal bits {torch.equal(out, whole.narrow(3, at, 2))}")
