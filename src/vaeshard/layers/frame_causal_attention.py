"""Frame-causal attention over a whole video (HunyuanVideo 1.5's mid-block attention), sharded.

diffusers computes it as one scaled-dot-product attention over all T*H*W tokens with a (T*H*W)^2
mask that lets a token of frame i see every token of frames 0..i. Here the mask is never built:
each query frame attends, unmasked, to the keys and values of the frames it may see, which is the
same softmax (masked keys contribute exactly zero to it). Queries stay on their rank; the keys and
values of the whole frame are gathered from every rank one frame at a time, as the query frames
reach them, into one buffer of the whole video's keys and values (what the last frame needs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import current

# The most attention scores (query rows x keys) one call computes: the query rows of a frame are
# taken in chunks below it where the frame's keys are many, for attention kernels that materialize them.
SCORES_PER_CALL = 1 << 26


class FrameCausalAttention:
    """Mixin for a single-head attention block over (B, C, T, H, W) with `norm` (per pixel),
    1x1x1 convolutions `to_q`, `to_k`, `to_v`, `proj_out`, and a residual: frame i's queries see
    frames 0..i. Outside a sharded request the original forward runs."""

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        identity = x
        x = self.norm(x)
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)  # per pixel: local
        del x
        out = frame_causal_attention(query, key, value, gather=lambda kv: ctx.gather(kv, ctx.dim(kv)))
        return self.proj_out(out) + identity


def frame_causal_attention(query, key, value, gather=None, scores_per_call: int = SCORES_PER_CALL):
    """Attention of (B, C, T, h, w) queries against keys and values where frame i sees frames 0..i;
    `gather` maps a rank's (B, 2C, h, w) keys and values of one frame to the whole frame's (None:
    they are whole already). Returns (B, C, T, h, w)."""
    b, c, t, h, w = query.shape
    out = torch.empty_like(query)
    keys = values = None
    for i in range(t):
        kv = torch.cat([key[:, :, i], value[:, :, i]], dim=1)
        if gather is not None:
            kv = gather(kv)
        n = kv.shape[-2] * kv.shape[-1]  # tokens of a whole frame
        if keys is None:
            keys = query.new_empty((b, 1, t * n, c))
            values = query.new_empty((b, 1, t * n, c))
        tokens = kv.flatten(2).transpose(1, 2)  # (B, n, 2C)
        keys[:, 0, i * n : (i + 1) * n] = tokens[..., :c]
        values[:, 0, i * n : (i + 1) * n] = tokens[..., c:]
        del kv, tokens
        q = query[:, :, i].flatten(2).transpose(1, 2).unsqueeze(1).contiguous()  # (B, 1, h*w, C)
        seen = (i + 1) * n
        rows = max(1, scores_per_call // seen)
        parts = [
            F.scaled_dot_product_attention(q[:, :, r : r + rows], keys[:, :, :seen], values[:, :, :seen])
            for r in range(0, q.shape[2], rows)
        ]
        o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        out[:, :, i] = o.squeeze(1).transpose(1, 2).reshape(b, c, h, w)
    return out
