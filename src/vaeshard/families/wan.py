"""Wan 2.1 / 2.2 (diffusers AutoencoderKLWan), and the causal-video-VAE machinery it shares with
Qwen-Image, whose VAE is the Wan 2.1 architecture under other class names.

Declared: which leaf classes get which halo treatment (causal 3x3x3 convs, the upsamplers' 3x3
Conv2d, the single-head mid-block attention). Code, because it cannot be data: diffusers' per-tile
loop (the decoder is run frame by frame with its causal feature cache threaded through), and the
tile grid arithmetic, both kept line for line with diffusers' `tiled_decode`/`tiled_encode` so the
tile strategy stays bit-identical to them.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .. import conv_kernel, fast, graphs, shard, upsample
from ..tile import TileGrid, TileOps
from .base import Family, frames_out, with_tiling_off


class WanLike:
    """Tile and shard behaviour of a Wan-architecture VAE; subclass attributes name the differences."""

    causal_conv_cls: type
    attention_cls: type
    residual_block_cls: type
    resample_cls: type
    upsample_cls: type
    up_block_cls: type | None = None  # an up block with a duplicating shortcut (Wan 2.2's), if the family has one
    decoder_takes_first_chunk = True  # Wan's decoder trims DupUp3D's first chunk; Qwen's has no such arg
    clamp_tiled_decode = True  # Wan clamps after tiled decode; Qwen-Image's tiled decode does not

    # -- shapes ---------------------------------------------------------------------------------

    @staticmethod
    def patch(vae) -> int:
        return getattr(vae.config, "patch_size", None) or 1

    @staticmethod
    def num_spatial_stages(vae) -> int:
        return len(vae.config.dim_mult) - 1

    def temporal_factor(self, vae) -> int:
        ups = list(vae.temperal_upsample)[: self.num_spatial_stages(vae)]
        return 2 ** sum(bool(u) for u in ups)

    def latent_channels(self, vae) -> int:
        return vae.config.z_dim

    # -- decode ---------------------------------------------------------------------------------

    @staticmethod
    def _exceeds_one_tile(vae, z) -> bool:
        """diffusers' test in `_decode`: the latent is larger than one tile, so a tiled decode tiles."""
        _, _, _, height, width = z.shape
        ratio = vae.spatial_compression_ratio
        return width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio

    def decode_tile_ops(self, vae, z):
        _, _, _, height, width = z.shape
        ratio, patch = vae.spatial_compression_ratio, self.patch(vae)
        tile_h = vae.tile_sample_min_height // ratio
        tile_w = vae.tile_sample_min_width // ratio
        if not self._exceeds_one_tile(vae, z):
            return None  # one tile: diffusers decodes it directly
        keep_h = vae.tile_sample_stride_height // patch
        keep_w = vae.tile_sample_stride_width // patch
        grid = TileGrid.regular(
            height,
            width,
            tile_h,
            tile_w,
            vae.tile_sample_stride_height // ratio,
            vae.tile_sample_stride_width // ratio,
            blend_rows=vae.tile_sample_min_height // patch - keep_h,
            blend_cols=vae.tile_sample_min_width // patch - keep_w,
            keep_rows=keep_h,
            keep_cols=keep_w,
            out_rows=height * ratio // patch,
            out_cols=width * ratio // patch,
        )
        up = 2 ** self.num_spatial_stages(vae)
        channels = vae.decoder.conv_out.out_channels
        tf = self.temporal_factor(vae)
        return TileOps(
            grid=grid,
            source=z,
            run=lambda tile: self._decode_tile(vae, tile),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: self._finish_tiled_decode(vae, merged),
            out_shape=lambda s: (s[0], channels, frames_out(s[2], tf), s[3] * up, s[4] * up),
            out_dtype=z.dtype,
        )

    def _decode_tile(self, vae, tile):
        vae.clear_cache()
        frames = []
        for k in range(tile.shape[2]):
            vae._conv_idx = [0]
            x = vae.post_quant_conv(tile[:, :, k : k + 1])
            if self.decoder_takes_first_chunk:
                frames.append(vae.decoder(x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=(k == 0)))
            else:
                frames.append(vae.decoder(x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx))
        vae.clear_cache()
        return torch.cat(frames, dim=2)

    def _finish_tiled_decode(self, vae, merged):
        merged = self._unpatchify(vae, merged)
        return torch.clamp(merged, min=-1.0, max=1.0) if self.clamp_tiled_decode else merged

    def _unpatchify(self, vae, x):
        """diffusers' unpatchify where the VAE patchifies (Wan 2.2), else `x` itself."""
        if self.patch(vae) == 1:
            return x
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        return unpatchify(x, patch_size=self.patch(vae))

    def untiled_decode(self, vae, z):
        if fast.enabled():
            return with_tiling_off(vae, self._decode_in_steps, vae, z)
        # contiguous: a sharded request computes channels-last; callers get diffusers' layout back
        return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()

    def direct_decode(self, vae, z):
        """One rank's whole decode: the fast tier's stepping loop where it gives what the VAE's own
        `decode` would (no tiling of this latent, no accelerate hook around `decode`), otherwise the
        VAE's own `decode`. (A sliced batch arrives here one sample at a time: vaeshard splits it.)"""
        tiles = vae.use_tiling and self._exceeds_one_tile(vae, z)
        if fast.enabled() and not (tiles or hasattr(vae, "_hf_hook")):
            return self.untiled_decode(vae, z)
        return type(vae).decode(vae, z, return_dict=False)[0]

    def _decode_in_steps(self, vae, z):
        """diffusers' untiled `_decode` with two changes, fast tier: after the first latent frame
        (always decoded alone, as `first_chunk`), the decoder takes `fast.frames_per_step` frames per
        call instead of one, and each call's output is clamped straight into one preallocated output instead of
        growing a `torch.cat` (which copies everything decoded so far at every frame).

        Code, not a hook, because diffusers' loop slices one frame per call and concatenates as it
        goes. Every split of the frames gives the same values: each causal convolution sees the
        same input frames, its cached ones in front (diffusers' feature-cache bookkeeping keeps the
        last two input frames whatever the call's length). With one frame per call the decoder calls are
        diffusers' own, and so are the bits. On CUDA the steady calls may be replayed as one CUDA
        graph (graphs.py, `cuda_graphs`): the same kernels, the same bits.
        """
        _, _, num_frames, _, _ = z.shape
        total = frames_out(num_frames, self.temporal_factor(vae))
        # the largest rank's latent frame, decoded: its output pixels decide frames_per_step="auto"
        # and cuda_graphs="auto", the same on every rank
        pixels = _frame_pixels(z) * vae.spatial_compression_ratio**2
        per_step = fast.frames_per_step(pixels, z.device)
        num_calls = 1 + -(-(num_frames - 1) // per_step)

        def step(chunk, first: bool):
            vae._conv_idx = [0]
            if first and self.decoder_takes_first_chunk:
                return vae.decoder(chunk, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=True)
            return vae.decoder(chunk, feat_cache=vae._feat_map, feat_idx=vae._conv_idx)

        # the calls after the first that take `per_step` frames have one shape: CUDA graphs replay them
        keep = _keep_graphs(vae, z, per_step) if fast.keep_cuda_graphs() else None
        with graphs.DecoderSteps(z.device, graphs.wanted(fast.cuda_graphs(), pixels), num_calls, keep) as steps:
            vae.clear_cache()
            try:
                x = vae.post_quant_conv(z)
                out, filled, start = None, 0, 0
                while start < num_frames:
                    stop = 1 if start == 0 else min(start + per_step, num_frames)
                    y = steps.call(lambda c, first=(start == 0): step(c, first), x[:, :, start:stop],
                                   vae._feat_map, steady=start > 0 and stop - start == per_step)
                    if out is None:  # contiguous, as diffusers'
                        out = steps.hand_over(y.new_empty((*y.shape[:2], total, *y.shape[3:])))
                    if filled + y.shape[2] > total:
                        raise RuntimeError(f"vaeshard: the decoder gave more frames than the {total} expected")
                    torch.clamp(y, min=-1.0, max=1.0, out=out[:, :, filled : filled + y.shape[2]])
                    filled += y.shape[2]
                    start = stop
                    del y
                del x
            finally:
                vae.clear_cache()
        if filled != total:
            raise RuntimeError(f"vaeshard: the decoder gave {filled} frames, {total} expected")
        return self._unpatchify(vae, out)  # a permutation: clamping before it gives diffusers' values

    def untiled_encode(self, vae, x):
        """diffusers' untiled `_encode`: the moments (mean and logvar stacked on channels)."""
        return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()

    # -- encode ---------------------------------------------------------------------------------

    def encode_prepare(self, vae, x):
        if self.patch(vae) > 1:
            from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

            return patchify(x, patch_size=self.patch(vae))
        return x

    def encode_tile_ops(self, vae, x):
        """`x` in sample coordinates (before patchify), as diffusers' `_encode` tests the tile size on."""
        _, _, _, height, width = x.shape
        if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
            return None
        xp = self.encode_prepare(vae, x)
        _, _, _, rows, cols = xp.shape
        ratio = vae.spatial_compression_ratio // self.patch(vae)
        tile_lh, tile_lw = vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio
        keep_h, keep_w = vae.tile_sample_stride_height // ratio, vae.tile_sample_stride_width // ratio
        grid = TileGrid.regular(
            rows,
            cols,
            vae.tile_sample_min_height,
            vae.tile_sample_min_width,
            vae.tile_sample_stride_height,
            vae.tile_sample_stride_width,
            blend_rows=tile_lh - keep_h,
            blend_cols=tile_lw - keep_w,
            keep_rows=keep_h,
            keep_cols=keep_w,
            out_rows=rows // ratio,
            out_cols=cols // ratio,
        )
        stages = self.num_spatial_stages(vae)
        channels = vae.quant_conv.out_channels
        return TileOps(
            grid=grid,
            source=xp,
            run=lambda tile: self._encode_tile(vae, tile),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: merged,
            out_shape=lambda s: (s[0], channels, 1 + (s[2] - 1) // 4, s[3] >> stages, s[4] >> stages),
            out_dtype=x.dtype,
        )

    def _encode_tile(self, vae, tile):
        vae.clear_cache()
        chunks = []
        for k in range(1 + (tile.shape[2] - 1) // 4):
            vae._enc_conv_idx = [0]
            part = tile[:, :, :1] if k == 0 else tile[:, :, 1 + 4 * (k - 1) : 1 + 4 * k]
            part = vae.encoder(part, feat_cache=vae._enc_feat_map, feat_idx=vae._enc_conv_idx)
            chunks.append(vae.quant_conv(part))
        vae.clear_cache()
        return torch.cat(chunks, dim=2)

    # -- spatial shard --------------------------------------------------------------------------

    def install_layers(self, vae) -> None:
        """Request-aware layers, by leaf class, in the decoder and the encoder.

        Halo treatment (spatial shard): causal conv -> halo rows replace its spatial zero padding
        (none for the temporal-only ones, which the fast tier still gives one input buffer); 2-D
        conv with padding (the upsamplers' 3x3) -> likewise; 2-D conv without padding (the
        downsamplers' stride-2 3x3) -> nothing, the ZeroPad2d before it takes the halo; single-head
        attention -> whole-frame keys and values. Everything else is per voxel, or a local pixel
        (un)shuffle, and stays as diffusers wrote it.
        Fast tier (fast.py): the RMS norms that diffusers always follows with SiLU (in residual
        blocks and before conv_out) fuse it, and those SiLU modules pass through; a residual
        block's conv1 (read only by norm2) leaves its bias for norm2 to add, and the block's norms
        write straight into the convolutions' input buffers (`FastResidualBlock`; norm2 computed by
        conv1's Triton kernel where it runs conv1), and so does the head's norm, into conv_out's
        (`FastCoderHead`, on the decoder and the encoder themselves); the nearest
        upsamplers skip their fp32 round trip, and an upsampling resample writes each upsampled
        frame straight into its 3x3 convolution's input buffer or, where the Triton kernel takes
        that convolution, has it read the source frames, never upsampled in memory (`FastUpsample`).
        """
        for part in (vae.decoder, vae.encoder):
            for module in part.modules():
                if isinstance(module, self.causal_conv_cls):
                    shard.swap(module, shard.HaloCausalConv3d)
                elif type(module) is nn.Conv2d and any(module.padding):
                    _check_halo_conv2d(module)
                    shard.swap(module, shard.HaloConv2d)
                elif type(module) is nn.ZeroPad2d:
                    shard.swap(module, shard.HaloZeroPad2d)
                elif isinstance(module, self.attention_cls):
                    shard.swap(module, shard.WholeFrameAttention)
                elif isinstance(module, self.upsample_cls):
                    shard.swap(module, fast.NearestUpsample)
            for block in [part, *(m for m in part.modules() if isinstance(m, self.residual_block_cls))]:
                norms = [block.norm_out] if block is part else [block.norm1, block.norm2]
                for norm in norms:
                    shard.swap(norm, fast.FusedRMSNormSiLU)
                shard.swap(block.nonlinearity, fast.PassThroughSiLU)
                if block is not part and shard.is_swapped(block.conv1):
                    fast.move_bias_into_norm(block.conv1, block.norm2)
                if block is not part and all(hasattr(c, "input_buffer") for c in (block.conv1, block.conv2)):
                    shard.swap(block, FastResidualBlock)
            if hasattr(part.conv_out, "input_buffer"):  # the head: its norm into conv_out's buffer
                shard.swap(part, FastCoderHead)
            for module in part.modules():
                if isinstance(module, self.resample_cls) and _upsamples_into_conv(module, self.upsample_cls):
                    shard.swap(module, FastUpsample)
                elif self.up_block_cls is not None and isinstance(module, self.up_block_cls):
                    shard.swap(module, FastResidualUpBlock)

    def uninstall_layers(self, vae) -> None:
        for module in vae.modules():
            shard.unswap(module)
            fast.forget_moved_bias(module)

    def release(self, vae) -> None:
        vae.clear_cache()

    def family(self, name: str, classes: tuple[str, ...], tile_encode: bool = True) -> Family:
        return Family(
            name=name,
            classes=classes,
            latent_ndim=5,
            tile_decode=True,
            tile_encode=tile_encode,
            spatial_decode=True,
            spatial_encode=True,
            latent_channels=self.latent_channels,
            decode_tile_ops=self.decode_tile_ops,
            encode_tile_ops=self.encode_tile_ops,
            encode_prepare=self.encode_prepare,
            untiled_decode=self.untiled_decode,
            direct_decode=self.direct_decode,
            untiled_encode=self.untiled_encode,
            install_layers=self.install_layers,
            uninstall_layers=self.uninstall_layers,
            release=self.release,
            decode_axis=self.decode_axis,
        )

    @staticmethod
    def decode_axis(vae, ranks: int, device: torch.device) -> str | None:
        """`auto`'s measured refinement (Family.decode_axis): a CUDA decode over 2 ranks of a VAE with
        Wan 2.1's layers (96 channels at full resolution: Wan 2.1, and Qwen-Image, its architecture)
        by height. Measured in the same processes on 2 H200s (BENCHMARKS.md, "Which axis"): Wan 2.1
        720p 0.843 s by height against 0.888 s by width, 480p 0.580 against 0.602 s; its channels-last
        halo rows are contiguous, and the Triton kernel's row tiles add the residual and compute the
        norm as they store. Wan 2.2 (256 channels there, on cuDNN) measured within 1% either way
        (2.030 against 2.015 s); other rank counts and CPU decodes were not measured: the baseline."""
        base = getattr(vae.config, "decoder_base_dim", None) or getattr(vae.config, "base_dim", None)
        return "height" if device.type == "cuda" and ranks == 2 and base == 96 else None


CACHE_T = 2  # frames of a causal convolution's input that diffusers keeps for the next chunk


class FastResidualBlock:
    """Mixin for a Wan residual block: diffusers' computation, step for step, with less data movement.

    Fast tier, inference only: each fused norm (+ SiLU, + conv1's bias before norm2, see
    fast.move_bias_into_norm) writes straight into the next causal convolution's input buffer, behind
    the cached frames and between the halo rows (`HaloCausalConv3d.input_buffer`), so the
    activations are never copied to build that input; where the Triton kernel runs conv1 (CUDA, one
    sample, no `max_layer_frames`), norm2 is computed in its epilogue into conv2's buffer, made before
    conv1 runs, so conv1's output is never stored; on CUDA, conv2's bias and the residual are added as the Triton
    convolution stores its output (`fast.conv_with_bias`'s `add_to`) or, after cuDNN, in one pass
    (`fast.add_bias_and_residual_`), rounded as PyTorch's separate bias pass and residual add round.
    Where the layouts agree (on CUDA: channels-last both) the sum is written into the block's input
    (identity shortcut) or the shortcut's output, so the input, which diffusers' callers keep
    referenced until the block returns, is not a third full-size tensor beside the convolution's
    input and output; callers must not read the input afterwards (diffusers' never do; a forward
    hook on the block itself, which would see the input, turns this off).
    Sharded, conv1 receives two halo rows a side instead of one and computes one output row more a
    side: the rows conv2 would receive from its neighbours, so the block makes one halo exchange
    instead of two (Wan 2.1: 19 instead of 35.6 per latent frame). Where a shard holds fewer than two
    rows at the block's level, it exchanges twice.
    The values are exactly those of the fast tier without this mixin (tests compare the bits on CPU,
    one rank and sharded with two exchanges per block; on CUDA the one-pass add rounds as the two
    passes it replaces), except that a convolution over two more rows may round otherwise (fp32 on
    CPU: 1.8e-6 at most in the tests, within the tolerance).
    With `max_layer_frames` (fast.max_layer_frames) a block given more frames runs on parts of at
    most that many, each part reusing the block's cache slots, which the part before it has just
    filled with its last frames: what a decoder call of that many frames would compute, with one
    part's activations alive at a time; with an identity shortcut each part's sum goes into its
    frames of the input, otherwise into one output for the block. Without the setting, unsharded, a
    block whose convolutions read their caches where they lie (box_conv) takes parts of two frames
    where its frames are large (fast.frames_for_layer): each part's buffer, two new frames, becomes the
    convolution's next cache instead of being copied into the old one (`_store_cache`). Sharded, the
    parts (by default or by the setting) share one halo exchange: the neighbours' raw rows of the
    block's input that conv1 needs, from which each part computes its own halo rows (`_edges`); a
    block that makes two exchanges (a shard of fewer than two rows) takes no default parts.
    The feature-cache bookkeeping is diffusers' own (`WanResidualBlock.forward`, unchanged from
    diffusers 0.36 to 0.42), except that a cache entry of its steady shape is overwritten in place
    instead of replaced (`_store_cache`; the same values) and, sharded, is taken after the halo
    exchange with the frames' halo rows (`_CausalInput`), so the next call neither exchanges those
    frames again nor copies them strided. Otherwise (training, autograd, exact
    tier, or a forward hook on one of the block's layers, which this path would not call)
    diffusers' forward runs.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0]):  # noqa: B006 - diffusers' signature
        if not _fast_path(self):
            return super().forward(x, feat_cache, feat_idx)
        def suits() -> bool:  # sharded, the parts share the block's one halo exchange (`_edges`)
            return ((shard.current() is None or _one_exchange(self, x))
                    and all(fast.causal_front(x, conv.weight, None) is not None for conv in (self.conv1, self.conv2)))

        with fast.frames_for_layer(_frame_pixels(x), shard.current() is not None, suits):
            return self._forward_in_parts(x, feat_cache, feat_idx)

    def _forward_in_parts(self, x, feat_cache, feat_idx):
        limit = fast.max_layer_frames()
        if limit is None or feat_cache is None or x.shape[2] <= limit:
            return self._fast_forward(x, feat_cache, feat_idx)
        # max_layer_frames: the block on parts of the frames; each part reuses the block's cache
        # slots, which the part before it has just filled with its own last frames
        edges = _edges(self, x)
        start, out = feat_idx[0], None
        for a in range(0, x.shape[2], limit):
            part = x[:, :, a : a + limit]
            feat_idx[0] = start
            part_edges = None if edges is None else tuple(e if e is None else e[:, :, a : a + limit] for e in edges)
            y = self._fast_forward(part, feat_cache, feat_idx, part_edges)
            if out is None and _same_storage(y, part):
                continue  # the sum went into the input's frames (identity shortcut): nothing to place
            if out is None:  # an output of its own: place this part and any before it there
                layout = fast.channels_last_format(5)
                layout = layout if y.is_contiguous(memory_format=layout) else torch.contiguous_format
                out = torch.empty((*y.shape[:2], x.shape[2], *y.shape[3:]), dtype=y.dtype, device=y.device,
                                  memory_format=layout)
                if a:  # earlier parts wrote into the input's frames
                    out[:, :, :a].copy_(x[:, :, :a])
            out[:, :, a : a + y.shape[2]].copy_(y)
            del y
        return x if out is None else out

    def _fast_forward(self, x, feat_cache, feat_idx, edges=None):
        """The block on `x` (all its frames, or a part); `edges`: a part's rows of `_edges`."""
        h = self.conv_shortcut(x)
        # sharded: conv1 receives two halo rows a side and computes one row more a side, the rows
        # conv2 needs from its neighbours, so a block makes one halo exchange instead of two
        one_exchange = edges is not None or _one_exchange(self, x)
        rows1, rows2 = ((CONV1_ROWS, CONV1_ROWS), (0, 0)) if one_exchange else (None, None)
        # each activation is dropped as soon as the next buffer holds what is needed of it, so a
        # block holds at most its input (the residual), one convolution input and one output (or,
        # where conv1 computes norm2 as it stores, the two convolutions' inputs)
        if edges is None:
            pending = _norm_into_causal_conv(self.norm1, None, self.conv1, x, feat_cache, feat_idx, rows1)
        else:
            pending = _norm_with_edges_into_causal_conv(self.norm1, self.conv1, x, edges, feat_cache, feat_idx)
        fuse = fast.fused_bias_add_available(x)  # conv2's bias and the residual in one pass (CUDA)
        del x
        pre_bias = self.conv1.bias if fast.bias_moved(self.conv1) else None
        # (dropout sits between norm2 and conv2 in diffusers: the identity outside training)
        if fuse and fast.max_layer_frames() is None and pending.norms_in_epilogue():
            # conv1 writes silu(norm2(its output + its bias)) straight into conv2's input buffer, in
            # the Triton kernel's epilogue: its output is never stored (conv2's buffer is made
            # first, in place of that output, so both inputs are alive during conv1: two cached
            # frames more than conv1's input and output. max_layer_frames, the setting for a peak
            # as low as possible, keeps the order below, one convolution input at a time.)
            second = _causal_input(self.conv2, pending.buf, feat_cache, feat_idx, rows2, pending.output_shape())
            n2 = self.norm2
            pending.convolve(norm=conv_kernel.NormEpilogue(n2.gamma, n2.bias, n2.scale, pre_bias=pre_bias),
                             out=second.new)
            pending = second
            del second
        else:
            y = pending.convolve()
            pending = _norm_into_causal_conv(self.norm2, pre_bias, self.conv2, y, feat_cache, feat_idx, rows2)
            del y
        # the sum goes into h where it has the convolution's output layout (on CUDA, channels-last
        # both): the block's output takes the storage of its input (or of the shortcut's output),
        # which diffusers' callers hold until the block returns and never read again (they reassign
        # it; Wan 2.2's up and down blocks clone it first), so no third full-size tensor stays
        # alive. (Another layout would change the layout, and on CPU the reduction order, of the
        # layers after it.) A hook on the block sees its input: then a new output.
        if fuse and not self._forward_hooks and h.is_contiguous(memory_format=fast.channels_last_format(5)):
            # into h by the convolution itself where its kernel can (conv_kernel's epilogue), else
            # by the one-pass bias + residual add after it
            return pending.convolve(add_to=h)
        y = pending.convolve(with_bias=not fuse)
        del pending
        into = shard.same_layout(h, y) and not self._forward_hooks
        return fast.add_bias_and_residual_(y, self.conv2.bias if fuse else None, h, into_residual=into)


class FastCoderHead:
    """Mixin for a Wan-style decoder or encoder (diffusers' `WanDecoder3d`, `WanEncoder3d` and Qwen-Image's):
    its forward, step for step, with the head (`norm_out`, the SiLU, `conv_out`) run as a residual
    block's norm and convolution are (`FastResidualBlock`).

    Fast tier, inference only, with diffusers' feature cache: the fused norm writes straight into
    conv_out's input buffer (`_norm_into_causal_conv`), behind the cached frames or, where box_conv
    runs conv_out, with those read where they lie (fast.causal_front), and the next call's cache is
    taken from that buffer after the convolution: sharded, with its halo rows, so the next call
    neither exchanges the cached frames again nor copies them strided. diffusers' forward clones
    the norm's output for the cache before the convolution and copies that clone into the next
    call's buffer; sharded, both copies are strided (a shard's rows between halo rows): about 7 GB
    of each 2-GPU rank's copies at Wan 2.1 720p (benchmarks/memory_model.py --copies). The same
    values: a cached frame's halo rows are the ones the exchange would bring again. With
    `max_layer_frames` below the call's frames, conv_out takes its frames in parts from the norm's
    output as diffusers' head does (HaloCausalConv3d). Everything before the head is diffusers'
    forward (the same computation from 0.36 to 0.42 in Wan's and Qwen-Image's classes; Qwen-Image's
    slices its caches' frames as `-min(CACHE_T, t):`, the same frames). Otherwise (exact tier,
    training, autograd, no feature cache, a forward hook on a layer of the head, which this path
    would not call) diffusers' forward runs.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0], **kwargs):  # noqa: B006 - diffusers' signature
        if feat_cache is None or not _head_fast_path(self):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx, **kwargs)
        x = _causal_conv_step(self.conv_in, x, feat_cache, feat_idx)
        if hasattr(self, "up_blocks"):  # a decoder: middle, then upsamples (Wan's take `first_chunk`)
            x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
            for block in self.up_blocks:
                x = block(x, feat_cache=feat_cache, feat_idx=feat_idx, **kwargs)
        else:  # an encoder: downsamples, then middle
            for block in self.down_blocks:
                x = block(x, feat_cache=feat_cache, feat_idx=feat_idx)
            x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        limit = fast.max_layer_frames()
        if limit is not None and x.shape[2] > limit:  # conv_out in parts of the norm's output
            return _causal_conv_step(self.conv_out, self.nonlinearity(self.norm_out(x)), feat_cache, feat_idx)
        pending = _norm_into_causal_conv(self.norm_out, None, self.conv_out, x, feat_cache, feat_idx)
        del x  # (as diffusers' head drops the norm's input before its convolution)
        return pending.convolve()


def _head_fast_path(part: nn.Module) -> bool:
    """Whether a decoder's or encoder's head may run `FastCoderHead`'s way: `_fast_path`, with only
    the layers it does not call through their modules looked at for hooks (the norm, the SiLU,
    conv_out)."""
    return _fast_path(part, (part.norm_out, part.nonlinearity, part.conv_out))


def _causal_conv_step(conv: nn.Module, x: torch.Tensor, feat_cache: list, feat_idx: list) -> torch.Tensor:
    """diffusers' step for a causal convolution with a feature cache: `conv(x, cache)`, then the
    cache entry updated with x's last frames (`_store_cache`: in place where it can be)."""
    idx = feat_idx[0]
    feat_idx[0] += 1
    old = feat_cache[idx]
    y = conv(x, old)
    _store_cache(feat_cache, idx, old, x)
    return y


class FastUpsample:
    """Mixin for a Wan upsampling `WanResample` (`upsample2d`, `upsample3d`): diffusers' computation
    with less data movement.

    Fast tier, inference only. diffusers interleaves the time convolution's two channel halves into
    twice the frames (`torch.stack`), lays the frames out as a batch (a second copy), upsamples them
    (a third tensor, 4x the input) and, sharded, copies that into a halo-padded input (a fourth).
    Here the 3x3 convolution is computed from the source frames by its four phases
    (`HaloConv2d.forward_by_phases`, upsample.py; `fast.upsample_by_phases`): the upsampled frames
    are never made, the source is copied only to take the time convolution's channel halves apart
    or, sharded, into a buffer with its halo rows, and each output takes 16 products per input
    channel instead of 36 (the fast tier's tolerance: the phases' weights are rounded sums of
    taps). Where that is off, the frames are upsampled straight from their (strided) source into
    the 3x3 convolution's channels-last input buffer, between the halo rows: one copy; that
    convolution sees the same input, shapes and layout as without this mixin, so the values are the
    same bits (nearest 2x upsampling only copies values). With `max_layer_frames` set, the frames
    are upsampled and convolved (or their phases computed) one source frame at a time into one
    output (no cache joins them). The feature-cache
    bookkeeping is diffusers' own (`WanResample.forward`, unchanged from diffusers 0.36 to 0.42),
    the time convolution's cache overwritten in place as in the residual blocks.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0]):  # noqa: B006 - diffusers' signature
        if not (self.mode in ("upsample2d", "upsample3d") and _fast_path(self)):
            return super().forward(x, feat_cache, feat_idx)
        return self.upsample(x, feat_cache, feat_idx)[0]

    def upsample(self, x, feat_cache=None, feat_idx=None, shortcut=None) -> tuple[torch.Tensor, bool]:
        """The fast forward (the caller has checked `_fast_path` and the mode): (the output, whether
        `shortcut`, a (DupUp3D, its source) pair, was added into it as the phases were interleaved
        (`_dup_addend`; else the caller adds it)). Its output frames (4x the source's pixels) decide
        the parts (`fast.frames_for_layer`)."""
        def suits() -> bool:  # sharded, parts by phases share one halo exchange of their source
            # (forward_by_phases); a part upsampled into a buffer would make its own
            return shard.current() is None or (fast.upsample_by_phases(x) and upsample.takes(self.resample[1]))

        with fast.frames_for_layer(4 * _frame_pixels(x), shard.current() is not None, suits):
            return self._upsample(x, feat_cache, feat_idx, shortcut)

    def _upsample(self, x, feat_cache, feat_idx, shortcut):
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4)  # (b, t, c, h, w): diffusers' batch of frames, not copied
        if self.mode == "upsample3d" and feat_cache is not None:
            idx = feat_idx[0]
            cached = feat_cache[idx]
            if cached is None:
                feat_cache[idx] = "Rep"
            else:
                x_in = x
                x = self.time_conv(x) if isinstance(cached, str) else self.time_conv(x, cached)
                _store_cache(feat_cache, idx, cached, x_in)  # once the time convolution has read the old cache
                del x_in
                # frame 2i + j is channel half j of the time convolution's frame i
                frames = x.unflatten(1, (2, c)).permute(0, 3, 1, 2, 4, 5)  # (b, t, 2, c, h, w)
                t *= 2
            feat_idx[0] += 1
        conv = self.resample[1]
        limit = fast.max_layer_frames()
        if fast.upsample_by_phases(x):  # from the source by phases (upsample.py): no upsampled frames
            # each frame of x, or after the time convolution each half of its channels, is a frame
            src = x.transpose(1, 2).flatten(0, 1)  # (a view of channels-last x, as the convolutions give)
            addend = None if shortcut is None else _dup_addend(*shortcut, (b, conv.out_channels, t, 2 * h, 2 * w), x)
            y = conv.forward_by_phases(src, x.shape[1] // c, limit, addend)
            if y is not None:
                return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4), addend is not None
        if limit is None or t <= limit:
            buf = _upsample_into_buffer(conv, x, frames, b, t, c, h, w)
            del x, frames
            y = conv.forward_buffer(buf)
        else:  # max_layer_frames: one source frame at a time (frames are independent here: no cache)
            per = t // frames.shape[1]  # output frames per source frame (2 after the time convolution)
            y = None
            for a in range(frames.shape[1]):
                yp = conv.forward_buffer(_upsample_into_buffer(conv, x, frames[:, a : a + 1], b, per, c, h, w))
                if y is None:
                    y = torch.empty((b * t, *yp.shape[1:]), dtype=yp.dtype, device=yp.device,
                                    memory_format=torch.channels_last)
                y.view(b, t, *yp.shape[1:])[:, a * per : (a + 1) * per].copy_(yp.view(b, per, *yp.shape[1:]))
                del yp
            del x, frames
        return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4), False


class FastResidualUpBlock:
    """Mixin for Wan 2.2's up block (diffusers' `WanResidualUpBlock`): diffusers' computation, with
    its duplicating shortcut (`DupUp3D`: each input voxel's channels spread over the output's
    channels and its 2 x 2 (x 2 in time) voxels) added into the upsampler's output in place, read
    from the block's input (on CUDA by the upsampler's own interleaving pass as it stores its output,
    `upsample.Addend`, or where that does not run by one Triton pass after it,
    `fast.add_duplicated_`; elsewhere through broadcasting views, `_dup_up_views`), instead of made
    as a tensor (a
    `repeat_interleave` and a permuted copy, each the size of the block's output) and added into a
    new one: one pass over the output instead of three, the same bits (one rounding per add either
    way), and none of those tensors at the decode's peak. diffusers clones the block's input first
    (also in the last block, which has no shortcut: a copy of the full-resolution input at the Wan
    2.2 decode's peak); here it is cloned only where the block has a shortcut and the first residual
    block writes its sum into its input (an identity shortcut, `FastResidualBlock`); with a
    convolution shortcut the input stays as it is.

    Fast tier, inference, no hooks inside the block, not for a shortcut's first decoder call (whose
    first frames it trims), and for channel counts whose duplication is a view (`_dup_up_views`;
    otherwise the shortcut is diffusers' own); diffusers' forward otherwise (the exact tier always)."""

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):  # noqa: B006 - diffusers' signature
        shortcut = self.avg_shortcut
        if (shortcut is not None and first_chunk) or not _fast_path(self) or self._forward_hooks:
            return super().forward(x, feat_cache, feat_idx, first_chunk)
        # the input is kept for the shortcut (diffusers clones it even for a block without one);
        # only an identity shortcut of the first residual block writes its sum into it
        writes_input = isinstance(self.resnets[0].conv_shortcut, nn.Identity)  # (FastResidualBlock's sum)
        source = None if shortcut is None else x.clone() if writes_input else x
        for resnet in self.resnets:
            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx) if feat_cache is not None else resnet(x)
        up = self.upsampler
        if (up is not None and shortcut is not None and isinstance(up, FastUpsample)
                and up.mode in ("upsample2d", "upsample3d") and _fast_path(up)):
            # the shortcut added as the upsampler's phases are interleaved, where that pass can
            x, added = up.upsample(x, feat_cache, feat_idx, shortcut=(shortcut, source))
            if added:
                return x
        elif up is not None:
            x = up(x, feat_cache=feat_cache, feat_idx=feat_idx) if feat_cache is not None else up(x)
        if shortcut is None:
            return x
        views = _dup_up_views(shortcut, x, source)
        if views is None:
            return x + shortcut(source, first_chunk=first_chunk)
        # one Triton pass on CUDA (Wan 2.2 720p: 3.371 against 3.417 s with PyTorch's add of the views;
        # in the interleaving pass above, 3.052 against 3.072 s with this pass)
        if not fast.add_duplicated_(x, source, shortcut.factor_t, shortcut.factor_s, shortcut.repeats):
            target, duplicated = views
            target.add_(duplicated)
        return x


def _dup_addend(shortcut: nn.Module, source: torch.Tensor, out_shape: tuple[int, ...], like: torch.Tensor):
    """An `upsample.Addend` of diffusers' `DupUp3D` (not first_chunk) of `source`, for an upsampler
    output of `out_shape` ((b, c, t, h, w); its frames laid out like `like`'s dtype and device), where
    the interleaving pass adds it (`upsample.takes_addend`); else None."""
    ft, fs, repeats = shortcut.factor_t, shortcut.factor_s, shortcut.repeats
    b, cin, t, h, w = source.shape
    if (tuple(out_shape) != (b, shortcut.out_channels, t * ft, h * fs, w * fs)
            or cin * repeats != shortcut.out_channels * ft * fs * fs):
        return None
    addend = upsample.Addend(source, ft, fs, repeats, frames=t * ft)
    return addend if upsample.takes_addend(like, addend) else None


def _dup_up_views(shortcut: nn.Module, out: torch.Tensor, source: torch.Tensor):
    """(a view of `out`, a broadcasting view of `source`) indexed alike by (sample, channel, time
    factor, row factor, column factor, frame, row, column), such that `out + shortcut(source)`
    (diffusers' `DupUp3D`, not first_chunk) is `out` with the second view added to the first; None
    where the duplication is no view: its repeats (each input channel's copies in a row of output
    channels) must be the product of the trailing ones of the (time, row, column) factors, as they
    are in Wan 2.2 (8 = 2 x 2 x 2 from 1024 to 1024 channels; 2, the column factor, from 1024 to 512).

    diffusers: the input's channel cc = cin * repeats + r is output channel c's sub-voxel
    q = (i * fs + j) * fs + k with cc = c * F + q (F = ft * fs * fs); output frame t * ft + i, row
    h * fs + j, column w * fs + k. So cin = c * (F / repeats) + q // repeats."""
    ft, fs, repeats = shortcut.factor_t, shortcut.factor_s, shortcut.repeats
    b, cin, t, h, w = source.shape
    cout = shortcut.out_channels
    if out.dim() != 5 or tuple(out.shape) != (b, cout, t * ft, h * fs, w * fs) or out.dtype != source.dtype:
        return None
    factors = (ft, fs, fs)
    lead = next((n for n in range(4) if math.prod(factors[n:]) == repeats), None)
    if lead is None or cin * repeats != cout * math.prod(factors):
        return None
    src = source.unflatten(1, (cout, *factors[:lead]))  # (b, cout, lead factors..., t, h, w)
    for _ in factors[lead:]:  # the repeated sub-voxels: broadcast
        src = src.unsqueeze(2 + lead)
    src = src.expand(b, cout, *factors, t, h, w)
    target = out.unflatten(2, (t, ft)).unflatten(4, (h, fs)).unflatten(6, (w, fs)).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return target, src


def _same_storage(y: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether `y` is `x`'s elements (the block wrote its sum into its input)."""
    return y.data_ptr() == x.data_ptr() and shard.same_layout(y, x)


def _fast_path(block: nn.Module, layers=None) -> bool:
    """Whether `block` may run its fast-tier forward: fast tier, inference, no autograd, and no hook
    on a layer inside it (the fast forward calls those layers' computations directly; `layers`:
    only these and what they hold, where the fast forward calls the others as modules)."""
    return fast.enabled() and not block.training and not torch.is_grad_enabled() and not _hooked(block, layers)


def _hooked(block: nn.Module, layers=None) -> bool:
    """Whether a forward hook would see a layer inside the block (`layers`: among these and what
    they hold), which the fast forwards do not call."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    # runs on every block call: a plain walk of the submodules (a third of `modules()`'s cost)
    pending = list(block._modules.values() if layers is None else layers)
    while pending:
        m = pending.pop()
        if m is not None:
            if m._forward_hooks or m._forward_pre_hooks:
                return True
            pending.extend(m._modules.values())
    return False


# Halo rows a side that conv1 of a block making one halo exchange takes (`_one_exchange`): its own
# padding row and the row conv2 would otherwise receive.
CONV1_ROWS = 2


def _one_exchange(block: nn.Module, x: torch.Tensor) -> bool:
    """Whether a sharded residual block can make one halo exchange for its two convolutions: both
    pad one row each side of the sharded axis with a 3-wide kernel there, and every shard holds at
    least two rows at this level (conv1 receives two from each neighbour)."""
    ctx = shard.current()
    if ctx is None:
        return False
    slot = 2 if ctx.axis == shard.HEIGHT else 0  # in a causal conv's _padding (W, W, H, H, T, T)
    i = 1 if ctx.axis == shard.HEIGHT else 2  # in its kernel_size, stride, dilation (T, H, W)
    for conv in (block.conv1, block.conv2):
        if not hasattr(conv, "input_buffer") or tuple(conv._padding[slot : slot + 2]) != (1, 1):
            return False
        if (conv.kernel_size[i], conv.stride[i], conv.dilation[i]) != (3, 1, 1):
            return False
    return min(ctx.extents_at(x.shape[ctx.dim(x)])) >= CONV1_ROWS


def _keep_graphs(vae, z: torch.Tensor, per_step: int) -> tuple:
    """(owner, signature, anchors) for graphs.DecoderSteps' `keep`: a kept graph serves a later
    request only with the same signature: the decoder calls' input shapes, dtype and device, the
    frames per call, the tier's settings, the shard (axis, extents, this rank, the process group)
    and where the decoder's weights lie and their versions. The group is held in `anchors`, so its
    identity stays its own while the graphs are kept."""
    ctx = shard.current()
    group = None if ctx is None else ctx.comm.group
    where = None if ctx is None else (ctx.axis, tuple(ctx.extents), ctx.comm.rank, ctx.comm.world, id(group))
    signature = ((*z.shape[:2], *z.shape[3:]), z.dtype, z.device, per_step, torch.is_grad_enabled(), where,
                 fast.settings_signature(), graphs.tensors_signature(vae.decoder))
    return vae, signature, (group,)


def _frame_pixels(x: torch.Tensor) -> int:
    """The pixels of one of `x`'s frames on the rank that holds the most of them: the same number on
    every rank of a sharded request, so that all take the same parts (fast.frames_for_layer) and
    their halo exchanges pair up (a block in parts sends raw rows, one not in parts normed rows)."""
    ctx = shard.current()
    pixels = x.shape[-2] * x.shape[-1]
    if ctx is None:
        return pixels
    local = x.shape[ctx.dim(x)]
    return pixels // local * max(ctx.extents_at(local))


def _edges(block: nn.Module, x: torch.Tensor):
    """Sharded, where `block` makes one halo exchange (`_one_exchange`): the rows of its input `x`
    that conv1 needs from the neighbours (two a side), received for all the parts of `x` at once,
    as (rows before, rows after), None beyond a global edge (Comm.neighbour_rows); else None. The
    norm before conv1 is computed voxel by voxel, so each part computes its halo rows from these
    (`_norm_with_edges_into_causal_conv`): the values its neighbours would send, with one exchange
    for all the parts instead of one per part."""
    ctx = shard.current()
    if ctx is None or not _one_exchange(block, x):
        return None
    return ctx.neighbour_rows(x, ctx.dim(x), CONV1_ROWS, CONV1_ROWS)


def _norm_with_edges_into_causal_conv(norm, conv, x, edges, feat_cache, feat_idx) -> _CausalInput:
    """`_norm_into_causal_conv` for a part of a sharded block's frames (`_forward_in_parts`) with
    conv1's two halo rows a side computed here: silu(norm(x)) between silu(norm(.)) of the part's
    rows of `edges` (`_edges`), zeros beyond a global edge, all written into conv1's input buffer,
    which then exchanges nothing (halo rows (0, 0): the buffer holds them)."""
    ctx = shard.current()
    dim, extent = ctx.dim(x), x.shape[ctx.dim(x)]
    shape = list(x.shape)
    shape[dim] += 2 * CONV1_ROWS
    pending = _causal_input(conv, x, feat_cache, feat_idx, (0, 0), tuple(shape))
    fast.rms_norm(x, norm.gamma, norm.bias, norm.scale, silu=True, out=pending.new.narrow(dim, CONV1_ROWS, extent))
    for rows, at in zip(edges, (0, extent + CONV1_ROWS)):
        target = pending.new.narrow(dim, at, CONV1_ROWS)
        if rows is None:
            target.zero_()
        else:
            fast.rms_norm(rows, norm.gamma, norm.bias, norm.scale, silu=True, out=target)
    return pending


def _norm_into_causal_conv(norm, pre_bias, conv, x, feat_cache, feat_idx, halo_rows=None) -> _CausalInput:
    """silu(norm(x)) written into `conv`'s input buffer, with diffusers' feature-cache bookkeeping;
    `convolve()` on the result runs the convolution (`halo_rows`: see HaloCausalConv3d)."""
    pending = _causal_input(conv, x, feat_cache, feat_idx, halo_rows)
    fast.rms_norm(x, norm.gamma, norm.bias, norm.scale, silu=True, pre_bias=pre_bias, out=pending.new)
    return pending


def _causal_input(conv, like, feat_cache, feat_idx, halo_rows=None, shape=None) -> _CausalInput:
    """`conv`'s input buffer for new frames shaped like `like` (or `shape`, in `like`'s dtype and on
    its device), its cached frames in place, with diffusers' feature-cache bookkeeping: the caller
    writes the new frames into the result's `new`, then calls `convolve()`."""
    cache, idx = None, None
    if feat_cache is not None:
        idx = feat_idx[0]
        cache = feat_cache[idx]
        feat_idx[0] += 1
    buf, new, ready, front = conv.input_buffer(like, cache, halo_rows, shape)
    frames = buf[:, :, buf.shape[2] - new.shape[2] :]  # the new frames with their halo rows: the next cache
    if feat_cache is not None and new.shape[2] >= CACHE_T and not _cache_in_place(cache, frames):
        # the new cache comes from the new frames alone and the buffer holds the cached frames now
        # (or `front` holds them until the convolution has read them): the entry released first, so
        # the old and the new cache are never alive together past the convolution
        feat_cache[idx] = cache = None
    return _CausalInput(conv, buf, new, frames, ready, halo_rows, feat_cache, idx, cache, front)


class _CausalInput:
    """A causal convolution's written input buffer whose cache update is still to come: diffusers'
    cache of the input's last frames is taken after the halo exchange, with the frames' halo rows
    (sharded), so the next call copies it into its buffer whole, one contiguous copy instead of a
    strided one each way, and exchanges only its new frames. The same values: the halo rows of a
    cached frame are those the exchange would bring again."""

    def __init__(self, conv, buf, new, frames, ready, halo_rows, feat_cache, idx, old, front=None):
        self.conv, self.buf, self.new, self.frames = conv, buf, new, frames
        self.width = new.shape[-1]  # (the buffer may be wider: zero columns, HaloCausalConv3d)
        self.ready, self.halo_rows = ready, halo_rows
        self.feat_cache, self.idx, self.old = feat_cache, idx, old
        self.front = front  # (the time padding read from the old cache where it lies, HaloCausalConv3d.input_buffer)

    def output_shape(self) -> tuple[int, ...]:
        return self.conv.output_shape(self.buf, self.width, self.front)

    def norms_in_epilogue(self) -> bool:
        """Whether `convolve(norm=..., out=...)` would compute the norm in the convolution kernel's
        epilogue into a causal input buffer (`HaloCausalConv3d.norms_in_epilogue`)."""
        return self.conv.norms_in_epilogue(self.buf, self.width, self.front)

    def convolve(self, with_bias: bool = True, add_to: torch.Tensor | None = None, norm=None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """The convolution (`HaloCausalConv3d.forward_buffer`; `add_to`: added to that tensor in
        place, which is returned; `norm`, `out`: that norm of it written into `out`, returned), then
        the cache update; the buffer is dropped."""
        y = self.conv.forward_buffer(self.buf, with_bias, self.halo_rows, self.ready, add_to, norm, out, self.width,
                                     self.front)
        if self.feat_cache is not None:  # (stream order: the convolution has read the old cache)
            _store_cache(self.feat_cache, self.idx, self.old, self.frames, owned=True)
        self.buf = self.new = self.frames = self.old = self.front = None
        return y


def _cache_in_place(cache, frames: torch.Tensor) -> bool:
    """Whether diffusers' cache update after `frames` (their last CACHE_T frames; after one frame,
    the old cache's last frame in front of it) can be written into the old cache tensor: it has
    that shape already (every decoder call after the second). The entry then keeps its storage
    from call to call instead of a new tensor each call, which leaves the caching allocator fewer
    blocks to split and less memory reserved (BENCHMARKS.md); the values are the same."""
    t = frames.shape[2]
    return (
        isinstance(cache, torch.Tensor)
        and cache.shape == (*frames.shape[:2], CACHE_T, *frames.shape[3:])
        and cache.dtype == frames.dtype
        and cache.device == frames.device
        and (t >= CACHE_T or (CACHE_T == 2 and t == 1))
    )


def _store_cache(feat_cache: list, idx: int, old, frames: torch.Tensor, owned: bool = False) -> None:
    """diffusers' cache update after a causal convolution's input `frames`, once the old entry `old`
    has been read: the last CACHE_T frames; with fewer, the old cache's last frame in front (zeros
    after an upsampler's "Rep" mark, nothing before the first call). Written into `old` where
    `_cache_in_place` allows, else stored as a new tensor. `owned`: `frames` is a buffer of the
    caller's that nothing writes or reads afterwards; where it is exactly CACHE_T frames of its own
    storage (the box kernel's buffers, which hold only the new frames, at parts of two frames:
    fast.frames_for_layer), it becomes the cache itself, not copied, and `old` is dropped."""
    if owned and _cache_in_place(old, frames) and frames.shape[2] == CACHE_T and _whole_storage(frames):
        feat_cache[idx] = frames
        return
    target = graphs.cache_target(idx)
    if target is not None and target is not old and _cache_in_place(target, frames):
        # a request with kept CUDA graphs capturing its first or second call: the new cache goes
        # where the steady graph reads it (the same values as below)
        if frames.shape[2] >= CACHE_T:
            target.copy_(frames[:, :, -CACHE_T:])
        elif old is None:  # the first call's one frame: a one-frame cache, the target's last frame
            feat_cache[idx] = target[:, :, -1:]
            feat_cache[idx].copy_(frames)
            return
        else:  # one new frame after the first call's (or, after an upsampler's "Rep", zeros)
            if isinstance(old, str):
                target[:, :, :1].zero_()
            else:
                target[:, :, :1].copy_(old[:, :, -1:])  # (where old is that last frame: the convolution has read it)
            target[:, :, 1:].copy_(frames)
        feat_cache[idx] = target
        return
    if _cache_in_place(old, frames):
        if frames.shape[2] >= CACHE_T:
            old.copy_(frames[:, :, -CACHE_T:])
        else:  # one new frame: the old cache's last frame moves to the front
            old[:, :, :1].copy_(old[:, :, 1:])
            old[:, :, 1:].copy_(frames)
        return
    cache_x = frames[:, :, -CACHE_T:].clone()
    if cache_x.shape[2] < 2 and old is not None:
        last = torch.zeros_like(cache_x) if isinstance(old, str) else old[:, :, -1:].to(cache_x.device)
        cache_x = torch.cat([last, cache_x], dim=2)
    feat_cache[idx] = cache_x


def _whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` spans its storage exactly (not a view into a larger tensor's)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _upsample_into_buffer(conv, like, frames, b, t, c, h, w):
    """`conv`'s input buffer holding the nearest 2x of `frames` ((b, t, c, h, w), or (b, t / 2, 2,
    c, h, w) after a time convolution), written in one strided copy (nearest-exact at an integer
    scale takes source row i // 2)."""
    buf, core = conv.input_buffer(like, (b * t, c, 2 * h, 2 * w))
    lead = frames.shape[:-3]
    target = core.unflatten(0, lead).unflatten(-1, (w, 2)).unflatten(-3, (h, 2))
    target.copy_(frames[..., None, :, None].expand(*lead, c, h, 2, w, 2))
    return buf


def _upsamples_into_conv(resample: nn.Module, upsample_cls: type) -> bool:
    """A Wan upsampling resample whose layers FastUpsample knows: nearest 2x, then a halo 3x3 conv."""
    if resample.mode not in ("upsample2d", "upsample3d"):
        return False
    layers = list(resample.resample)
    if len(layers) != 2 or not isinstance(layers[0], upsample_cls):
        return False
    scale = layers[0].scale_factor
    return (
        layers[0].mode in ("nearest", "nearest-exact")
        and layers[0].size is None
        and tuple(scale if isinstance(scale, (tuple, list)) else (scale, scale)) == (2.0, 2.0)
        and hasattr(layers[1], "input_buffer")
        and (resample.mode == "upsample2d" or hasattr(resample.time_conv, "input_buffer"))
    )


def _check_halo_conv2d(conv: nn.Conv2d) -> None:
    if conv.stride != (1, 1) or conv.padding_mode != "zeros" or conv.dilation != (1, 1):
        raise ValueError(
            f"vaeshard cannot shard {conv!r}: the halo exchange supports stride-1, zero-padded, "
            "undilated 2-D convolutions in the decoder; use mode='tile'"
        )


class _Wan(WanLike):
    decoder_takes_first_chunk = True
    clamp_tiled_decode = True

    @property
    def causal_conv_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

        return WanCausalConv3d

    @property
    def attention_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock

        return WanAttentionBlock

    @property
    def residual_block_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualBlock

        return WanResidualBlock

    @property
    def resample_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanResample

        return WanResample

    @property
    def upsample_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanUpsample

        return WanUpsample

    @property
    def up_block_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualUpBlock

        return WanResidualUpBlock


FAMILY = _Wan().family("wan", ("AutoencoderKLWan",))
