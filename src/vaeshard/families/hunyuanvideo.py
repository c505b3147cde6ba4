"""HunyuanVideo (diffusers `AutoencoderKLHunyuanVideo`; also Kandinsky 5's VAE).

Latents are 5-D (B, C, T, H, W), 8x spatial and 4x temporal compression in the real config; every
norm is a GroupNorm, whose statistics span the whole clip (its channels of a group, over T, H, W).

`tile` is diffusers' decode and encode with tiling on (`enable_tiling()`), bit for bit: above
`tile_sample_min_num_frames` sample frames (4 latent frames by default; `use_framewise_decoding` /
`use_framewise_encoding`, on by default) diffusers' default decode is itself tiled in time
(`_temporal_tiled_decode`: overlapping chunks of frames, each cut into `tiled_decode`'s spatial tiles
where it is larger than one, blended in time). vaeshard cuts the same spatial grid in every chunk,
spreads the tiles of all chunks over the ranks together (runtime/tile.py TimeChunks), merges each
chunk's tiles as diffusers does and then the chunks in time with diffusers' own blend.

The spatial modes are compared with diffusers' untiled decode and encode: `_decode` / `_encode` with
tiling and framewise decoding off (`use_tiling = use_framewise_decoding = use_framewise_encoding =
False`), the whole clip through the decoder (encoder) at once. Above 4 latent frames that is not
diffusers' default decode, which is tiled in time; mode `tile` gives that one. Each rank runs the
untiled decode on its whole latent rows (or columns) of every frame, with leaf layers swapped:

- `HunyuanVideoCausalConv3d` (replicate-padded causal convolutions; stride 2 in the encoder's
  downsamplers): halo rows from the neighbours, the edge row repeated at the global edges
  (layers/halo.py);
- `nn.GroupNorm` (the resnets', the output norms', the attention's): whole-clip statistics combined
  over the ranks (layers/norms.py);
- `HunyuanVideoMidBlock3D`'s `Attention` with the causal frame mask: the mask is never built; each
  query frame attends to the whole frames it may see, one frame's keys and values held at a time
  (layers/frame_causal_attention.py);
- per pixel or local and left as they are: SiLU, dropout, the 1x1x1 convolutions (quant convs,
  shortcuts), the attention's projections (per token) and the nearest upsampling (whole latent rows).

The encoder is made of the same kinds of layer, so encode shards too (sample extents a multiple of 8).

Fast tier: the mid-block attention runs as on a shard, without the mask, also where one rank decodes
(directly, or a tile, or a chunk of diffusers' default decode in time): for each query frame one
scaled-dot-product attention against the frames it may see (diffusers builds the (T*H*W)^2 mask in
float32 and then bf16); and each upsampler writes its nearest upsampling straight into its causal
convolution's padded input (`UpsampleIntoPadded`). The other layers are diffusers' own.
"""

from __future__ import annotations

import math

import torch

from ..fast.causal_conv import CachedReplicateCausalConv3d
from ..fast.producers import GlobalGroupNormIntoConv, NormIntoConv, SiLUAfterProducer, fill_edges
from ..fast.residual_blocks import HunyuanVideoResnet
from ..layers import tier as fast_tier
from ..layers.frame_causal_attention import FAST_NOTE, FrameCausalMidBlock, unsupported_attention
from ..layers.halo import replicate_causal_problem
from ..runtime.spatial import current
from ..runtime.tile import TileGrid, TileOps, TimeChunks
from .base import (
    CONTAINERS,
    GLOBAL_NORM,
    HALO,
    LOCAL,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    frames_out,
    local,
    pointwise_problem,
    strided_decode_grid,
    strided_encode_grid,
    with_tiling_off,
)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _upsamplers(vae) -> list:
    return [u for b in vae.decoder.up_blocks if b.upsamplers is not None for u in b.upsamplers]


def _downsamplers(vae) -> list:
    return [d for b in vae.encoder.down_blocks if b.downsamplers is not None for d in b.downsamplers]


def _decoded(vae, shape) -> tuple[int, ...]:
    """The decoder's output shape for a latent of `shape`: a temporal upsampler turns the first frame
    into one and every later one into `factor`; the spatial ones scale rows and columns."""
    frames, rows, cols = shape[2], shape[3], shape[4]
    for up in _upsamplers(vae):
        ft, fh, fw = (int(f) for f in up.upsample_factor)
        frames, rows, cols = frames_out(frames, ft), rows * fh, cols * fw
    return (shape[0], vae.decoder.conv_out.conv.out_channels, frames, rows, cols)


def _encoded(vae, shape) -> tuple[int, ...]:
    """The encoder's output shape (the moments) for a sample of `shape`: each downsampler's causal
    3x3x3 convolution, padded by two frames in front and one row and column each side, keeps
    `(n - 1) // stride + 1` of n along every axis."""
    frames, rows, cols = shape[2], shape[3], shape[4]
    for down in _downsamplers(vae):
        st, sh, sw = down.conv.conv.stride
        frames, rows, cols = (frames - 1) // st + 1, (rows - 1) // sh + 1, (cols - 1) // sw + 1
    return (shape[0], vae.quant_conv.out_channels, frames, rows, cols)


def _whole_grid(rows: int, cols: int, out_rows: int, out_cols: int) -> TileGrid:
    """One tile of every row and column: a chunk diffusers decodes (encodes) without spatial tiles."""
    return TileGrid.regular(
        rows,
        cols,
        rows,
        cols,
        rows,
        cols,
        blend_rows=0,
        blend_cols=0,
        keep_rows=out_rows,
        keep_cols=out_cols,
        out_rows=out_rows,
        out_cols=out_cols,
    )


def _merge_in_time(vae, chunks: list[torch.Tensor], blend: int, keep: int, frames: int) -> torch.Tensor:
    """diffusers' temporal blend loop (`_temporal_tiled_decode` / `_temporal_tiled_encode`): every chunk
    but the first without its first frame, blended over `blend` frames with the one before (in place),
    cut to `keep` frames (the first to `keep + 1`), concatenated and cut to `frames`."""
    row = [chunk if i == 0 else chunk[:, :, 1:, :, :] for i, chunk in enumerate(chunks)]
    result_row = []
    for i, tile in enumerate(row):
        if i > 0:
            tile = vae.blend_t(row[i - 1], tile, blend)
            result_row.append(tile[:, :, :keep, :, :])
        else:
            result_row.append(tile[:, :, : keep + 1, :, :])
    return torch.cat(result_row, dim=2)[:, :, :frames]


def _ops(vae, x, grid: TileGrid, run, out_shape, time: TimeChunks | None) -> TileOps:
    return TileOps(
        grid=grid,
        source=x,
        run=run,
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=out_shape,
        out_dtype=x.dtype,
        time=time,
    )


def decode_tile_ops(vae, z):
    """diffusers' `_decode` with tiling on: in time (`_temporal_tiled_decode`: latent chunks of
    `tile_sample_min_num_frames // ratio + 1` frames every `tile_sample_stride_num_frames // ratio`)
    where framewise decoding is on and the latent has more frames than a chunk less one; in space
    (`tiled_decode`'s grid) where the latent is larger than one tile; None where neither."""
    _, _, frames, height, width = z.shape
    ratio, t_ratio = vae.spatial_compression_ratio, vae.temporal_compression_ratio
    min_frames = vae.tile_sample_min_num_frames // t_ratio
    temporal = vae.use_framewise_decoding and frames > min_frames
    spatial = width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio
    if not (temporal or spatial):
        return None  # diffusers' _decode decodes it directly
    if spatial:
        grid = strided_decode_grid(vae, height, width, ratio)
    else:
        grid = _whole_grid(height, width, *_decoded(vae, z.shape)[-2:])
    time = None
    if temporal:
        stride = vae.tile_sample_stride_num_frames // t_ratio
        spans = tuple((i, min(i + min_frames + 1, frames)) for i in range(0, frames, stride))
        blend = vae.tile_sample_min_num_frames - vae.tile_sample_stride_num_frames
        keep, out_frames = vae.tile_sample_stride_num_frames, (frames - 1) * t_ratio + 1
        time = TimeChunks(spans, lambda chunks: _merge_in_time(vae, chunks, blend, keep, out_frames))
    return _ops(vae, z, grid, lambda tile: vae.decoder(vae.post_quant_conv(tile)), lambda s: _decoded(vae, s), time)


def encode_tile_ops(vae, x):
    """diffusers' `_encode` with tiling on: in time (`_temporal_tiled_encode`: sample chunks of
    `tile_sample_min_num_frames + 1` frames every `tile_sample_stride_num_frames`) where framewise
    encoding is on and the sample has more frames than `tile_sample_min_num_frames`; in space
    (`tiled_encode`'s grid) where it is larger than one tile; None where neither."""
    _, _, frames, height, width = x.shape
    ratio, t_ratio = vae.spatial_compression_ratio, vae.temporal_compression_ratio
    temporal = vae.use_framewise_encoding and frames > vae.tile_sample_min_num_frames
    spatial = width > vae.tile_sample_min_width or height > vae.tile_sample_min_height
    if not (temporal or spatial):
        return None  # diffusers' _encode encodes it directly
    if spatial:
        grid = strided_encode_grid(vae, height, width, ratio)
    else:
        grid = _whole_grid(height, width, *_encoded(vae, x.shape)[-2:])
    time = None
    if temporal:
        size, stride = vae.tile_sample_min_num_frames, vae.tile_sample_stride_num_frames
        spans = tuple((i, min(i + size + 1, frames)) for i in range(0, frames, stride))
        blend = size // t_ratio - stride // t_ratio
        keep, out_frames = stride // t_ratio, (frames - 1) // t_ratio + 1
        time = TimeChunks(spans, lambda chunks: _merge_in_time(vae, chunks, blend, keep, out_frames))
    return _ops(vae, x, grid, lambda tile: vae.quant_conv(vae.encoder(tile)), lambda s: _encoded(vae, s), time)


def own_result(vae, op, shape):
    """Family.own_result: diffusers' `_decode` / `_encode` tile in time where frame-wise decoding
    (encoding) is on, its default, and the clip is longer than one chunk, and in space where tiling is
    on and a frame is larger than one tile. `tile` follows both, and the chunks in time alone (each
    chunk's whole frame) where only the first applies; frame-wise chunks of frames larger than a tile
    with tiling off are the VAE's own."""
    _, _, frames, height, width = shape
    ratio, t_ratio = vae.spatial_compression_ratio, vae.temporal_compression_ratio
    if op == "decode":
        temporal = vae.use_framewise_decoding and frames > vae.tile_sample_min_num_frames // t_ratio
        larger = width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio
    else:
        temporal = vae.use_framewise_encoding and frames > vae.tile_sample_min_num_frames
        larger = width > vae.tile_sample_min_width or height > vae.tile_sample_min_height
    if larger and vae.use_tiling:
        return "tile"
    if temporal:
        return "own" if larger else "tile"
    return "untiled"


def _untiled(vae, fn):
    """`fn()` with diffusers' tiling, slicing and framewise (temporal) tiling switched off."""
    saved = vae.use_framewise_decoding, vae.use_framewise_encoding
    vae.use_framewise_decoding = vae.use_framewise_encoding = False
    try:
        return with_tiling_off(vae, fn)
    finally:
        vae.use_framewise_decoding, vae.use_framewise_encoding = saved


def untiled_decode(vae, z):
    return _untiled(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()


def untiled_encode(vae, x):
    return _untiled(vae, lambda: vae._encode(x)).contiguous()


# -- spatial shard ----------------------------------------------------------------------------------


def _attention_problem(attn) -> str | None:
    why = unsupported_attention(attn)
    return None if why is None else f"an attention vaeshard cannot shard: {why}"


class UpsampleIntoPadded:
    """Mixin for `HunyuanVideoUpsampleCausal3D` where one rank decodes, in the fast tier and in the
    exact tier of a request that asked for the fast tier (`tier.same_kernels`): the nearest
    upsampling (the first frame in space only, the later frames in time too) written straight into
    the replicate-padded input of its causal convolution, whose padding is then filled in place, and
    the convolution's child called on it as diffusers' forward calls it. diffusers holds the two
    interpolated pieces, their concatenation and the padded copy at once before the convolution (four
    full-resolution tensors; at 720p the largest of the decode besides the attention's mask); this
    holds the padded input alone. Nearest upsampling by integer factors copies values, so the
    convolution reads the same tensor as diffusers' (contiguous, the same values): the same bits. A
    mirror of diffusers' forward and of the convolution's padding (`mirrors`). Sharded, with
    exact=True, under autograd or with a hook on the convolution, diffusers' forward runs (with halo
    rows when sharded)."""

    def forward(self, hidden_states):
        conv = self.conv
        if (
            current() is not None
            or not (fast_tier.enabled() or fast_tier.same_kernels())
            or torch.is_grad_enabled()
            or conv._forward_hooks
            or conv._forward_pre_hooks
            or conv.pad_mode != "replicate"
        ):
            return super().forward(hidden_states)
        x = hidden_states
        b, c, t, h, w = x.shape
        ft, fh, fw = (int(f) for f in self.upsample_factor)
        w_left, w_right, h_top, h_bottom, front, back = conv.time_causal_padding
        frames = 1 + (t - 1) * ft
        buf = x.new_empty((b, c, front + frames + back, h * fh + h_top + h_bottom, w * fw + w_left + w_right))
        inner = buf[:, :, front : front + frames, h_top : h_top + h * fh, w_left : w_left + w * fw]
        # nearest: output pixel (i, j) of a frame is source (i // fh, j // fw); later frames repeat ft times
        inner[:, :, 0].unflatten(2, (h, fh)).unflatten(4, (w, fw)).copy_(
            x[:, :, 0, :, None, :, None].expand(b, c, h, fh, w, fw)
        )
        if t > 1:
            inner[:, :, 1:].unflatten(2, (t - 1, ft)).unflatten(4, (h, fh)).unflatten(6, (w, fw)).copy_(
                x[:, :, 1:, None, :, None, :, None].expand(b, c, t - 1, ft, h, fh, w, fw)
            )
        del x, hidden_states
        # replicate padding, as F.pad's: rows, then columns (corners included), then time
        for dim, before, after in ((3, h_top, h_bottom), (4, w_left, w_right), (2, front, back)):
            fill_edges(buf if dim == 2 else buf[:, :, front : front + frames], dim, before, after, "replicate")
        return conv.conv(buf)


def _upsampler_problem(up) -> str | None:
    factors = tuple(up.upsample_factor)
    if any(float(f) != int(f) or f < 1 for f in factors) or factors[1] != factors[2]:
        return f"an upsampler by {factors}, not integer and alike in height and width"
    return None


# Which GroupNorm writes into which causal convolution's padded input in the fast tier
# (fast/producers.py), through which SiLU module: diffusers' forwards of these blocks (mirrored below)
# pass the norm's output only through that SiLU (and an eval-mode dropout) to that convolution.
NORM_INTO_CONV = (
    NormIntoConv("HunyuanVideoResnetBlockCausal3D", "norm1", "nonlinearity", "conv1"),
    NormIntoConv("HunyuanVideoResnetBlockCausal3D", "norm2", "nonlinearity", "conv2"),
    NormIntoConv("HunyuanVideoDecoder3D", "conv_norm_out", "conv_act", "conv_out"),
    NormIntoConv("HunyuanVideoEncoder3D", "conv_norm_out", "conv_act", "conv_out"),
)


# The whole VAE (encoder, decoder, quant convs). HunyuanVideoCausalConv3d -> halo rows in place of its
# replicate padding on the sharded axis (its child Conv3d is then unpadded and local); nn.GroupNorm ->
# whole-clip statistics; HunyuanVideoMidBlock3D -> its attentions causal by frame without the mask
# (each must be plain self-attention with AttnProcessor2_0 or AttnProcessor; their Linear projections
# act per token); 1x1x1 Conv3d, nearest upsampling by integer factors, the containers -> local.
SHARD_PLAN = ShardPlan(
    rules=(
        Rule(
            "HunyuanVideoCausalConv3d",
            HALO,
            CachedReplicateCausalConv3d,
            check=replicate_causal_problem,
            layer=Layer(padding="replicate"),
        ),
        Rule("Conv3d", LOCAL, parent="HunyuanVideoCausalConv3d"),  # unpadded, run by its parent
        Rule("Conv3d", LOCAL, check=pointwise_problem),
        Rule("GroupNorm", GLOBAL_NORM, GlobalGroupNormIntoConv, layer=Layer(norm="group")),
        Rule("HunyuanVideoMidBlock3D", WHOLE_MAP, FrameCausalMidBlock),
        Rule("Attention", LOCAL, where="*.mid_block.attentions.*", check=_attention_problem),  # in the block's
        Rule("Linear", LOCAL, where="*.mid_block.attentions.*"),
        Rule("HunyuanVideoUpsampleCausal3D", LOCAL, UpsampleIntoPadded, check=_upsampler_problem),
        local("HunyuanVideoEncoder3D", "HunyuanVideoDecoder3D", "HunyuanVideoDownBlock3D", "HunyuanVideoUpBlock3D"),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        Rule("HunyuanVideoResnetBlockCausal3D", LOCAL, HunyuanVideoResnet),
        local("HunyuanVideoDownsampleCausal3D", "Mish", "GELU"),
        CONTAINERS,
    ),
)


_HV = "diffusers.models.autoencoders.autoencoder_kl_hunyuan_video:"


class _HunyuanVideo(Family):
    name = "hunyuanvideo"
    classes = ("AutoencoderKLHunyuanVideo",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"hunyuanvideo": ("AutoencoderKLHunyuanVideo", {})}  # its defaults are the HunyuanVideo VAE
    # every kind of layer of the real one at small widths: four levels (8x spatial, 4x temporal)
    test_configs = {
        "hunyuanvideo": (
            "AutoencoderKLHunyuanVideo",
            {"latent_channels": 4, "block_out_channels": (4, 8, 16, 16), "layers_per_block": 1, "norm_num_groups": 2},
        )
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # diffusers: a spatial upsampler on the first log2(spatial ratio) up blocks, a temporal one on
        # the log2(temporal ratio) blocks before the last
        levels = len(config["block_out_channels"])
        space = int(math.log2(config["spatial_compression_ratio"]))
        time = int(math.log2(config["temporal_compression_ratio"]))
        return ShapeFacts(
            5, config["latent_channels"], 2 ** min(levels, space), 2 ** min(levels - 1, time), config["out_channels"]
        )

    mirrors = (
        Mirror(
            _HV + "HunyuanVideoUpsampleCausal3D.forward",
            "families/hunyuanvideo.py UpsampleIntoPadded (nearest upsampling, first frame in space only)",
            "f0e6052496952a41",
        ),
        Mirror(
            _HV + "HunyuanVideoCausalConv3d.forward",
            "families/hunyuanvideo.py UpsampleIntoPadded (replicate padding, then the child conv)",
            "45611c78196e07d8",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo._decode",
            "families/hunyuanvideo.py decode_tile_ops (when diffusers tiles in time and space)",
            "a01a72ec30fead40",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo._encode",
            "families/hunyuanvideo.py encode_tile_ops (when diffusers tiles in time and space)",
            "ddd33a252ffa3384",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo.tiled_decode",
            "families/hunyuanvideo.py decode_tile_ops (base.strided_decode_grid)",
            "7b03fca15e588b2e",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo.tiled_encode",
            "families/hunyuanvideo.py encode_tile_ops (base.strided_encode_grid)",
            "3ccc216c9065ca37",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo._temporal_tiled_decode",
            "families/hunyuanvideo.py decode_tile_ops (spans), _merge_in_time",
            "bea359257447972e",
        ),
        Mirror(
            _HV + "AutoencoderKLHunyuanVideo._temporal_tiled_encode",
            "families/hunyuanvideo.py encode_tile_ops (spans), _merge_in_time",
            "f73cacefd2b8f5e2",
        ),
        Mirror(
            _HV + "HunyuanVideoCausalConv3d.forward",
            "layers/halo.py HaloPadThenConv.forward",
            "45611c78196e07d8",
        ),
        Mirror(
            _HV + "HunyuanVideoResnetBlockCausal3D.forward",
            "families/hunyuanvideo.py NORM_INTO_CONV (norm -> SiLU -> causal convolution, nothing else reads the norm)",
            "9f9c4a7dac7925ed",
        ),
        Mirror(
            _HV + "HunyuanVideoResnetBlockCausal3D.forward",
            "fast/residual_blocks.py HunyuanVideoResnet (the residual added in conv2's bias pass)",
            "9f9c4a7dac7925ed",
        ),
        Mirror(
            _HV + "HunyuanVideoDecoder3D.forward",
            "families/hunyuanvideo.py NORM_INTO_CONV (conv_norm_out -> conv_act -> conv_out)",
            "e959c3c77d54dbed",
        ),
        Mirror(
            _HV + "HunyuanVideoEncoder3D.forward",
            "families/hunyuanvideo.py NORM_INTO_CONV (conv_norm_out -> conv_act -> conv_out)",
            "eef9188817c44cda",
        ),
        Mirror(
            _HV + "HunyuanVideoMidBlock3D.forward",
            "layers/frame_causal_attention.py FrameCausalMidBlock.forward",
            "867906b6a211ccf3",
        ),
        Mirror(
            _HV + "prepare_causal_attention_mask",
            "layers/frame_causal_attention.py frame_causal_attention (frame i sees frames 0..i)",
            "6923366e09e9dd1c",
        ),
        Mirror(
            "diffusers.models.attention_processor:AttnProcessor2_0.__call__",
            "layers/frame_causal_attention.py attention_causal_by_frame",
            "d5a292e89ccd77a2",
        ),
    )
    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    fast_tier = True
    fast_notes = (FAST_NOTE,)
    norm_into_conv = NORM_INTO_CONV
    layer_parts = False  # diffusers' layers, a whole call's frames at once
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    own_result = staticmethod(own_result)
    untiled_decode = staticmethod(untiled_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN

    def spatial_ratio(self, vae) -> int:
        ratio = 1
        for up in _upsamplers(vae):
            ratio *= int(up.upsample_factor[1])
        return ratio


FAMILY = _HunyuanVideo()
