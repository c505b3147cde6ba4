"""fast.add_duplicated_ on the GPU in bf16 and fp16 against diffusers' out + DupUp3D(x), bit for bit, at Wan 2.2's shapes (one call's frames)."""
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D
from vaeshard import fast
for dtype in (torch.bfloat16, torch.float16):
    for cin, cout, ft, t, h, w in [(1024, 1024, 2, 1, 44, 80), (1024, 1024, 2, 2, 88, 160), (1024, 512, 1, 4, 176, 320)]:
        sc = DupUp3D(cin, cout, factor_t=ft, factor_s=2)
        x = torch.randn(1, cin, t, h, w, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last_3d)
        out = torch.randn(1, cout, t * ft, 2 * h, 2 * w, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last_3d)
        want = out + sc(x)
        ran = fast.add_duplicated_(out, x, ft, 2, sc.repeats)
        print(dtype, (cin, cout, ft, t, h, w), "ran", ran, "bit-identical", torch.equal(out, want), flush=True)
