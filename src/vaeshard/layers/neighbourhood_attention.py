"""3-D neighbourhood attention sharded by rows (LTX-2.5's diffusion decoder: diffusers'
`LTX2VideoVaeNeighborhoodAttention`), and the decoder whose stage-5 noise is drawn whole and sliced.

Each query attends to a `kernel_size` window of (T, H, W) positions, centred where it can be and
shifted inward at the grid border so it always holds `kernel_size` positions (NATTEN's `na3d`;
diffusers builds it as a FlexAttention BlockMask). Sharded by latent rows (or columns), a rank holds
its rows of every feature map. Its attention takes `k // 2` rows before and `k - 1 - k // 2` after
from its neighbours (`k`: the kernel along the sharded axis, at most the whole extent), exchanged as
a convolution's halo rows (zeros beyond the global edges, which no window reaches), and computes
the window of each of its queries in global coordinates: the border shift happens only at the true
grid border, where the edge rank holds every row the shifted windows need (`min_rows`). The rotary
positions are the global ones. The queries are this rank's rows only, attended in blocks over the
keys their windows reach (`windowed_attention`): diffusers' window predicate, without the mask over
every (query, key) pair that its FlexAttention processor builds, which grows with the square of the
tokens and is larger than a GPU at LTX-2.5's production grids.

Outside a sharded request the decoder runs diffusers' own forward, and the attention too in the exact
tier; in the fast tier its windows are taken in blocks over the whole grid as a rank's are over its
rows (the same attention, without the mask over every pair).
"""

from __future__ import annotations

import torch

from ..runtime.spatial import HEIGHT, ShardContext, current
from . import tier as fast_tier


def halo_rows(kernel: int, extent: int) -> tuple[int, int]:
    """(rows before, rows after) a query's window reaches where it is not shifted: `kernel` along
    the sharded axis, clipped to the whole `extent` as diffusers clips it."""
    k = min(kernel, extent)
    return k // 2, k - 1 - k // 2


def min_rows(kernel: int, extent: int) -> int:
    """The fewest rows a rank may hold at a level: one more than the halo, so that every shifted
    window at the grid border lies in the edge rank's rows and its halo, and a neighbour has the
    halo rows to send."""
    return max(halo_rows(kernel, extent)) + 1


def _rotate(rope, x: torch.Tensor, offsets: tuple[int, int, int]) -> torch.Tensor:
    """diffusers' `LTX2VideoVaeRotaryPosEmbed3D.forward` of `x` (B, T, H, W, heads, head_dim) whose
    first position along each axis is `offsets` in the whole grid."""
    dim_t, dim_h, _ = rope.rope_dim_split
    device = x.device
    inv_t, inv_h, inv_w = (rope._inv_freqs(dim, device) for dim in rope.rope_dim_split)
    positions = [torch.arange(o, o + n, dtype=torch.float32, device=device) for o, n in zip(offsets, x.shape[1:4])]
    rotated_t = rope._rotate_axis(x[..., :dim_t], positions[0], inv_t, axis=1)
    rotated_h = rope._rotate_axis(x[..., dim_t : dim_t + dim_h], positions[1], inv_h, axis=2)
    rotated_w = rope._rotate_axis(x[..., dim_t + dim_h :], positions[2], inv_w, axis=3)
    return torch.cat([rotated_t, rotated_h, rotated_w], dim=-1)


# what a family's fast tier runs here instead of diffusers' layer, as `plan().explain()` says it
FAST_NOTE = (
    "attention",
    "each neighbourhood attention's windows in blocks of queries over the keys they reach, without diffusers' "
    "mask over every (query, key) pair (layers/neighbourhood_attention.py; exact=True: diffusers' forward)",
)

# Queries per block along (T, H, W) in `windowed_attention`: 128 queries whose union of windows is
# (2 + kt - 1)(8 + kh - 1)(8 + kw - 1) keys (1,568 for 7-wide kernels, 4.6 times a window), against
# FlexAttention's 128-long raster blocks, whose windows span kernel-high bands of whole rows.
QUERY_BLOCK = (2, 8, 8)
# Key elements (keys x heads x head_dim x batch) gathered for one attention call: its blocks' keys.
CHUNK_ELEMENTS = 2**27


def _window_start(c: torch.Tensor, kernel: int, extent: int) -> torch.Tensor:
    """The first position of the window of query positions `c` along one axis: centred, shifted
    inward at the grid border so it holds `kernel` positions (diffusers' `_neighborhood_block_mask`)."""
    return torch.clamp(c - kernel // 2, 0, extent - kernel)


def _axis_blocks(queries: int, q_start: int, keys: int, k_start: int, kernel: int, extent: int, block: int, device):
    """One axis's query blocks over `queries` positions (global start `q_start`) and the key range
    each needs from `keys` positions (global start `k_start`) of a grid `extent` long: (query starts,
    key starts (local indices), the window predicate per block (blocks, block, key span), and the
    block that owns each query position)."""
    block = min(block, queries)
    span = min(keys, block + kernel - 1)
    count = -(-queries // block)
    q_first = torch.clamp(torch.arange(count, device=device) * block, max=queries - block)  # local, full blocks
    q = q_first[:, None] + torch.arange(block, device=device)  # (count, block) local query positions
    start = _window_start(q + q_start, kernel, extent)  # global window starts
    # each block's keys: from its first query's window start, kept inside the keys this rank holds
    k_first = torch.clamp(start[:, 0] - k_start, max=keys - span)
    k = k_first[:, None] + torch.arange(span, device=device) + k_start  # (count, span) global key positions
    inside = (k[:, None, :] >= start[:, :, None]) & (k[:, None, :] < start[:, :, None] + kernel)
    which = torch.clamp(torch.arange(queries, device=device) // block, max=count - 1)
    return q_first, k_first, inside, which


def _gather(source, blocks_of, starts, lengths):
    """The tokens of the blocks `blocks_of` ((T, H, W) block indices per block) of `source` (B, T, H,
    W, heads, d), each block from `starts` (per axis, per block) `lengths` long: (B * blocks, heads,
    tokens of a block, d)."""
    t, h, w = (s[i][:, None] + torch.arange(n, device=s.device) for s, i, n in zip(starts, blocks_of, lengths))
    picked = source[:, t[:, :, None, None], h[:, None, :, None], w[:, None, None, :]]
    return picked.reshape(-1, picked.shape[2] * picked.shape[3] * picked.shape[4], *source.shape[4:]).transpose(1, 2)


def windowed_attention(query, key, value, whole, kernel, query_start=(0, 0, 0), key_start=(0, 0, 0)):
    """Neighbourhood attention of `query` (B, T, H, W, heads, d) over `key` / `value` (B, T', H', W',
    heads, d), each at global offsets `query_start` / `key_start` in a grid of extents `whole`, the
    windows of `kernel` (clipped to `whole`) as diffusers' FlexAttention mask defines them; scale 1
    (the queries come scaled). The same attention as diffusers' processor without its mask over
    every (query, key) pair, whose size grows with the square of the tokens (larger than a GPU at
    production grids): queries go in blocks (QUERY_BLOCK), each over the keys its windows reach with a mask of
    that block's windows, blocks of one shape batched into one `scaled_dot_product_attention` call.
    The keys must hold every window of the queries (a sharded rank's rows and halo rows)."""
    batch, heads, dim = query.shape[0], query.shape[4], query.shape[5]
    kernel = [min(k, n) for k, n in zip(kernel, whole)]
    axes = [
        _axis_blocks(query.shape[1 + a], query_start[a], key.shape[1 + a], key_start[a], kernel[a], whole[a],
                     QUERY_BLOCK[a], query.device)
        for a in range(3)
    ]  # fmt: skip
    (qt, kt, mt, wt), (qh, kh, mh, wh), (qw, kw, mw, ww) = axes
    bt, bh, bw = mt.shape[1], mh.shape[1], mw.shape[1]
    st, sh, sw = mt.shape[2], mh.shape[2], mw.shape[2]
    device = query.device
    every = torch.stack(
        torch.meshgrid(*(torch.arange(len(a), device=device) for a in (qt, qh, qw)), indexing="ij")
    ).reshape(3, -1)  # (T, H, W) block indices of every block
    # as many blocks per attention call as CHUNK_ELEMENTS of gathered keys allow
    step = max(1, CHUNK_ELEMENTS // (st * sh * sw * heads * dim * batch))
    height, width = query.shape[2], query.shape[3]
    out = query.new_empty(query.shape)
    flat_out = out.view(batch, -1, heads, dim)
    for first in range(0, every.shape[1], step):
        it, ih, iw = blocks_of = every[:, first : first + step]
        q = _gather(query, blocks_of, (qt, qh, qw), (bt, bh, bw))
        k = _gather(key, blocks_of, (kt, kh, kw), (st, sh, sw))
        v = _gather(value, blocks_of, (kt, kh, kw), (st, sh, sw))
        mask = (
            mt[it][:, :, None, None, :, None, None]
            & mh[ih][:, None, :, None, None, :, None]
            & mw[iw][:, None, None, :, None, None, :]
        ).reshape(len(it), 1, bt * bh * bw, st * sh * sw)
        if batch > 1:
            mask = mask.repeat(batch, 1, 1, 1)
        blocks = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        blocks = blocks.transpose(1, 2).reshape(batch, -1, heads, dim)  # (B, blocks x block tokens, heads, d)
        # each query from the block that owns it (the last block of an axis overlaps the one before)
        t = (qt[it][:, None] + torch.arange(bt, device=device))[:, :, None, None]
        h = (qh[ih][:, None] + torch.arange(bh, device=device))[:, None, :, None]
        w = (qw[iw][:, None] + torch.arange(bw, device=device))[:, None, None, :]
        owned = (
            (wt[t] == it[:, None, None, None]) & (wh[h] == ih[:, None, None, None]) & (ww[w] == iw[:, None, None, None])
        )
        at = ((t * height + h) * width + w).expand(owned.shape)
        owned, at = owned.reshape(-1), at.reshape(-1)
        flat_out.index_copy_(1, at[owned], blocks[:, owned])
    return out


def _shard_position(ctx: ShardContext, local: int) -> tuple[int, int, list[int]]:
    extents = ctx.extents_at(local)
    return sum(extents[: ctx.comm.rank]), sum(extents), extents


def _windows_whole(module) -> bool:
    """Whether an unsharded call runs `windowed_attention` over the whole grid: the fast tier, in
    inference (elsewhere diffusers' own forward, with its mask over every pair)."""
    return fast_tier.enabled() and not module.training and not torch.is_grad_enabled()


class ShardedNeighbourhoodAttention:
    """Mixin for `LTX2VideoVaeNeighborhoodAttention` (with diffusers' FlexAttention processor): this
    rank's queries over its rows and the halo rows, the window and rotary positions global. Unsharded
    in the fast tier, the whole grid's windows the same way (no mask over every pair)."""

    def build_block_mask(self, hidden_states):
        if current() is None and not _windows_whole(self):
            return super().build_block_mask(hidden_states)
        return None  # the windows are taken in blocks (windowed_attention)

    def forward(self, hidden_states, block_mask=None):
        ctx = current()
        if ctx is None and not _windows_whole(self):
            return super().forward(hidden_states, block_mask)
        dim = 2 if ctx is None or ctx.axis == HEIGHT else 3  # (B, T, H, W, C)
        axis = dim - 1
        local = hidden_states.shape[dim]
        start, total, extents = (0, local, [local]) if ctx is None else _shard_position(ctx, local)
        whole = list(hidden_states.shape[1:4])
        whole[axis] = total
        if any(n < k for n, k in zip(whole, self.kernel_size)):
            raise ValueError(
                f"Neighborhood attention requires each spatial dim to be at least its kernel size; got "
                f"(T, H, W) = {tuple(whole)} with kernel_size {self.kernel_size}."
            )
        before, after = halo_rows(self.kernel_size[axis], total) if ctx is not None else (0, 0)
        need = min_rows(self.kernel_size[axis], total)
        if ctx is not None and min(extents) < need:
            raise ValueError(
                f"a rank holds {min(extents)} rows of a {total}-row feature map whose neighbourhood attention "
                f"(kernel {self.kernel_size}) needs at least {need} rows per rank to shard exactly: use fewer "
                "ranks, the other spatial axis, or a larger latent"
            )
        padded = hidden_states if ctx is None else ctx.halo_pad(hidden_states, dim, before, after)
        q_offsets, k_offsets = [0, 0, 0], [0, 0, 0]
        q_offsets[axis], k_offsets[axis] = start, start - before

        # diffusers' `project_qkv`: norm, scale, then rotate (at global positions); queries of the
        # own rows only
        def heads(x, proj):
            return proj(x).view(*x.shape[:4], self.heads, self.head_dim)

        query = _rotate(self.rope, self.norm_q(heads(hidden_states, self.to_q)) * self.scale, tuple(q_offsets))
        key = _rotate(self.rope, self.norm_k(heads(padded, self.to_k)), tuple(k_offsets))
        value = heads(padded, self.to_v)
        out = windowed_attention(query, key, value, whole, self.kernel_size, tuple(q_offsets), tuple(k_offsets))
        out = out.reshape(*hidden_states.shape[:4], self.heads * self.head_dim)
        return self.to_out[0](out)


def whole_canvas_noise(ctx: ShardContext, shape, dim: int, generator, device, dtype) -> torch.Tensor:
    """Stage 5's pixel noise of local `shape` (B, C, F, H, W): drawn for the whole canvas, as
    diffusers draws it (its generator or the global RNG), and cut to this rank's rows (`dim`)."""
    from diffusers.utils.torch_utils import randn_tensor

    start, total, _ = _shard_position(ctx, shape[dim])
    whole = list(shape)
    whole[dim] = total
    noise = randn_tensor(tuple(whole), generator=generator, device=device, dtype=dtype)
    return noise.narrow(dim, start, shape[dim])


class ShardedDiffusionDecoder:
    """Mixin for `LTX2VideoDiffusionDecoder3d`: diffusers' forward on this rank's latent rows, the
    stage-5 noise drawn whole-alike and sliced."""

    def forward(self, hidden_states, generator=None, num_inference_steps=None):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states, generator, num_inference_steps)
        num_inference_steps = num_inference_steps or self.default_num_inference_steps
        latent_context = self.forward_stage_4(self.forward_stages_1_to_3(hidden_states))
        pixel_shape = (
            hidden_states.shape[0],
            self.out_channels,
            latent_context.shape[1],
            latent_context.shape[2] * self.patch_size,
            latent_context.shape[3] * self.patch_size,
        )
        dim = 3 if ctx.axis == HEIGHT else 4
        x_t = whole_canvas_noise(ctx, pixel_shape, dim, generator, hidden_states.device, hidden_states.dtype)
        return self.denoise(latent_context, x_t, num_inference_steps)
