"""A ViT decoder over a clip's latent voxels, sharded by latent rows (or columns): each rank holds the
tokens of its rows of every frame, with their global rotary positions, and the suffix tokens
(registers and the zero token) as diffusers appends them; every attention gathers the patch tokens'
keys and values from all ranks in diffusers' global token order, so each local query attends over
the whole clip exactly as unsharded (MiniMax-H3's `MiniMaxH3VideoViTDecoder3d`).

Outside a sharded request both mixins run diffusers' own forward.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from ..runtime.spatial import HEIGHT, ShardContext, current

# (frames, rows, cols) of the local patch tokens of the decoder call running on this rank
_grid: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar("vaeshard_tokens", default=None)


@contextlib.contextmanager
def _tokens(grid: tuple[int, int, int]):
    token = _grid.set(grid)
    try:
        yield
    finally:
        _grid.reset(token)


def global_positions(ctx: ShardContext, sizes: tuple[int, int, int], device) -> torch.Tensor:
    """diffusers' position ids (t, h, w in [-1, 1)) of the local tokens of `sizes` (frames, rows,
    cols): the whole clip's grid along the sharded axis, cut to this rank's rows (columns)."""
    axis = 1 if ctx.axis == HEIGHT else 2
    extents = ctx.extents_at(sizes[axis])
    start = sum(extents[: ctx.comm.rank])
    whole = list(sizes)
    whole[axis] = sum(extents)
    grids = [2.0 * (torch.arange(0.5, size, dtype=torch.float32, device=device) / size) - 1.0 for size in whole]
    grids[axis] = grids[axis][start : start + sizes[axis]]
    return torch.stack(torch.meshgrid(*grids, indexing="ij"), dim=-1).flatten(0, 2)


def gather_tokens(ctx: ShardContext, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """(B, local patch tokens + suffix, ...) -> (B, every patch token + suffix, ...): the patch
    tokens of every rank in global (t, h, w) order, then this rank's suffix (alike on every rank)."""
    frames, rows, cols = grid
    n = frames * rows * cols
    patches = x[:, :n].unflatten(1, (frames, rows, cols))
    whole = ctx.gather(patches, 2 if ctx.axis == HEIGHT else 3)
    return torch.cat([whole.flatten(1, 3), x[:, n:]], dim=1)


def local_positions(sizes: tuple[int, int, int], device) -> torch.Tensor:
    """diffusers' position ids (t, h, w in [-1, 1)) of an unsharded decoder call of `sizes`."""
    grids = [2.0 * (torch.arange(0.5, size, dtype=torch.float32, device=device) / size) - 1.0 for size in sizes]
    return torch.stack(torch.meshgrid(*grids, indexing="ij"), dim=-1).flatten(0, 2)


def vit_forward(decoder, hidden_states, positions=local_positions, run_blocks=None):
    """`MiniMaxH3VideoViTDecoder3d.forward` of `decoder` (diffusers' steps), with the position ids of its
    (frames, rows, cols) from `positions(sizes, device)` and its transformer blocks run by
    `run_blocks(decoder, hidden_states, rotary_emb)` (None: each block's own forward in turn)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    batch_size, num_channels, num_frames, height, width = hidden_states.shape
    hidden_states = hidden_states.permute(0, 2, 3, 4, 1).reshape(batch_size, num_frames * height * width, num_channels)
    hidden_states = decoder.proj_in(hidden_states)
    num_patches = hidden_states.shape[1]
    register_tokens = decoder.register_tokens.expand(batch_size, -1, -1).to(hidden_states.dtype)
    cls_token = torch.zeros_like(hidden_states[:, :1, :])
    hidden_states = torch.cat([hidden_states, register_tokens, cls_token], dim=1)

    position_ids = positions((num_frames, height, width), hidden_states.device)
    position_ids = position_ids.unsqueeze(0).expand(batch_size, -1, -1)
    suffix_ids = position_ids.new_zeros((batch_size, decoder.num_register_tokens + 1, 3))
    position_ids = torch.cat([position_ids, suffix_ids], dim=1)
    rotary_emb = decoder.rope(position_ids)

    if run_blocks is None:
        for block in decoder.transformer_blocks:
            hidden_states = block(hidden_states, rotary_emb)
    else:
        hidden_states = run_blocks(decoder, hidden_states, rotary_emb)

    hidden_states = decoder.norm_out(hidden_states).to(get_parameter_dtype(decoder.proj_out))
    hidden_states = decoder.proj_out(hidden_states)
    hidden_states = hidden_states[:, :num_patches, :]
    p, pt = decoder.patch_size, decoder.patch_size_t
    hidden_states = hidden_states.view(batch_size, num_frames, height, width, decoder.out_channels, pt, p, p)
    hidden_states = hidden_states.permute(0, 4, 1, 5, 2, 6, 3, 7).contiguous()
    return hidden_states.reshape(batch_size, decoder.out_channels, num_frames * pt, height * p, width * p)


class ShardedViTDecoder:
    """Mixin for `MiniMaxH3VideoViTDecoder3d`: diffusers' forward on a rank's latent rows, with the
    rotary positions of those rows in the whole clip; its attentions (`ShardedTokenAttention`) read
    the local token grid."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states)
        grid = tuple(hidden_states.shape[2:])
        with _tokens(grid):
            return vit_forward(self, hidden_states, lambda sizes, device: global_positions(ctx, sizes, device))


class ShardedTokenAttention:
    """Mixin for `MiniMaxH3VideoAttention`: diffusers' processor with the keys and values (after
    their norm and rotary embedding) of every rank's patch tokens, in global order."""

    def forward(self, hidden_states, rotary_emb=None):
        ctx, grid = current(), _grid.get()
        if ctx is None or grid is None:
            return super().forward(hidden_states, rotary_emb)
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        attn = self
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        query = attn.norm_q(query.float()).to(query.dtype)
        key = attn.norm_k(key.float()).to(key.dtype)
        if rotary_emb is not None:
            cos, sin = rotary_emb
            cos = cos.to(query.dtype)
            sin = sin.to(query.dtype)
            rotary_dim = cos.shape[-1]
            query_rotary, query_pass = query[..., :rotary_dim], query[..., rotary_dim:]
            key_rotary, key_pass = key[..., :rotary_dim], key[..., rotary_dim:]
            query_first, query_second = query_rotary.chunk(2, dim=-1)
            key_first, key_second = key_rotary.chunk(2, dim=-1)
            query_rotated = torch.cat([-query_second, query_first], dim=-1)
            key_rotated = torch.cat([-key_second, key_first], dim=-1)
            query = torch.cat([query_rotary * cos + query_rotated * sin, query_pass], dim=-1)
            key = torch.cat([key_rotary * cos + key_rotated * sin, key_pass], dim=-1)

        key, value = gather_tokens(ctx, key, grid), gather_tokens(ctx, value, grid)
        processor = attn.processor
        hidden_states = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=None,
            backend=processor._attention_backend,
            parallel_config=processor._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        return attn.to_out[0](hidden_states)
