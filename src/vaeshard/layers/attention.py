"""Attention layers of sharded and fast-tier requests: queries stay on their rank, keys and values
cover the whole frame (or image)."""

from __future__ import annotations

from ..runtime.spatial import current
from . import tier as fast_tier


class WholeFrameAttention:
    """Mixin for the Wan-style single-head spatial attention block (norm, to_qkv, sdpa, proj).

    Queries stay local; keys and values are gathered from every shard in global order, so each local
    query attends over the whole frame exactly as unsharded. In the fast tier, sharded or not, the
    attention itself is `tier.attention` (vaeshard's own on CUDA).
    """

    def forward(self, x):
        ctx = current()
        if ctx is None and not fast_tier.enabled():
            return super().forward(x)
        identity = x
        b, c, t, h, w = x.shape
        x_nchw = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(x_nchw))  # (b*t, 3c, h, w), per pixel: local
        q, k, v = qkv.chunk(3, dim=1)
        if ctx is not None:
            k, v = ctx.gather(k, ctx.dim(k)), ctx.gather(v, ctx.dim(v))  # whole frame, global order

        def tokens(m):  # (b*t, c, h, w) -> (b*t, 1, h*w, c), the contiguous layout diffusers feeds sdpa
            return m.reshape(b * t, 1, c, -1).permute(0, 1, 3, 2).contiguous()

        out = fast_tier.attention(tokens(q), tokens(k), tokens(v))
        out = out.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        out = self.proj(out)
        return out.view(b, t, c, h, w).permute(0, 2, 1, 3, 4) + identity


# Processors known to compute keys and values from `encoder_hidden_states` when it is given and
# to apply the module's `group_norm` to the query side only.
_WHOLE_IMAGE_PROCESSORS = ("AttnProcessor2_0", "AttnProcessor")


class WholeImageAttention:
    """Mixin for diffusers' `Attention` used as self-attention over a 4-D map (the VAE mid-block).

    Sharded: the normed slice (GroupNorm with whole-map statistics) is gathered from every rank in
    global order and handed to diffusers' own processor as `encoder_hidden_states`, so keys and values
    cover the whole image while queries, the output projection and the residual stay local. The
    processor normalizes the query side again itself; that second GroupNorm is the price of running
    diffusers' processor unchanged.
    """

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states, encoder_hidden_states, attention_mask, **kwargs)
        processor = type(self.processor).__name__
        if (
            hidden_states.ndim != 4
            or encoder_hidden_states is not None
            or attention_mask is not None
            or getattr(self, "spatial_norm", None) is not None
            or getattr(self, "norm_cross", None)
            or processor not in _WHOLE_IMAGE_PROCESSORS
        ):
            raise ValueError(
                f"vaeshard shards only plain spatial self-attention (4-D input, no mask, no spatial norm, "
                f"processor one of {', '.join(_WHOLE_IMAGE_PROCESSORS)}); this one has processor {processor}. "
                "Call vae.set_default_attn_processor() or use mode='tile'"
            )
        b, c, h, w = hidden_states.shape
        tokens_bcn = hidden_states.reshape(b, c, h * w)
        if self.group_norm is not None:
            tokens_bcn = self.group_norm(tokens_bcn)
        whole_bchw = ctx.gather(tokens_bcn.reshape(b, c, h, w), ctx.dim(hidden_states))
        context_bnc = whole_bchw.flatten(2).transpose(1, 2)
        return super().forward(hidden_states, encoder_hidden_states=context_bnc, **kwargs)
