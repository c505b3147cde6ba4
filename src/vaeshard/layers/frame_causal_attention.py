"""Frame-causal attention over a whole video, sharded: HunyuanVideo 1.5's mid-block attention block,
and HunyuanVideo's mid-block, whose diffusers `Attention` gets a causal frame mask.

diffusers computes both as one scaled-dot-product attention over all T*H*W tokens with a (T*H*W)^2
mask that lets a token of frame i see every token of frames 0..i. Here the mask is never built, and
no rank holds more than one frame's keys and values: the keys and values of the whole frame j are
gathered from every rank (in global order), and every query frame i >= j that sees them folds them
into a running softmax (its running maximum, sum of weights and weighted values, in float32), the
same softmax as the masked one (masked keys contribute exactly zero to it) up to rounding. Queries,
the running sums and the output stay on their rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import current
from . import tier as fast_tier

# what a family's fast tier runs here instead of diffusers' layer, as `plan().explain()` says it
FAST_NOTE = (
    "attention",
    "the mid-block attention frame by frame, each query frame over the frames up to it, without diffusers' "
    "(T*H*W)^2 mask (layers/frame_causal_attention.py)",
)

# The most attention scores (query rows x keys, over batch and heads) one matmul computes: the query
# rows are taken in chunks below it, as the scores of a chunk are materialized (in float32).
SCORES_PER_CALL = 1 << 26


class FrameCausalAttention:
    """Mixin for a single-head attention block over (B, C, T, H, W) with `norm` (per pixel),
    1x1x1 convolutions `to_q`, `to_k`, `to_v`, `proj_out`, and a residual: frame i's queries see
    frames 0..i (HunyuanVideo 1.5). Outside a sharded request and the fast tier the original forward
    runs; unsharded in the fast tier, the same computation without gathering (and without the mask)."""

    def forward(self, x):
        ctx = current()
        if ctx is None and not fast_tier.enabled():
            return super().forward(x)
        identity = x
        x = self.norm(x)
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)  # per pixel: local
        del x
        gather = None if ctx is None else (lambda kv: ctx.gather(kv, ctx.dim(kv)))
        out = frame_causal_attention(query, key, value, gather=gather)
        return self.proj_out(out) + identity


class FrameCausalMidBlock:
    """Mixin for HunyuanVideo's mid-block: `resnets[0]`, then pairs of a diffusers `Attention` (or
    None) and a resnet, the attention over the frames' tokens with a causal frame mask. Sharded, and
    unsharded in the fast tier, each attention is `attention_causal_by_frame` (no mask built); the
    resnets' layers are swapped themselves. Otherwise the original forward runs."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None and not fast_tier.enabled():
            return super().forward(hidden_states)
        hidden_states = self.resnets[0](hidden_states)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            if attn is not None:
                hidden_states = attention_causal_by_frame(ctx, attn, hidden_states)
            hidden_states = resnet(hidden_states)
        return hidden_states


# The processors whose computation `attention_causal_by_frame` follows (AttnProcessor computes the
# same attention with an explicit softmax).
FRAME_CAUSAL_PROCESSORS = ("AttnProcessor2_0", "AttnProcessor")


def unsupported_attention(attn) -> str | None:
    """Why diffusers' `Attention` module `attn` is not the plain self-attention that
    `attention_causal_by_frame` computes (None: it is)."""
    processor = type(getattr(attn, "processor", None)).__name__
    if processor not in FRAME_CAUSAL_PROCESSORS:
        return f"its processor is {processor}, not one of {', '.join(FRAME_CAUSAL_PROCESSORS)}"
    extras = ("spatial_norm", "norm_q", "norm_k", "norm_cross", "add_k_proj", "add_v_proj")
    present = [name for name in extras if getattr(attn, name, None) is not None]
    if present or getattr(attn, "only_cross_attention", False) or getattr(attn, "is_cross_attention", False):
        return f"it is not plain self-attention ({', '.join(present) or 'cross-attention'})"
    if attn.to_q.out_features % attn.heads or attn.to_q.out_features != attn.to_k.out_features:
        return "its heads do not split its projections evenly"
    return None


def attention_causal_by_frame(ctx, attn, x):
    """diffusers' `Attention` (AttnProcessor2_0's computation) on the (B, C, T, h, w) map `x` as
    HunyuanVideo's mid-block calls it: the map's tokens in (T, H, W) order, frame i seeing frames
    0..i. The GroupNorm (with whole-video statistics when swapped), the projections and the
    residual are per token; the attention is `frame_causal_attention` with keys and values of whole
    frames gathered from the shard ranks of `ctx` (None: `x` is the whole map)."""
    why = unsupported_attention(attn)
    if why is not None:
        raise ValueError(f"vaeshard cannot shard this attention: {why}. Call vae.set_default_attn_processor()")
    b, c, t, h, w = x.shape
    residual = hidden = x.permute(0, 2, 3, 4, 1).flatten(1, 3)  # (B, T*h*w, C): the mid-block's layout
    if attn.group_norm is not None:
        hidden = attn.group_norm(hidden.transpose(1, 2)).transpose(1, 2)
    query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    del hidden

    def as_map(tokens):  # (B, T*h*w, C') -> a (B, C', T, h, w) view
        return tokens.unflatten(1, (t, h, w)).permute(0, 4, 1, 2, 3)

    gather = None if ctx is None else (lambda kv: ctx.gather(kv, ctx.dim(kv)))
    out = frame_causal_attention(as_map(query), as_map(key), as_map(value), gather=gather, heads=attn.heads)
    del key, value
    out = out.permute(0, 2, 3, 4, 1).flatten(1, 3).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    if attn.residual_connection:
        out = out + residual
    out = out / attn.rescale_output_factor
    return out.unflatten(1, (t, h, w)).permute(0, 4, 1, 2, 3)


def frame_causal_attention(query, key, value, gather=None, heads: int = 1, scores_per_call: int = SCORES_PER_CALL):
    """Attention of (B, C, T, h, w) queries against keys and values where frame i sees frames 0..i,
    `heads` heads of C // heads channels each (head-major, as diffusers splits them), scaled by
    1/sqrt(C // heads) as scaled_dot_product_attention's default; `gather` maps a rank's (B, 2C, h, w)
    keys and values of one frame to the whole frame's (None: they are whole already).

    Key frames are taken one at a time (one frame's keys and values held at once) and folded into
    each query's running softmax, computed in float32 (or the inputs' dtype if wider). Where the keys
    and values are whole (`gather` None), `frame_causal_sdpa` computes the same instead.
    Returns (B, C, T, h, w) in the queries' dtype."""
    if gather is None:
        return frame_causal_sdpa(query, key, value, heads)
    b, c, t, h, w = query.shape
    d = c // heads
    hw = h * w
    compute = torch.promote_types(query.dtype, torch.float32)

    def per_head(m_bcthw):  # (B, C, T', h', w') -> (B, heads, T'*h'*w', d), contiguous
        return m_bcthw.permute(0, 2, 3, 4, 1).reshape(b, -1, heads, d).transpose(1, 2).to(compute).contiguous()

    q = per_head(query).mul_(d**-0.5)  # the query rows of every frame, frame by frame
    acc = torch.zeros_like(q)  # running sum of weighted values
    top = q.new_full(q.shape[:-1], float("-inf"))  # running maximum score
    total = q.new_zeros(q.shape[:-1])  # running sum of weights
    for j in range(t):
        kv = torch.cat([key[:, :, j], value[:, :, j]], dim=1)
        if gather is not None:
            kv = gather(kv)
        k_j, v_j = per_head(kv[:, :c].unsqueeze(2)), per_head(kv[:, c:].unsqueeze(2))  # (B, heads, n, d)
        del kv
        n = k_j.shape[2]
        k_t = k_j.transpose(-1, -2)
        rows = max(1, scores_per_call // max(1, b * heads * n))
        for r0 in range(j * hw, t * hw, rows):  # the query rows of frames j..T-1: they see frame j
            r1 = min(r0 + rows, t * hw)
            scores = torch.matmul(q[:, :, r0:r1], k_t)  # (B, heads, rows, n)
            old = top[:, :, r0:r1]
            new = torch.maximum(old, scores.amax(dim=-1))
            scores.sub_(new.unsqueeze(-1)).exp_()  # the weights, relative to the new maximum
            rescale = (old - new).exp_()  # of what was summed before (0 where nothing was)
            total[:, :, r0:r1].mul_(rescale).add_(scores.sum(dim=-1))
            acc[:, :, r0:r1].mul_(rescale.unsqueeze(-1)).add_(torch.matmul(scores, v_j))
            old.copy_(new)
            del scores
        del k_j, v_j, k_t
    acc.div_(total.unsqueeze(-1))
    # (B, heads, T*h*w, d) -> (B, C, T, h, w)
    out = acc.transpose(1, 2).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
    return out.to(query.dtype)


def frame_causal_sdpa(query, key, value, heads: int = 1):
    """`frame_causal_attention` of whole (B, C, T, h, w) queries, keys and values: for each query frame
    i, one scaled-dot-product attention (PyTorch's kernels, in the inputs' dtype) against the keys and
    values of frames 0..i, with no mask. The same softmax as diffusers' masked one (its masked keys add
    exactly zero) up to rounding; about half of its products (no masked block is computed), and no
    (T*h*w)^2 mask. Returns (B, C, T, h, w)."""
    b, c, t, h, w = query.shape
    d, hw = c // heads, h * w

    def per_head(m_bcthw):  # (B, C, T, h, w) -> (B, heads, T*h*w, d), contiguous
        return m_bcthw.permute(0, 2, 3, 4, 1).reshape(b, t * hw, heads, d).transpose(1, 2).contiguous()

    q, k, v = per_head(query), per_head(key), per_head(value)
    out = torch.empty_like(q)
    for i in range(t):
        rows, seen = slice(i * hw, (i + 1) * hw), slice(0, (i + 1) * hw)
        out[:, :, rows] = F.scaled_dot_product_attention(q[:, :, rows], k[:, :, seen], v[:, :, seen])
    return out.transpose(1, 2).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
