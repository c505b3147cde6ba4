# one launch of box_conv per tiling at Wan 2.1's 720p 96-channel shape, for Nsight Compute
import torch
from vaeshard import box_conv
x = torch.randn(1, 96, 6, 720, 1280, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
w = torch.randn(96, 96, 3, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.03
bw = box_conv.box_weight_of(w)
out = torch.empty(1, 96, 4, 720, 1280, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
for how in (box_conv.PLAN, box_conv.PLAN._replace(a_regs=True)):
    box_conv.conv3d(x, w, None, (0, 1, 1), out, bw, how=how)
torch.cuda.synchronize()
