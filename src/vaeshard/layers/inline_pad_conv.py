"""Halo rows for a stride-2 convolution whose caller zero-pads one row and one column after the map
inline (`F.pad(x, (0, 1, 0, 1))`, then an unpadded 3x3 stride-2 nn.Conv2d): CogVideoX's
`CogVideoXDownsample3D` (and the same pattern as AutoencoderKL's `Downsample2D`).

Contract: the convolution's input is the caller's padded map, which only the convolution reads, with
one zero row after the last on the sharded axis. Sharded, that row is the next rank's first row
(the zero stays at the global end); the other axis keeps its zero column. Output row i reads input
rows 2 i .. 2 i + 2, so with every shard starting on an even row (shards of whole latent rows: at
each downsampling level a shard's rows are a multiple of 2) each rank computes exactly its rows of
the whole map's output from its own rows and that one row.
"""

from __future__ import annotations

from ..runtime.spatial import current


class HaloInlinePadConv2d:
    """Mixin for an unpadded 3x3 stride-2 nn.Conv2d behind an inline (0, 1, 0, 1) zero pad."""

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        dim = ctx.dim(x)
        rows = x.shape[dim] - 1  # this rank's rows; the last row is the caller's zero pad
        if rows % 2:
            raise RuntimeError(f"a shard of {rows} rows before a stride-2 convolution: shards must start on even rows")
        _, after = ctx.neighbour_rows(x.narrow(dim, 0, rows), dim, 0, 1)
        if after is not None:  # not the last rank: the next rank's first row replaces the zero pad
            x.narrow(dim, rows, 1).copy_(after)
        return super().forward(x)
