"""Halo rows for a causal Conv3d that pads by replication (HunyuanVideo 1.5's causal convolution).

The module pads its input with `F.pad(..., mode="replicate")` (time: the first frame repeated in
front; height and width: the edge rows and columns repeated) and then runs an unpadded nn.Conv3d
child (`conv`). Replication pads each axis by clamping indices along it alone, so the axes can be
padded one after the other: sharded, the sharded axis is extended by the rows of the neighbouring
ranks, with the edge row repeated at the global edges only, then the other axes are padded as in the
original.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current


class HaloReplicateCausalConv3d:
    """Mixin for a module with `time_causal_padding` (w_left, w_right, h_top, h_bottom, t_front,
    t_back), `pad_mode` "replicate" and an unpadded stride-1 Conv3d child `conv`. Outside a sharded
    request the original forward runs."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states)
        padding = list(self.time_causal_padding)
        slot = 2 if ctx.axis == HEIGHT else 0
        before, after = padding[slot], padding[slot + 1]
        x = replicate_halo(ctx, hidden_states, before, after)
        padding[slot] = padding[slot + 1] = 0
        return self.conv(F.pad(x, tuple(padding), mode=self.pad_mode))


def replicate_halo(ctx, x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """`x` extended along the sharded axis by `before` rows of the previous rank and `after` of the
    next; at the global edges the edge row repeated instead (what replicate padding gives there)."""
    if not before and not after:
        return x
    dim = ctx.dim(x)
    out = ctx.halo_pad(x, dim, before, after)  # zeros at the global edges, overwritten below
    extent = x.shape[dim]
    if ctx.comm.rank == 0 and before:
        out.narrow(dim, 0, before).copy_(x.narrow(dim, 0, 1).expand_as(out.narrow(dim, 0, before)))
    if ctx.comm.rank == ctx.num_ranks - 1 and after:
        edge = out.narrow(dim, before + extent, after)
        edge.copy_(x.narrow(dim, extent - 1, 1).expand_as(edge))
    return out
