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
positions are the global ones. The queries are this rank's rows only; the mask is the same window
predicate as diffusers', offset to the local rows, run through FlexAttention as diffusers' processor
runs it.

Outside a sharded request both mixins run diffusers' own forward.
"""

from __future__ import annotations

import torch

from ..runtime.spatial import HEIGHT, ShardContext, current


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


def _window_mask(query_grid, key_grid, whole, kernel, axis: int, query_start: int, key_start: int, device):
    """The FlexAttention BlockMask of local queries (`query_grid`: T, H, W) over local keys
    (`key_grid`), whose rows along `axis` (0: T, 1: H, 2: W) start at `query_start` / `key_start` in
    the whole grid `whole`: diffusers' window predicate in global coordinates."""
    from torch.nn.attention.flex_attention import create_block_mask

    kernel = [min(k, n) for k, n in zip(kernel, whole)]
    q_hw, k_hw = query_grid[1] * query_grid[2], key_grid[1] * key_grid[2]
    q_offset = [0, 0, 0]
    k_offset = [0, 0, 0]
    q_offset[axis], k_offset[axis] = query_start, key_start

    def coords(idx, hw, width, offset):
        rem = idx % hw
        return idx // hw + offset[0], rem // width + offset[1], rem % width + offset[2]

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        q = coords(q_idx, q_hw, query_grid[2], q_offset)
        k = coords(kv_idx, k_hw, key_grid[2], k_offset)
        inside = None
        for qc, kc, size, n in zip(q, k, kernel, whole):
            start = torch.clamp(qc - size // 2, 0, n - size)
            here = (kc >= start) & (kc < start + size)
            inside = here if inside is None else inside & here
        return inside

    q_len, kv_len = query_grid[0] * q_hw, key_grid[0] * k_hw
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=device)


def _shard_position(ctx: ShardContext, local: int) -> tuple[int, int, list[int]]:
    extents = ctx.extents_at(local)
    return sum(extents[: ctx.comm.rank]), sum(extents), extents


class ShardedNeighbourhoodAttention:
    """Mixin for `LTX2VideoVaeNeighborhoodAttention` (with diffusers' FlexAttention processor): this
    rank's queries over its rows and the halo rows, the window and rotary positions global."""

    def build_block_mask(self, hidden_states):
        if current() is None:
            return super().build_block_mask(hidden_states)
        return None  # the sharded forward builds its own (rectangular, offset) mask

    def forward(self, hidden_states, block_mask=None):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states, block_mask)
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        dim = 2 if ctx.axis == HEIGHT else 3  # (B, T, H, W, C)
        axis = dim - 1
        local = hidden_states.shape[dim]
        start, total, extents = _shard_position(ctx, local)
        whole = list(hidden_states.shape[1:4])
        whole[axis] = total
        if any(n < k for n, k in zip(whole, self.kernel_size)):
            raise ValueError(
                f"Neighborhood attention requires each spatial dim to be at least its kernel size; got "
                f"(T, H, W) = {tuple(whole)} with kernel_size {self.kernel_size}."
            )
        before, after = halo_rows(self.kernel_size[axis], total)
        need = min_rows(self.kernel_size[axis], total)
        if min(extents) < need:
            raise ValueError(
                f"a rank holds {min(extents)} rows of a {total}-row feature map whose neighbourhood attention "
                f"(kernel {self.kernel_size}) needs at least {need} rows per rank to shard exactly: use fewer "
                "ranks, the other spatial axis, or a larger latent"
            )
        padded = ctx.halo_pad(hidden_states, dim, before, after)
        batch_size = hidden_states.shape[0]
        q_offsets, k_offsets = [0, 0, 0], [0, 0, 0]
        q_offsets[axis], k_offsets[axis] = start, start - before

        # diffusers' `project_qkv`: norm, scale, then rotate (at global positions); queries of the
        # own rows only
        def heads(x, proj):
            return proj(x).view(*x.shape[:4], self.heads, self.head_dim)

        query = _rotate(self.rope, self.norm_q(heads(hidden_states, self.to_q)) * self.scale, tuple(q_offsets))
        key = _rotate(self.rope, self.norm_k(heads(padded, self.to_k)), tuple(k_offsets))
        value = heads(padded, self.to_v)
        mask = _window_mask(
            hidden_states.shape[1:4], padded.shape[1:4], whole, self.kernel_size, axis, start, start - before,
            hidden_states.device,
        )  # fmt: skip
        out = dispatch_attention_fn(
            query.reshape(batch_size, -1, self.heads, self.head_dim),
            key.reshape(batch_size, -1, self.heads, self.head_dim),
            value.reshape(batch_size, -1, self.heads, self.head_dim),
            attn_mask=mask,
            scale=1.0,
            backend=self.processor._attention_backend,
            parallel_config=self.processor._parallel_config,
        )
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
