"""Halo-aware nn.Conv3d whose spatial padding is applied by the convolution itself (a mixin swapped
onto diffusers' own module, runtime/swap.py), in any of the padding modes zeros, reflect, replicate.

LTX-Video's causal convolutions pad time themselves (repeating the first frame) and leave the
spatial padding to an inner nn.Conv3d, in zeros (LTX-Video, LTX-2's encoder) or reflect (LTX-2's
decoder) mode. Sharded: the sharded axis is extended by the rows its padding would cover, taken from
the neighbouring ranks, and at the global edges padded as the convolution's own mode pads the whole
map (zeros; the mirror of the rows next to the edge, which may lie on the next rank when a shard
holds fewer rows than the padding needs; the edge row repeated); the convolution then runs without
padding on that axis. Outside a sharded request the original forward runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current

PADDING_MODES = ("zeros", "reflect", "replicate")


class HaloConv3d:
    """Mixin for nn.Conv3d with spatial 'same' padding (odd kernel, padding (k - 1) / 2, any stride)."""

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        slot = 1 if ctx.axis == HEIGHT else 2  # (T, H, W) index of the sharded axis
        pad = self.padding[slot]
        if pad:
            dim = ctx.dim(x)
            before, after = ctx.neighbour_rows(x, dim, pad, pad)
            x = _extend(x, dim, pad, before, after, self.padding_mode)
        padding = list(self.padding)
        padding[slot] = 0
        if self.padding_mode == "zeros":
            return F.conv3d(x, self.weight, self.bias, self.stride, tuple(padding), self.dilation, self.groups)
        pt, ph, pw = padding
        x = F.pad(x, (pw, pw, ph, ph, pt, pt), mode=self.padding_mode)  # the other axes, as torch pads them
        return F.conv3d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _extend(x: torch.Tensor, dim: int, pad: int, before, after, mode: str) -> torch.Tensor:
    """`x` with `pad` rows each side along `dim`: the neighbours' (`before`, `after`; None beyond a
    global edge, where they are made as `mode` pads)."""
    if before is None:
        if mode == "zeros":
            before = x.new_zeros(_rows(x.shape, dim, pad))
        elif mode == "replicate":
            before = x.narrow(dim, 0, 1).expand(_rows(x.shape, dim, pad))
        else:  # reflect: rows pad..1 of the map, the next rank's where this shard is shorter
            ahead = x if after is None else torch.cat([x, after], dim)
            before = ahead.narrow(dim, 1, pad).flip(dim)
    if after is None:
        if mode == "zeros":
            after = x.new_zeros(_rows(x.shape, dim, pad))
        elif mode == "replicate":
            after = x.narrow(dim, x.shape[dim] - 1, 1).expand(_rows(x.shape, dim, pad))
        else:  # reflect: the rows before the last one, mirrored
            behind = torch.cat([before, x], dim) if x.shape[dim] <= pad else x
            after = behind.narrow(dim, behind.shape[dim] - 1 - pad, pad).flip(dim)
    return torch.cat([before, x, after], dim)


def _rows(shape, dim: int, count: int) -> list[int]:
    out = list(shape)
    out[dim] = count
    return out
