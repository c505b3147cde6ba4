"""Halo-aware layers and the request-scoped shard context for spatial-shard decode.

Installed once per VAE by swapping the class of selected leaf modules for a subclass defined here.
The subclasses keep their parameters, names and state_dict; every forward first asks the current
`ShardContext`: outside a sharded request there is none and the exact original computation runs,
so direct and tile requests are unaffected by the installation.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

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

    def dim(self, x: torch.Tensor) -> int:
        """The tensor dim of the sharded axis: H and W are the last two dims of 4-D and 5-D maps."""
        return x.ndim - 2 if self.axis == HEIGHT else x.ndim - 1

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
        return self.comm.halo_pad(x, dim, before, after, self.num_ranks)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole extent of the sharded axis, assembled in global order on every shard rank."""
        return self.comm.all_gather_along(x, dim, self.extents_at(x.shape[dim]))


_current: contextvars.ContextVar[ShardContext | None] = contextvars.ContextVar("vaeshard_shard", default=None)


def current() -> ShardContext | None:
    return _current.get()


@contextlib.contextmanager
def sharding(ctx: ShardContext):
    """Make `ctx` the shard context of this request; always reset, also when the decode raises."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


# --- halo-aware layers ------------------------------------------------------------------------------


class HaloCausalConv3d:
    """Mixin for Wan-style causal Conv3d (explicit `_padding` applied by F.pad, optional time cache).

    Sharded: the time cache is prepended as in the original, then the sharded axis is extended by
    exactly the rows its zero padding would have covered, taken from the neighbouring ranks (zeros
    at the global edges), and the convolution runs without padding on that axis.
    """

    def forward(self, x, cache_x=None):
        ctx = current()
        if ctx is None:
            return super().forward(x, cache_x)
        padding = list(self._padding)  # (w_left, w_right, h_top, h_bottom, t_front, t_back)
        if cache_x is not None and self._padding[4] > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            padding[4] -= cache_x.shape[2]
        slot = 2 if ctx.axis == HEIGHT else 0
        x = ctx.halo_pad(x, ctx.dim(x), padding[slot], padding[slot + 1])
        padding[slot] = padding[slot + 1] = 0
        x = F.pad(x, padding)
        return nn.Conv3d.forward(self, x)


class HaloConv2d:
    """Mixin for a stride-1 zero-padded nn.Conv2d: halo rows replace the padding on the sharded axis."""

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        pad_h, pad_w = self.padding
        if ctx.axis == HEIGHT:
            x = ctx.halo_pad(x, ctx.dim(x), pad_h, pad_h)
            padding = (0, pad_w)
        else:
            x = ctx.halo_pad(x, ctx.dim(x), pad_w, pad_w)
            padding = (pad_h, 0)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class HaloZeroPad2d:
    """Mixin for nn.ZeroPad2d before a strided conv (Wan's downsamplers pad (0, 1, 0, 1)).

    On the sharded axis the pad rows of an interior shard boundary are the neighbour's rows; the
    global edges keep their zeros. Shards start on even rows at every level (the split is in whole
    latent rows), so the strided convolution that follows lands on the global stride lattice.
    """

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        left, right, top, bottom = self.padding
        if ctx.axis == HEIGHT:
            x = ctx.halo_pad(x, ctx.dim(x), top, bottom)
            return F.pad(x, (left, right, 0, 0))
        x = ctx.halo_pad(x, ctx.dim(x), left, right)
        return F.pad(x, (0, 0, top, bottom))


class WholeFrameAttention:
    """Mixin for the Wan-style single-head spatial attention block (norm, to_qkv, sdpa, proj).

    Queries stay local; keys and values are gathered from every shard in global order, so each local
    query attends over the whole frame exactly as unsharded.
    """

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        identity = x
        b, c, t, h, w = x.shape
        x_nchw = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(x_nchw))  # (b*t, 3c, h, w), per pixel: local
        q, k, v = qkv.chunk(3, dim=1)
        k = ctx.gather(k, ctx.dim(k))
        v = ctx.gather(v, ctx.dim(v))
        q_tokens = q.reshape(b * t, 1, c, -1).transpose(-1, -2)
        k_tokens = k.reshape(b * t, 1, c, -1).transpose(-1, -2)
        v_tokens = v.reshape(b * t, 1, c, -1).transpose(-1, -2)
        out = F.scaled_dot_product_attention(q_tokens, k_tokens, v_tokens)
        out = out.squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)
        out = self.proj(out)
        return out.view(b, t, c, h, w).permute(0, 2, 1, 3, 4) + identity


_SUBCLASS_CACHE: dict[tuple[type, type], type] = {}


def _halo_subclass(mixin: type, base: type) -> type:
    key = (mixin, base)
    if key not in _SUBCLASS_CACHE:
        _SUBCLASS_CACHE[key] = type(base.__name__, (mixin, base), {"__module__": base.__module__, "_vaeshard_base": base})
    return _SUBCLASS_CACHE[key]


def swap(module: nn.Module, mixin: type) -> None:
    """Give `module` the halo-aware behaviour of `mixin`; parameters and names are untouched."""
    base = type(module)
    if getattr(base, "_vaeshard_base", None) is not None:
        return
    module.__class__ = _halo_subclass(mixin, base)


def unswap(module: nn.Module) -> None:
    base = getattr(type(module), "_vaeshard_base", None)
    if base is not None:
        module.__class__ = base


def is_swapped(module: nn.Module) -> bool:
    return getattr(type(module), "_vaeshard_base", None) is not None


def split_extents(extent: int, num_ranks: int) -> list[int]:
    """Consecutive near-equal slices: 90 over 4 -> [23, 23, 22, 22]."""
    base, extra = divmod(extent, num_ranks)
    return [base + (1 if r < extra else 0) for r in range(num_ranks)]
