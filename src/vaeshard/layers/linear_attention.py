"""Sana's multi-scale linear attention (DC-AE's EfficientViT blocks) on a sharded feature map, exactly.

diffusers' `SanaMultiscaleAttnProcessor2_0` computes, per head, `V_pad Kᵀ Q` with V padded by a row
of ones, then divides by the last row (Σ K · q). `V_pad Kᵀ` is a (d+1) x d matrix summed over every
pixel, so each rank computes its partial sum over its own pixels, the ranks add them (one all-reduce
of fp32 per attention layer: head_dim + 1 rows by head_dim columns per head, whatever the map's
size) and each rank applies the sum to its own queries. No feature map crosses ranks: only the
multi-scale depthwise convolutions' halo rows (their HaloConv2d) and this small matrix.

Small maps (at most `attention_head_dim` pixels) take diffusers' quadratic branch instead; the
switch reads the whole map's size on every rank, never the slice's. Sharded, that branch gathers
the keys and values (the map has at most `attention_head_dim` pixels, so this is a few numbers)
and keeps the queries local, each query column normalized over every key as unsharded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.comm import all_reduce_sum
from ..runtime.spatial import HEIGHT, current

_PROCESSORS = ("SanaMultiscaleAttnProcessor2_0",)


class ShardedLinearAttention:
    """Mixin for diffusers' `SanaMultiscaleLinearAttention`: outside a sharded request its own
    processor runs; sharded, the processor's steps run here with the whole map's score matrix
    (mirrors `SanaMultiscaleAttnProcessor2_0.__call__` and the two `apply_*_attention` methods)."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states)
        processor = type(self.processor).__name__
        if processor not in _PROCESSORS or hidden_states.ndim != 4:
            raise ValueError(
                f"vaeshard shards Sana's multi-scale linear attention only with diffusers' "
                f"{', '.join(_PROCESSORS)} on a 4-D map; this one has {processor} on a {hidden_states.ndim}-D "
                "input. Restore the default processor or use mode='tile'"
            )
        batch, _, height, width = hidden_states.shape
        whole = sum(ctx.extents_at(hidden_states.shape[ctx.dim(hidden_states)]))
        global_pixels = whole * width if ctx.axis == HEIGHT else height * whole
        use_linear_attention = global_pixels > self.attention_head_dim  # the whole map's size, as unsharded

        residual = hidden_states
        original_dtype = hidden_states.dtype
        tokens = hidden_states.movedim(1, -1)
        qkv = torch.cat([self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)], dim=3).movedim(-1, 1)
        # each projection's depthwise convolution is a HaloConv2d: it takes its halo rows itself
        qkv = torch.cat([qkv] + [block(qkv) for block in self.to_qkv_multiscale], dim=1)
        if use_linear_attention:
            qkv = qkv.to(dtype=torch.float32)
        qkv = qkv.reshape(batch, -1, 3 * self.attention_head_dim, height * width)
        query, key, value = qkv.chunk(3, dim=2)
        query = self.nonlinearity(query)
        key = self.nonlinearity(key)

        if use_linear_attention:
            out = self._linear(ctx, query, key, value).to(dtype=original_dtype)
        else:
            out = self._quadratic(ctx, query, key, value, (height, width))

        out = torch.reshape(out, (batch, -1, height, width))
        out = self.to_out(out.movedim(1, -1)).movedim(-1, 1)
        if self.norm_type == "rms_norm":
            out = self.norm_out(out.movedim(1, -1)).movedim(-1, 1)
        else:
            out = self.norm_out(out)  # BatchNorm2d in eval: per channel (EvalBatchNorm2d refuses training)
        if self.residual_connection:
            out = out + residual
        return out

    def _linear(self, ctx, query, key, value):
        """`apply_linear_attention` with V_pad Kᵀ summed over every rank's pixels (one all-reduce)."""
        value = F.pad(value, (0, 0, 0, 1), mode="constant", value=1)  # the ones row: its scores are Σ K
        scores = torch.matmul(value, key.transpose(-1, -2))  # this rank's pixels' part of the sum
        scores = all_reduce_sum(ctx.comm, scores.to(dtype=torch.float32))
        out = torch.matmul(scores, query).to(dtype=torch.float32)
        return out[:, :, :-1] / (out[:, :, -1:] + self.eps)

    def _quadratic(self, ctx, query, key, value, local_hw):
        """`apply_quadratic_attention` with every rank's keys and values (a map of at most
        `attention_head_dim` pixels) and this rank's queries."""
        key, value = (_whole_map(ctx, t, local_hw) for t in (key, value))
        scores = torch.matmul(key.transpose(-1, -2), query).to(dtype=torch.float32)
        scores = scores / (torch.sum(scores, dim=2, keepdim=True) + self.eps)
        return torch.matmul(value, scores.to(value.dtype))


def _whole_map(ctx, t, local_hw):
    """(B, heads, d, h*w) of this rank's pixels -> (B, heads, d, H*W) of the whole map, row-major."""
    batch, heads, dim, _ = t.shape
    map_bchw = t.reshape(batch, heads * dim, *local_hw)
    whole = ctx.gather(map_bchw, ctx.dim(map_bchw))
    return whole.reshape(batch, heads, dim, -1)


class EvalBatchNorm2d:
    """Mixin for nn.BatchNorm2d (DC-AE decoders' ResBlocks): in eval it scales each channel by its
    running statistics, per pixel, so a slice computes exactly its part. In training mode it would
    take the statistics of the batch's whole map; sharded, that is refused rather than computed
    from the slice."""

    def forward(self, x):
        if current() is not None and (self.training or self.running_mean is None):
            raise ValueError(
                "vaeshard shards a BatchNorm2d only with running statistics in eval mode (per channel); this one "
                "would normalize by the batch's whole-map statistics (training mode, or no running statistics): "
                "call vae.eval(), or use mode='tile'"
            )
        return super().forward(x)
