"""Halo rows for causal Conv3d modules that pad by replication: HunyuanVideo's and HunyuanVideo 1.5's
causal convolutions (`HaloReplicateCausalConv3d`) and diffusers' `CogVideoXCausalConv3d` in its
"replicate" mode, Mochi 1's, whose forward also takes and returns a time cache
(`HaloReplicateCachedCausalConv3d`).

The module pads its input with `F.pad(..., mode="replicate")` by `time_causal_padding` (time: the
first frame repeated in front; height and width: the edge rows and columns repeated) and then runs
an unpadded nn.Conv3d child (`conv`). Replication pads each axis by clamping indices along it alone,
so the axes can be padded one after the other: sharded, the sharded axis is extended by the rows of
the neighbouring ranks, with the edge row repeated at the global edges only, then the other axes
are padded as in the original. Time is never sharded, so the time padding is diffusers' own.

A child strided along the sharded axis (the encoders' downsamplers: stride 2, pads summing to the
kernel less one) gives each rank its own output rows where every rank's extent is a multiple of the
stride (shards are whole latent rows, so this holds above the latent's resolution); otherwise it
raises. `CogVideoXCausalConv3d`'s "constant" mode (CogVideoX's, and Mochi's after diffusers'
`_enable_framewise_decoding`) pads from its cache and its child's zero padding instead:
layers/cached_causal_conv.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current


class HaloReplicateCausalConv3d:
    """Mixin for a module with `time_causal_padding` (w_left, w_right, h_top, h_bottom, t_front,
    t_back), `pad_mode` "replicate" and an unpadded Conv3d child `conv`. Outside a sharded request the
    original forward runs."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states)
        return self._sharded_forward(ctx, hidden_states)

    def _sharded_forward(self, ctx, hidden_states):
        dim = ctx.dim(hidden_states)
        stride = self.conv.stride[dim - 2]
        if stride > 1 and any(e % stride for e in ctx.extents_at(hidden_states.shape[dim])):
            raise RuntimeError(
                f"a causal convolution of stride {stride} along the sharded {ctx.axis} cannot run on shards of "
                f"{ctx.extents_at(hidden_states.shape[dim])} rows: each must be a multiple of the stride"
            )
        padding = list(self.time_causal_padding)
        slot = 2 if ctx.axis == HEIGHT else 0
        before, after = padding[slot], padding[slot + 1]
        x = replicate_halo(ctx, hidden_states, before, after)
        padding[slot] = padding[slot + 1] = 0
        return self.conv(F.pad(x, tuple(padding), mode="replicate"))


class HaloReplicateCachedCausalConv3d(HaloReplicateCausalConv3d):
    """Mixin for `CogVideoXCausalConv3d` (`forward(inputs, conv_cache=None)` -> `(output, cache)`) in its
    "replicate" mode, where diffusers ignores the cache and returns None for it. Sharded in another
    mode it raises (use mode='tile')."""

    def forward(self, inputs, conv_cache=None):
        ctx = current()
        if ctx is None:
            return super(HaloReplicateCausalConv3d, self).forward(inputs, conv_cache)
        if self.pad_mode != "replicate":
            raise ValueError(
                f"vaeshard shards {type(self).__name__} only in its 'replicate' padding mode, not {self.pad_mode!r} "
                "(frame-wise decoding); use mode='tile'"
            )
        return self._sharded_forward(ctx, inputs), None


def replicate_causal_problem(module) -> str | None:
    """What keeps this mixin from sharding `module` exactly, or None: it must pad by replication,
    its child must not pad itself nor be dilated in space, and along each spatial axis the padding
    must be 'same' (kernel - 1, any stride) or kernel - stride (a patchify: kernel = stride, none)."""
    conv = module.conv
    w_left, w_right, h_top, h_bottom = module.time_causal_padding[:4]
    if module.pad_mode != "replicate":
        return f"a causal convolution padding in mode {module.pad_mode!r}, not 'replicate'"
    if any(conv.padding) or conv.dilation[1:] != (1, 1):
        return "a causal convolution whose child pads itself or is dilated in space"
    spatial = zip(conv.kernel_size[1:], conv.stride[1:], (h_top + h_bottom, w_left + w_right))
    for k, stride, pads in spatial:
        if pads != k - 1 and k - pads != stride:
            return "a causal convolution padded neither 'same' nor as a patchify (kernel - padding = stride)"
    return None


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
