"""Residual blocks whose last convolution adds the block's input in its bias pass.

diffusers ends these blocks with `conv2(silu(norm2(h))) + residual`: a convolution whose bias PyTorch
adds in a pass of its own, then a pass for the sum. Where the convolution takes its input from the norm
before it (fast/producers.py), its `adding` adds the residual in its bias pass instead (layers/tier.py
`conv_module`: one pass, each add rounded as PyTorch's), the same bits. Mochi's and HunyuanVideo 1.5's
blocks also leave conv1's bias to norm2, which adds it as it reads conv1's output, rounded as the bias
pass would: no pass for it at all. CogVideoX's and HunyuanVideo's blocks add the residual so in the
exact tier too, where the request allows vaeshard's kernels with PyTorch's bits (the same two
roundings), and leave conv1's bias to norm2 there too (kernels/group_norm_same.py
`pre_bias`). Each mixin is its block's diffusers forward step for step, but for computing the shortcut
before the last convolution; the families list it in their mirrors. Outside those tiers, with autograd,
or where the convolution offers no `adding`, the original forward runs.
(LTX's blocks: layers/ltx_resnet.py, which also draws their noise when sharded.)
"""

from __future__ import annotations

import torch

from ..layers import tier
from .producers import (
    FrameGroupNormSiLUIntoConv,
    GroupNormSiLUIntoConv,
    RMSNormSiLUIntoConv,
    SpatialNormSiLUIntoConv,
)

_COG_NORMS = (GroupNormSiLUIntoConv, SpatialNormSiLUIntoConv)  # norms that take a `pre_bias`


def _adds(block, exact_too: bool = False) -> bool:
    """Whether the block's last convolution adds the residual in its bias pass: the fast tier; with
    `exact_too` also the exact tier of a request allowed PyTorch's arithmetic by vaeshard's kernels
    (layers/tier.py `same_kernels`: the convolution then runs as diffusers calls it, without its bias,
    and `add_bias_and_residual_` rounds each add as PyTorch's two passes)."""
    tiers = tier.enabled() or (exact_too and tier.same_kernels())
    return tiers and not torch.is_grad_enabled() and hasattr(block.conv2, "adding")


def _leaves_bias(block) -> bool:
    """Whether the block's first convolution can leave its bias to the norm after it: both swapped
    for the fast tier's (fast/causal_conv.py `leaving_bias`, fast/producers.py `pre_bias`)."""
    norms = (FrameGroupNormSiLUIntoConv, RMSNormSiLUIntoConv)
    return hasattr(block.conv1, "leaving_bias") and isinstance(block.norm2, norms)


class MochiResnet:
    """Mixin for diffusers' `MochiResnetBlock3D` (`forward(inputs, conv_cache)` -> `(output, caches)`)."""

    def forward(self, inputs, conv_cache=None):
        if not _adds(self):
            return super().forward(inputs, conv_cache)
        new_conv_cache = {}
        conv_cache = conv_cache or {}
        hidden_states = self.norm1(inputs)
        hidden_states = self.nonlinearity(hidden_states)
        if _leaves_bias(self):  # conv1's bias added by norm2 as it reads conv1's output
            hidden_states, new_conv_cache["conv1"], bias = self.conv1.leaving_bias(
                hidden_states, conv_cache=conv_cache.get("conv1")
            )
            hidden_states = self.norm2(hidden_states, pre_bias=bias)
        else:
            hidden_states, new_conv_cache["conv1"] = self.conv1(hidden_states, conv_cache=conv_cache.get("conv1"))
            hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states, new_conv_cache["conv2"] = self.conv2.adding(
            hidden_states, inputs, conv_cache=conv_cache.get("conv2")
        )
        return hidden_states, new_conv_cache


class CogVideoXResnet:
    """Mixin for diffusers' `CogVideoXResnetBlock3D` (`forward(inputs, temb, zq, conv_cache)` ->
    `(output, caches)`), in either tier (`_adds(exact_too=True)`)."""

    def forward(self, inputs, temb=None, zq=None, conv_cache=None):
        if not _adds(self, exact_too=True):
            return super().forward(inputs, temb, zq, conv_cache)
        new_conv_cache = {}
        conv_cache = conv_cache or {}
        hidden_states = inputs
        if zq is not None:
            hidden_states, new_conv_cache["norm1"] = self.norm1(hidden_states, zq, conv_cache=conv_cache.get("norm1"))
        else:
            hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        bias = None
        if temb is None and hasattr(self.conv1, "leaving_bias") and isinstance(self.norm2, _COG_NORMS):
            # conv1's bias added by norm2 as it reads conv1's output (where conv1 leaves it out)
            hidden_states, new_conv_cache["conv1"], bias = self.conv1.leaving_bias(
                hidden_states, conv_cache=conv_cache.get("conv1")
            )
        else:
            hidden_states, new_conv_cache["conv1"] = self.conv1(hidden_states, conv_cache=conv_cache.get("conv1"))
        if temb is not None:
            hidden_states = hidden_states + self.temb_proj(self.nonlinearity(temb))[:, :, None, None, None]
        if zq is not None:
            hidden_states, new_conv_cache["norm2"] = self.norm2(
                hidden_states, zq, conv_cache=conv_cache.get("norm2"), pre_bias=bias
            )
        else:
            hidden_states = self.norm2(hidden_states, pre_bias=bias)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        if self.in_channels != self.out_channels:
            if self.use_conv_shortcut:
                inputs, new_conv_cache["conv_shortcut"] = self.conv_shortcut(
                    inputs, conv_cache=conv_cache.get("conv_shortcut")
                )
            else:
                inputs = self.conv_shortcut(inputs)
        hidden_states, new_conv_cache["conv2"] = self.conv2.adding(
            hidden_states, inputs, conv_cache=conv_cache.get("conv2")
        )
        return hidden_states, new_conv_cache


class HunyuanVideoResnet:
    """Mixin for diffusers' `HunyuanVideoResnetBlockCausal3D` (`forward(hidden_states)`), in either
    tier (`_adds(exact_too=True)`)."""

    def forward(self, hidden_states):
        if not _adds(self, exact_too=True):
            return super().forward(hidden_states)
        return _resnet(self, hidden_states.contiguous(), (GroupNormSiLUIntoConv,), dropout=True)


class HunyuanVideo15Resnet:
    """Mixin for diffusers' `HunyuanVideo15ResnetBlock` (`forward(hidden_states)`)."""

    def forward(self, hidden_states):
        if not _adds(self):
            return super().forward(hidden_states)
        return _resnet(self, hidden_states, (FrameGroupNormSiLUIntoConv, RMSNormSiLUIntoConv), dropout=False)


def _resnet(block, hidden_states, norms: tuple, dropout: bool):
    """The two HunyuanVideo resnets' forward, each as its diffusers forward runs it (with `dropout`:
    HunyuanVideo's, after norm2's SiLU), but for computing the shortcut before conv2, which adds the
    residual in its bias pass; conv1's bias left to norm2 where conv1 can leave it and norm2 is one of
    `norms` (which take a `pre_bias`)."""
    residual = hidden_states
    hidden_states = block.norm1(hidden_states)
    hidden_states = block.nonlinearity(hidden_states)
    if hasattr(block.conv1, "leaving_bias") and isinstance(block.norm2, norms):
        # conv1's bias added by norm2 as it reads conv1's output (where conv1 leaves it out)
        hidden_states, bias = block.conv1.leaving_bias(hidden_states)
        hidden_states = block.norm2(hidden_states, pre_bias=bias)
    else:
        hidden_states = block.conv1(hidden_states)
        hidden_states = block.norm2(hidden_states)
    hidden_states = block.nonlinearity(hidden_states)
    if dropout:
        hidden_states = block.dropout(hidden_states)
    if block.conv_shortcut is not None:
        residual = block.conv_shortcut(residual)
    return block.conv2.adding(hidden_states, residual)
