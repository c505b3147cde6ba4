"""LTX-Video's and LTX-2's residual block, its forward mirrored (a mixin swapped onto diffusers' own
blocks, runtime/swap.py) for two things diffusers' forward cannot do.

Decoder noise, sharded: a block may inject noise after each of its two convolutions, one (H, W) map
drawn from the RNG (the global one where no generator is given), scaled per channel, added to every
frame. A shard drawing a map of its own extent would draw other numbers than the single-process
decode, and advance the RNG differently. Sharded, every rank draws the map of the whole feature map,
with the same shape, dtype and device as the unsharded decode would, and keeps its own rows (or
columns): with the same RNG state on every rank the result is that of the single-process decode,
and every rank's RNG advances exactly as it would have.

The residual, in the fast tier: where no noise follows the second convolution and that convolution
takes its input from the norm before it (fast/causal_conv.py `adding`), the block's input (after its
shortcut) is added in the convolution's bias pass, one pass over the output instead of two, rounded
as diffusers' separate adds round (kernels/norm.py `add_bias_and_residual_`).

The forward is the diffusers forward step for step (LTX-Video's and LTX-2's, which differ in how the
norm is called and in the `causal` argument of the convolutions), but for computing the shortcut
before the second convolution where the residual goes into it; the families list it in their
mirrors. Otherwise (unsharded without the fast tier, or a block without either) the original
forward runs.
"""

from __future__ import annotations

import torch

from ..runtime.spatial import ShardContext, current
from . import tier as fast_tier


def whole_map_noise(ctx: ShardContext | None, like: torch.Tensor, generator=None) -> torch.Tensor:
    """The (1, H, W) noise map for features `like` (B, C, T, H, W): drawn as diffusers draws it; in a
    sharded request drawn for the whole map and cut to this rank's rows (or columns)."""
    height, width = like.shape[-2:]
    if ctx is None:
        return torch.randn((height, width), generator=generator, device=like.device, dtype=like.dtype)[None]
    dim = ctx.dim(like)
    extents = ctx.extents_at(like.shape[dim])
    start = sum(extents[: ctx.comm.rank])
    whole = (sum(extents), width) if dim == like.ndim - 2 else (height, sum(extents))
    noise = torch.randn(whole, generator=generator, device=like.device, dtype=like.dtype)
    return noise.narrow(dim - like.ndim + 2, start, like.shape[dim])[None]


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    # LTX-2's PerChannelRMSNorm normalizes dim 1 itself; LTX-Video's RMSNorm wants channels last
    if hasattr(norm, "channel_dim"):
        return norm(x)
    return norm(x.movedim(1, -1)).movedim(-1, 1)


class LTXResnet:
    """Mixin for an LTX-Video / LTX-2 residual block (see the module docstring)."""

    def _adds_residual(self) -> bool:
        """Whether this call adds the residual in the second convolution's bias pass: the fast tier,
        inference, no timestep's scale and shift and no noise after that convolution."""
        return (
            fast_tier.enabled()
            and not torch.is_grad_enabled()
            and self.per_channel_scale2 is None
            and self.scale_shift_table is None
            and hasattr(self.conv2, "adding")
        )

    def forward(self, inputs, temb=None, generator=None, **conv_kwargs):
        ctx = current()
        adds = self._adds_residual()
        if not adds and (ctx is None or self.per_channel_scale1 is None):
            return super().forward(inputs, temb, generator, **conv_kwargs)
        hidden_states = _norm(self.norm1, inputs)
        if self.scale_shift_table is not None:
            temb = temb.unflatten(1, (4, -1)) + self.scale_shift_table[None, ..., None, None, None]
            shift_1, scale_1, shift_2, scale_2 = temb.unbind(dim=1)
            hidden_states = hidden_states * (1 + scale_1) + shift_1
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.conv1(hidden_states, **conv_kwargs)
        if self.per_channel_scale1 is not None:
            noise = whole_map_noise(ctx, hidden_states, generator)
            hidden_states = hidden_states + (noise * self.per_channel_scale1)[None, :, None, ...]
        hidden_states = _norm(self.norm2, hidden_states)
        if self.scale_shift_table is not None:
            hidden_states = hidden_states * (1 + scale_2) + shift_2
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        if adds:
            return self.conv2.adding(hidden_states, self._shortcut(inputs), **conv_kwargs)
        hidden_states = self.conv2(hidden_states, **conv_kwargs)
        if self.per_channel_scale2 is not None:
            noise = whole_map_noise(ctx, hidden_states, generator)
            hidden_states = hidden_states + (noise * self.per_channel_scale2)[None, :, None, ...]
        return hidden_states + self._shortcut(inputs)

    def _shortcut(self, inputs):
        if self.norm3 is not None:
            inputs = self.norm3(inputs.movedim(1, -1)).movedim(-1, 1)
        if self.conv_shortcut is not None:
            inputs = self.conv_shortcut(inputs)
        return inputs
