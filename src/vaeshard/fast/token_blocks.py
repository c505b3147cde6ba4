"""MiniMax-H3's ViT decoder blocks in the fast tier: diffusers' `MiniMaxH3VideoTransformerBlock.forward`
and its attention processor (`MiniMaxH3VideoAttnProcessor.__call__`), mirrored with the elementwise
passes between their matrix products fused (kernels/token_block.py):

    y = norm1(h)                                         # the first block's, alone
    per block:
        q, k = norm + rotary of to_q(y), to_k(y)         # one pass each (qk_norm_rope)
        a = to_out(SDPA(q, k, to_v(y)))                  # PyTorch's scaled-dot-product attention
        h, y = h + a * scale1, norm2(...)                # one pass (residual_rms)
        f = ff(y)                                        # diffusers' modules, SwiGLU's product fused
        h, y = h + f * scale2, next block's norm1(...)   # one pass; the last block: h + f * scale2

The linear layers are diffusers' own modules; the residual stream takes the dtype diffusers promotes
it to (float32 through the float32 scales of a checkpoint loaded in bf16). Attention runs PyTorch's
scaled-dot-product attention, which diffusers' default (native) attention backend calls; a backend
set with `set_attention_backend` is not used here. Where the kernels cannot run (no Triton, a CPU
tensor outside Triton's interpreter, a norm without weights, a width that is not a power of two),
each block runs diffusers' forward. tests/test_families/test_drift.py guards the mirrored functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import token_block


def _takes(decoder, hidden_states, rotary_emb) -> bool:
    blocks = decoder.transformer_blocks
    if len(blocks) == 0 or rotary_emb is None or not token_block.takes_rows(hidden_states.contiguous()):
        return False
    cos = rotary_emb[0]
    for block in blocks:
        attn = block.attn
        d = attn.to_q.out_features // attn.heads
        norms = (block.norm1, block.norm2)
        if any(n.weight is None for n in norms) or cos.shape[-1] > d or cos.shape[-1] % 2:
            return False
        if attn.norm_q.weight is not None or attn.norm_k.weight is not None:
            return False
    return cos.stride(-1) == 1 and cos.stride() == rotary_emb[1].stride()


def _feed_forward(ff, y: torch.Tensor) -> torch.Tensor:
    """diffusers' `FeedForward.forward` (its modules in turn), a `SwiGLU` activation's product fused
    (`token_block.swiglu`) after its own projection."""
    from diffusers.models.activations import SwiGLU

    for module in ff.net:
        if isinstance(module, SwiGLU) and type(module.activation) is torch.nn.SiLU:
            y = token_block.swiglu(module.proj(y))
        else:
            y = module(y)
    return y


def run_blocks(decoder, hidden_states: torch.Tensor, rotary_emb) -> torch.Tensor:
    """`decoder.transformer_blocks` over `hidden_states` (B, L, dim) with diffusers' rotary embedding
    (cos, sin), as diffusers' blocks compute them (module docstring); returns the residual stream."""
    if not _takes(decoder, hidden_states, rotary_emb):
        for block in decoder.transformer_blocks:
            hidden_states = block(hidden_states, rotary_emb)
        return hidden_states
    cos, sin = rotary_emb
    blocks = decoder.transformer_blocks
    first = blocks[0]
    h, y = token_block.residual_rms(
        hidden_states.contiguous(), None, None, first.norm1.weight, first.norm1.eps, first.attn.to_q.weight.dtype
    )
    for i, block in enumerate(blocks):
        attn = block.attn
        q = token_block.qk_norm_rope(attn.to_q(y), attn.heads, cos, sin, attn.norm_q.eps)
        k = token_block.qk_norm_rope(attn.to_k(y), attn.heads, cos, sin, attn.norm_k.eps)
        v = attn.to_v(y).unflatten(2, (attn.heads, -1))
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        a = attn.to_out[0](a.transpose(1, 2).flatten(2, 3))
        # in place where the stream already has its updated dtype (diffusers' promotes it to float32
        # at the first update of a bf16 model loaded with its float32 scales)
        same = h.dtype == token_block.stream_dtype(h, a, block.scale1)
        compute = attn.to_q.weight.dtype
        h, y = token_block.residual_rms(
            h, a, block.scale1, block.norm2.weight, block.norm2.eps, compute, h if same else None
        )
        f = _feed_forward(block.ff, y)
        if i + 1 == len(blocks):
            h = h + f * block.scale2
        else:
            nxt = blocks[i + 1]
            same = h.dtype == token_block.stream_dtype(h, f, block.scale2)
            h, y = token_block.residual_rms(
                h, f, block.scale2, nxt.norm1.weight, nxt.norm1.eps, nxt.attn.to_q.weight.dtype, h if same else None
            )
    return h
