"""Per-voxel norms in parts of frames: the fast tier's bound on a norm's temporaries.

diffusers' RMS norms of LTX-Video (`RMSNorm` on a channels-last view: `x.to(float32).pow(2).mean(-1)`,
then `x * rsqrt(...)` in float32, then the input dtype) and LTX-2 (`PerChannelRMSNorm`: `x / sqrt(mean(x**2)
+ eps)`) make whole-map temporaries, two of them float32 for LTX-Video: at 704 x 1216, 121 frames, its
128-channel layers' norms hold 6.2 GiB of temporaries, the largest tensors of the decode. Each voxel's
norm reads only that voxel's channels, so the mixins compute the norm on parts of frames, each part's
last step writing into its slice of one output: diffusers' steps per voxel (mirrored: `part_into`;
a sum over channels may round differently in its last bit, as PyTorch vectorises a part's reduction
otherwise), the temporaries of one part (`PART_BYTES`), and no more data written than diffusers'
whole-map forward writes. The exact tier, and grad mode, run diffusers' forward on the whole.
"""

from __future__ import annotations

import torch

from ..layers import tier

# A part's float32 temporaries hold at most about this many bytes: a bound on the norm's memory, not
# a measured optimum (docs/tuning.md, entry `fast/norm_parts.py PART_BYTES`).
PART_BYTES = 1 << 28


class FramePartsNorm:
    """Mixin for a norm computed per voxel over its channels, on a 5-D input whose frames lie on
    `FRAME_DIM`; a subclass mirrors diffusers' forward in `part_into` and names its output dtype."""

    FRAME_DIM = 1

    def forward(self, x, *args, **kwargs):
        if not tier.enabled() or x.dim() != 5 or torch.is_grad_enabled() or args or kwargs:
            return super().forward(x, *args, **kwargs)
        dim = self.FRAME_DIM
        frames = x.shape[dim]
        per_frame = 8 * (x.numel() // max(1, frames))  # two float32 temporaries per voxel
        step = max(1, PART_BYTES // max(1, per_frame))
        if step >= frames:
            return super().forward(x)
        out = _empty_in_layout_of(x, self.output_dtype(x))
        for start in range(0, frames, step):
            n = min(step, frames - start)
            self.part_into(x.narrow(dim, start, n), out.narrow(dim, start, n))
        return out


class FramePartsRMSNorm(FramePartsNorm):
    """For diffusers' `RMSNorm` applied to a channels-last view (B, T, H, W, C): LTX-Video's. Mirrors
    its forward without the NPU branch (diffusers' models/normalization.py `RMSNorm.forward`)."""

    FRAME_DIM = 1

    def output_dtype(self, x):
        if self.weight is None:
            return x.dtype
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            return self.weight.dtype
        return torch.promote_types(torch.float32, self.weight.dtype)

    def part_into(self, x, out) -> None:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        y = x * torch.rsqrt(variance + self.eps)
        del variance
        if self.weight is None:
            out.copy_(y)  # diffusers' .to(input dtype): the same cast
            return
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            y = y.to(self.weight.dtype)
        if self.bias is None:
            torch.mul(y, self.weight, out=out)
        else:
            torch.add(y * self.weight, self.bias, out=out)


class FramePartsPerChannelRMSNorm(FramePartsNorm):
    """For LTX-2's `PerChannelRMSNorm` over dim 1 of (B, C, T, H, W). Mirrors its forward
    (diffusers' autoencoder_kl_ltx2.py `PerChannelRMSNorm.forward`)."""

    FRAME_DIM = 2

    def output_dtype(self, x):
        return x.dtype

    def part_into(self, x, out) -> None:
        mean_sq = torch.mean(x**2, dim=self.channel_dim, keepdim=True)
        torch.div(x, torch.sqrt(mean_sq + self.eps), out=out)


def _empty_in_layout_of(x: torch.Tensor, dtype) -> torch.Tensor:
    """An empty tensor shaped as the norm's input `x`, of `dtype`, dense in `x`'s dimension order in
    memory (the order of its strides): diffusers' whole-map forward lays its output out so (its
    elementwise ops keep the input's layout), and the layers after it then see the same strides."""
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))
    dense = torch.empty([x.shape[d] for d in order], dtype=dtype, device=x.device)
    return dense.permute([order.index(d) for d in range(x.dim())])
