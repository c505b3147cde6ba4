"""Halo rows for the single-frame causal convolution: a "causal Conv3d" specialized to images as an
nn.Conv2d that squeezes the one frame away (Qwen-Image 2.1's `QwenImage21CausalConv3d`).

Such a layer holds its spatial zero padding in `_padding` (w_left, w_right, h_top, h_bottom), keeps
`padding` at zero and applies `_padding` with F.pad to the squeezed (B, C, H, W) frame; it refuses a
time cache. Neither `HaloCausalConv3d` (a Conv3d with a six-entry `_padding`) nor `HaloConv2d` (the
padding in `padding`) fits it, hence this mixin.
"""

from __future__ import annotations

import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current
from . import tier as fast_tier


class HaloFrameConv2d:
    """Mixin for a single-frame causal convolution (an nn.Conv2d over x.squeeze(2), zero-padded by
    `_padding`).

    Outside a sharded request and the fast tier, or given a time cache (which the original refuses),
    the original forward runs. Sharded: the sharded axis is extended by exactly the rows its zero
    padding would have covered, taken from the neighbouring ranks (zeros at the global edges), and
    the other axis is zero-padded as in the original. Fast tier: channels-last input, and the
    convolution applies the remaining zero padding itself instead of a padded copy.
    """

    def forward(self, x, cache_x=None):
        ctx = current()
        fast = fast_tier.enabled()
        if (ctx is None and not fast) or cache_x is not None:
            return super().forward(x, cache_x)
        left, right, top, bottom = self._padding
        frame = x.squeeze(2)
        if ctx is not None:
            if ctx.axis == HEIGHT:
                frame, top, bottom = ctx.halo_pad(frame, ctx.dim(frame), top, bottom), 0, 0
            else:
                frame, left, right = ctx.halo_pad(frame, ctx.dim(frame), left, right), 0, 0
        if fast and left == right and top == bottom:
            out = fast_tier.conv_with_bias(
                F.conv2d,
                fast_tier.to_channels_last(frame),
                self.weight,
                self.bias,
                self.stride,
                (top, left),
                self.dilation,
                self.groups,
            )
        else:  # diffusers' steps: F.pad, then the unpadded convolution
            out = F.conv2d(
                F.pad(frame, (left, right, top, bottom)),
                self.weight,
                self.bias,
                self.stride,
                0,
                self.dilation,
                self.groups,
            )
        return out.unsqueeze(2)
