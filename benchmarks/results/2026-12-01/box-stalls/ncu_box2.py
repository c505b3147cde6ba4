# one launch of box_conv per plan at Wan 2.1's 720p shapes (96 and 192 channels), for Nsight Compute
import sys
import torch
from vaeshard import box_conv
for cout, shape in ((96, (720, 1280)), (192, (360, 640))):
    x = torch.randn(1, cout, 6, *shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(cout, cout, 3, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.03
    out = torch.empty(1, cout, 4, *shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    box_conv.conv3d(x, w, None, (0, 1, 1), out, box_conv.box_weight_of(w))
torch.cuda.synchronize()
