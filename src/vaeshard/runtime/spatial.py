"""The spatial strategies' shard: which rank holds which latent rows, its slice and its assembly.

A spatially sharded request runs the untiled model on each rank's slice of whole latent rows (or
columns) inside `sharding(ctx)`; the halo-aware layers ask `current()` for the context (None
outside a sharded request, where they compute exactly as diffusers does). The context is the running
request's `shard` (requests.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from . import requests
from .comm import Comm

HEIGHT, WIDTH = "height", "width"


@dataclass
class ShardContext:
    """One spatially sharded request: ranks 0..num_ranks-1 each hold consecutive latent rows (or columns)."""

    comm: Comm
    axis: str  # HEIGHT or WIDTH
    extents: list[int]  # latent rows (or columns) held by each rank

    @property
    def num_ranks(self) -> int:
        return len(self.extents)

    def dim(self, x: torch.Tensor | torch.Size | list) -> int:
        """The dim of the sharded axis in a tensor (or a shape): H and W are the last two dims of 4-D
        and 5-D maps."""
        ndim = x.ndim if isinstance(x, torch.Tensor) else len(x)
        return ndim - 2 if self.axis == HEIGHT else ndim - 1

    def extents_at(self, local_extent: int) -> list[int]:
        """Every rank's extent at a feature level whose local extent is `local_extent`.

        Decoder levels are integer multiples of the latent grid, so each rank's extent scales alike.
        """
        mine = self.extents[self.comm.rank]
        if local_extent % mine:
            raise RuntimeError(f"feature extent {local_extent} is not a multiple of the shard's latent extent {mine}")
        scale = local_extent // mine
        return [e * scale for e in self.extents]

    def halo_pad(self, x: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
        """Comm.halo_pad over this request's shard ranks."""
        return self.comm.halo_pad(x, dim, before, after, self.num_ranks)

    def fill_halo(self, buf: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
        """Comm.fill_halo over this request's shard ranks."""
        return self.comm.fill_halo(buf, dim, before, after, self.num_ranks)

    def neighbour_rows(self, x: torch.Tensor, dim: int, before: int, after: int):
        """Comm.neighbour_rows over this request's shard ranks."""
        return self.comm.neighbour_rows(x, dim, before, after, self.num_ranks)

    def zero_edges(self, buf: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
        """Zero the first `before` rows of `buf` along `dim` on the first shard rank and the last
        `after` on the last one: the zero padding at the global edges, for a buffer whose halo rows
        were computed rather than received. Returns `buf`."""
        if self.comm.rank == 0 and before:
            buf.narrow(dim, 0, before).zero_()
        if self.comm.rank == self.num_ranks - 1 and after:
            buf.narrow(dim, buf.shape[dim] - after, after).zero_()
        return buf

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole extent of the sharded axis, assembled in global order on every shard rank."""
        return self.comm.all_gather_along(x, dim, self.extents_at(x.shape[dim]))


def current() -> ShardContext | None:
    request = requests.current()
    return None if request is None else request.shard


@contextlib.contextmanager
def sharding(ctx: ShardContext):
    """Make `ctx` the shard context of this request; always reset, also when the decode raises."""
    with requests.scoped(shard=ctx):
        yield ctx


def largest_frame_pixels(x: torch.Tensor) -> int:
    """The pixels of one of `x`'s frames (any level of the model) on the rank that holds the most of
    them in this request: the same number on every rank of a sharded request, so that every rank
    takes the same per-layer choices (tier.layer_frames) and their halo exchanges pair up. Outside a
    sharded request, `x`'s own."""
    ctx = current()
    pixels = x.shape[-2] * x.shape[-1]
    if ctx is None:
        return pixels
    local = x.shape[ctx.dim(x)]
    return pixels // local * max(ctx.extents_at(local))


def split_extents(extent: int, num_ranks: int) -> list[int]:
    """Consecutive near-equal slices: 90 over 4 -> [23, 23, 22, 22]."""
    base, extra = divmod(extent, num_ranks)
    return [base + (1 if r < extra else 0) for r in range(num_ranks)]


def shard_of(comm: Comm, x: torch.Tensor, axis: str, rows_per_latent_row: int):
    """(this rank's slice, the shard context, the sharded dim) of a request: consecutive whole latent
    rows (or columns) of `x` per rank. `rows_per_latent_row`: 1 for a latent, the compression ratio
    for an encode's sample."""
    dim = x.dim() - 2 if axis == HEIGHT else x.dim() - 1
    extents = split_extents(x.shape[dim] // rows_per_latent_row, comm.world)
    start = sum(extents[: comm.rank]) * rows_per_latent_row
    local = x.narrow(dim, start, extents[comm.rank] * rows_per_latent_row)
    return local, ShardContext(comm=comm, axis=axis, extents=extents), dim


def assemble(ctx: ShardContext, out_local: torch.Tensor, dim: int, to_all: bool) -> torch.Tensor | None:
    """Every rank's part of an output in global order (on every rank, or group rank 0 only: the others
    get None)."""
    return ctx.comm.assemble_along(out_local, dim, ctx.extents_at(out_local.shape[dim]), to_all)
