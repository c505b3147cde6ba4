"""Depth-to-space projections whose output comes out channels-last (the fast tier).

Mochi's up blocks end with a Linear over the channels whose output features are (channel, time
phase, row phase, column phase), then a rearrange of the phases into frames, rows and columns,
copied to a channels-first map (`.contiguous()`). That copy moves runs of one column phase (two
elements), several times slower than memory allows (`benchmarks/profile_decode.py video --ops`: 41
ms of a Mochi 480p 79-frame decode on an H100), and it hands the fast tier's norms and
convolutions, which read channels-last maps, the other layout.

Here the Linear runs with its weight's rows (and its bias) taken in (time phase, row phase, column
phase, channel) order, so each voxel's phases come out as whole channel vectors, and those vectors
are copied into a channels-last map: one coalesced copy. Each output element is the dot product of
the same input row with the same weight row as in diffusers' forward; only the GEMM's ordering of
its output columns differs (the tier's tolerance covers a GEMM that blocks them otherwise).

`MochiUpBlock` mirrors diffusers' `MochiUpBlock3D.forward` step for step (families/mochi.py lists it
in its mirrors); outside the fast tier, or with autograd, the original forward runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers import tier


def depth_to_space(proj: torch.nn.Linear, x: torch.Tensor, phases: tuple[int, int, int]) -> torch.Tensor:
    """diffusers' Mochi unpatchify: `proj` over the channels of `x` (B, K, T, H, W), its features split
    as (channel, time, row, column phases) and moved into frames, rows and columns; the result (B, C,
    T * st, H * sh, W * sw) channels-last."""
    st, sh, sw = phases
    b, _, t, h, w = x.shape
    c = proj.out_features // (st * sh * sw)
    k = proj.in_features
    weight = proj.weight.view(c, st, sh, sw, k).permute(1, 2, 3, 0, 4).reshape(-1, k)
    bias = None if proj.bias is None else proj.bias.view(c, st, sh, sw).permute(1, 2, 3, 0).reshape(-1)
    y = F.linear(x.permute(0, 2, 3, 4, 1), weight, bias)  # (B, T, H, W, st * sh * sw * C)
    out = torch.empty(
        (b, c, t * st, h * sh, w * sw), dtype=y.dtype, device=y.device, memory_format=torch.channels_last_3d
    )
    target = out.permute(0, 2, 3, 4, 1).view(b, t, st, h, sh, w, sw, c)
    target.copy_(y.view(b, t, h, w, st, sh, sw, c).permute(0, 1, 4, 2, 5, 3, 6, 7))
    return out


class MochiUpBlock:
    """Mixin for diffusers' `MochiUpBlock3D` (`forward(hidden_states, conv_cache)` -> `(output, caches)`)."""

    def forward(self, hidden_states, conv_cache=None):
        if not tier.enabled() or torch.is_grad_enabled():
            return super().forward(hidden_states, conv_cache)
        new_conv_cache = {}
        conv_cache = conv_cache or {}
        for i, resnet in enumerate(self.resnets):
            key = f"resnet_{i}"
            hidden_states, new_conv_cache[key] = resnet(hidden_states, conv_cache=conv_cache.get(key))
        phases = (self.temporal_expansion, self.spatial_expansion, self.spatial_expansion)
        return depth_to_space(self.proj, hidden_states, phases), new_conv_cache
