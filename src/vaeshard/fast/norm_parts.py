"""Per-voxel norms in parts of frames: the fast tier's bound on a norm's temporaries.

diffusers' RMS norms of LTX-Video (`RMSNorm` on a channels-last view: `x.to(float32).pow(2).mean(-1)`,
then `x * rsqrt(...)` in float32, then the input dtype) and LTX-2 (`PerChannelRMSNorm`: `x / sqrt(mean(x**2)
+ eps)`) make whole-map temporaries, two of them float32 for LTX-Video: at 704 x 1216, 121 frames, its
128-channel layers' norms hold 6.2 GiB of temporaries, the largest tensors of the decode. Each voxel's
norm reads only that voxel's channels, so the mixin runs diffusers' own forward on parts of frames
and writes each part into one output: the same steps per voxel (a sum over channels may round
differently in its last bit, as PyTorch vectorises a part's reduction otherwise), temporaries of
one part (`PART_BYTES`). The exact tier, and grad mode, run diffusers' forward on the whole.
"""

from __future__ import annotations

import torch

from ..layers import tier

# A part's float32 temporaries hold at most about this many bytes: a bound on the norm's memory, not
# a measured optimum (docs/tuning.md, entry `fast/norm_parts.py PART_BYTES`).
PART_BYTES = 1 << 28


class FramePartsNorm:
    """Mixin for a norm computed per voxel over its channels, on a 5-D input whose frames lie on
    `FRAME_DIM` (a class attribute of the mixin)."""

    FRAME_DIM = 1

    def forward(self, x, *args, **kwargs):
        if not tier.enabled() or x.dim() != 5 or torch.is_grad_enabled():
            return super().forward(x, *args, **kwargs)
        dim = self.FRAME_DIM
        frames = x.shape[dim]
        per_frame = 8 * (x.numel() // max(1, frames))  # two float32 temporaries per voxel
        step = max(1, PART_BYTES // max(1, per_frame))
        if step >= frames:
            return super().forward(x, *args, **kwargs)
        first = super().forward(x.narrow(dim, 0, step), *args, **kwargs)
        out = _empty_in_layout_of(x, first.dtype)
        out.narrow(dim, 0, step).copy_(first)
        del first
        for start in range(step, frames, step):
            n = min(step, frames - start)
            out.narrow(dim, start, n).copy_(super().forward(x.narrow(dim, start, n), *args, **kwargs))
        return out


class FramePartsChannelsLastNorm(FramePartsNorm):
    """`FramePartsNorm` for a norm applied to a channels-last view (B, T, H, W, C): LTX-Video's."""

    FRAME_DIM = 1


class FramePartsChannelsFirstNorm(FramePartsNorm):
    """`FramePartsNorm` for a norm over dim 1 of (B, C, T, H, W): LTX-2's `PerChannelRMSNorm`."""

    FRAME_DIM = 2


def _empty_in_layout_of(x: torch.Tensor, dtype) -> torch.Tensor:
    """An empty tensor shaped as the norm's input `x`, of `dtype`, dense in `x`'s dimension order in
    memory (the order of its strides): diffusers' whole-map forward lays its output out so (its
    elementwise ops keep the input's layout), and the layers after it then see the same strides."""
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))
    dense = torch.empty([x.shape[d] for d in order], dtype=dtype, device=x.device)
    return dense.permute([order.index(d) for d in range(x.dim())])
