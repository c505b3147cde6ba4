"""Mochi 1 (diffusers `AutoencoderKLMochi`).

Latents are 5-D (B, C, T, H, W), 8x spatial and 6x temporal compression in the real config (12
latent channels). diffusers decodes a clip in one shot by default (`_decode` calls the decoder on the
whole latent; frame-wise decoding is a private switch, `_enable_framewise_decoding`, which sets every
causal convolution to the "constant" mode: in diffusers 0.42 it then loses its spatial padding and
the decode fails, so vaeshard refuses such a VAE rather than decode it). `tile` is diffusers'
`tiled_decode` / `tiled_encode` (one-shot tiles) cut into tiles spread over ranks, and a sharded
request runs diffusers' `_decode` / `_encode` on each rank's rows with leaf layers swapped:

- `CogVideoXCausalConv3d` in "replicate" mode (3x3x3 stride 1 in the resnets; the encoder's
  downsamplers, kernel = stride = (t, 2, 2) without spatial padding): halo rows from the
  neighbours, the edge row repeated at the global edges (layers/halo.py);
- the nn.GroupNorm inside `MochiChunkedGroupNorm3D`: that norm runs the GroupNorm on chunks of
  frames, each frame a sample of its own, so its statistics are per (frame, group); sharded, each
  frame's sums are combined over the ranks (layers/norms.py GlobalGroupNorm, two all-reduces per
  chunk) and diffusers' chunking is kept as it is;
- per pixel and left as they are: SiLU, the 1x1x1 `conv_in`, the Linear projections (`proj_in`,
  `proj_out`, the up blocks' `proj`), the Fourier features, and the up blocks' depth-to-space
  rearrange (local: shards are whole latent rows);
- the encoder's attention (`Attention` with `MochiVaeAttnProcessor2_0`): diffusers runs it over
  the frames of each pixel (a batch of H*W sequences of T tokens, causal over frames), so it is
  local to a pixel and sees exactly the frames diffusers' causal mask allows, sharded or not.

The encoder is made of the same kinds of layer, so encode shards too. Every feature map is held
by rows: no layer gathers one.

Fast tier: the decode runs as a frame loop (fast/frame_loop.py, `LOOP`): conv_in and block_in over
the whole clip at latent resolution, then the up blocks, block_out, SiLU and proj_out one chunk of
latent frames at a time, each causal convolution caching the last two frames of its padded input
(fast/causal_conv.py); the first output frames are dropped as `_decode` drops them. Every other
decoder layer is per frame (the GroupNorms' statistics are per frame), so peak memory follows the
frames per call, not the clip's length. The exact tier and `tile` run diffusers' decode.
"""

from __future__ import annotations

import math

from ..fast import frame_loop
from ..fast.causal_conv import CachedReplicateCachedCausalConv3d, loop_problem
from ..fast.depth_to_space import MochiUpBlock
from ..fast.producers import FrameGroupNormSiLUIntoConv, NormIntoConv, SiLUAfterProducer
from ..fast.residual_blocks import MochiResnet
from ..layers import tier as fast
from ..layers.halo import HaloPadThenCachedConv, replicate_causal_problem
from ..layers.norms import GlobalGroupNorm
from ..runtime.tile import TileOps
from .base import (
    CONTAINERS,
    FAST,
    GLOBAL_NORM,
    HALO,
    LOCAL,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    local,
    pointwise_problem,
    strided_decode_grid,
    strided_encode_grid,
    with_tiling_off,
)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _causal_convs(vae):
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

    return [(n, m) for n, m in vae.named_modules() if isinstance(m, CogVideoXCausalConv3d)]


def check_one_shot(vae) -> None:
    """ValueError for a VAE switched to frame-wise decoding or encoding (diffusers' private
    `_enable_framewise_decoding` / `_enable_framewise_encoding`): its causal convolutions are then in
    the "constant" mode, which diffusers 0.42 builds without spatial padding (its decode fails, and
    its frame-wise encode raises NotImplementedError), so vaeshard does not run it."""
    constant = [n for n, m in _causal_convs(vae) if m.pad_mode != "replicate"]
    if vae.use_framewise_decoding or vae.use_framewise_encoding or constant:
        where = f" ({constant[0]} has pad_mode {dict(_causal_convs(vae))[constant[0]].pad_mode!r})" if constant else ""
        raise ValueError(
            "vaeshard runs AutoencoderKLMochi's one-shot decode and encode only (diffusers' default); this VAE "
            f"was switched to frame-wise decoding or encoding{where}, which diffusers' causal convolutions "
            "do not support without their spatial padding. Build the VAE again without "
            "_enable_framewise_decoding / _enable_framewise_encoding"
        )


# -- shapes ---------------------------------------------------------------------------------------


def _decoded_shape(vae, s):
    """A latent of shape `s` decoded: each up block multiplies frames, height and width by its
    expansions; then diffusers drops the first `temporal_compression_ratio - 1` frames."""
    frames, height, width = s[2], s[3], s[4]
    for up in vae.decoder.up_blocks:
        frames *= up.temporal_expansion
        height *= up.spatial_expansion
        width *= up.spatial_expansion
    frames -= _dropped(vae, frames)
    return (s[0], vae.decoder.proj_out.out_features, frames, height, width)


def _dropped(vae, frames: int) -> int:
    """The frames `_decode` drops from the start of the decoder's `frames` output frames."""
    if vae.drop_last_temporal_frames and frames >= vae.temporal_compression_ratio:
        return vae.temporal_compression_ratio - 1
    return 0


def _expanded(vae, latent_frames: int) -> int:
    for up in vae.decoder.up_blocks:
        latent_frames *= up.temporal_expansion
    return latent_frames


def _encoded_shape(vae, s):
    """A sample of shape `s` encoded: each down block's causal convolution (time padded in front by
    kernel - 1), then the moments (2 x latent channels) of `proj_out`."""
    frames, height, width = s[2], s[3], s[4]
    for down in vae.encoder.down_blocks:
        conv = down.conv_in
        (kt, kh, kw), (st, sh, sw) = conv.conv.kernel_size, conv.conv.stride
        w_left, w_right, h_top, h_bottom, t_front, t_back = conv.time_causal_padding
        frames = (frames + t_front + t_back - kt) // st + 1
        height = (height + h_top + h_bottom - kh) // sh + 1
        width = (width + w_left + w_right - kw) // sw + 1
    return (s[0], vae.encoder.proj_out.out_features, frames, height, width)


# -- tile -----------------------------------------------------------------------------------------


def _decode_tile(vae, tile):
    """diffusers' `tiled_decode` loop body for one tile (one-shot): the decoder, then the first
    frames dropped."""
    time, _ = vae.decoder(tile)
    if vae.drop_last_temporal_frames and time.size(2) >= vae.temporal_compression_ratio:
        time = time[:, :, vae.temporal_compression_ratio - 1 :]
    return time


def decode_tile_ops(vae, z):
    """diffusers' `tiled_decode`: latent tiles of `tile_sample_min_* // ratio` every
    `tile_sample_stride_* // ratio`, blended over the sample tile less its stride, cut to the stride,
    the result cropped to the latent times the ratio."""
    check_one_shot(vae)
    _, _, _, height, width = z.shape
    ratio = vae.spatial_compression_ratio
    if not (width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio):
        return None  # diffusers' _decode does not tile this latent
    return TileOps(
        grid=strided_decode_grid(vae, height, width, ratio),
        source=z,
        run=lambda tile: _decode_tile(vae, tile),
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=lambda s: _decoded_shape(vae, s),
        out_dtype=z.dtype,
    )


def encode_tile_ops(vae, x):
    """diffusers' `tiled_encode`: sample tiles of `tile_sample_min_*` every `tile_sample_stride_*`,
    blended over the latent tile less its stride, cut to the stride, cropped to the sample over the
    ratio."""
    check_one_shot(vae)
    _, _, _, height, width = x.shape
    if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
        return None  # diffusers' _encode does not tile this sample
    return TileOps(
        grid=strided_encode_grid(vae, height, width, vae.spatial_compression_ratio),
        source=x,
        run=lambda tile: vae.encoder(tile)[0],
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=lambda s: _encoded_shape(vae, s),
        out_dtype=x.dtype,
    )


def untiled_decode(vae, z):
    check_one_shot(vae)
    if fast.enabled():
        return with_tiling_off(vae, frame_loop.decode, LOOP, vae, z)
    return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()


def direct_decode(vae, z):
    return frame_loop.direct_decode(vae, z, untiled_decode, _own_decode_runs)


def stream_decode(vae, z, whole: bool):
    return frame_loop.stream_decode(LOOP, vae, z, whole, _own_decode_runs, check=check_one_shot)


def _own_decode_runs(vae, z) -> bool:
    """A direct request runs the VAE's own `decode`: its tiling tiles `z`, or a hook wraps `decode`."""
    _, _, _, height, width = z.shape  # diffusers' test in `_decode`
    ratio = vae.spatial_compression_ratio
    rows, cols = vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio
    tiles = vae.use_tiling and (width > cols or height > rows)
    return tiles or hasattr(vae, "_hf_hook")


# -- the fast tier's frame loop -----------------------------------------------------------------------


def _head(decoder, z):
    """`MochiDecoder3D.forward` up to the up blocks: the whole clip at latent resolution."""
    hidden_states, _ = decoder.block_in(decoder.conv_in(z))
    return hidden_states


def _body(decoder, hidden_states):
    """The rest of `MochiDecoder3D.forward`, run on one chunk of latent frames (the causal
    convolutions' caches are the loop's, so none is passed)."""
    for up_block in decoder.up_blocks:
        hidden_states, _ = up_block(hidden_states)
    hidden_states, _ = decoder.block_out(hidden_states)
    hidden_states = decoder.nonlinearity(hidden_states)
    hidden_states = hidden_states.permute(0, 2, 3, 4, 1)
    hidden_states = decoder.proj_out(hidden_states)
    return hidden_states.permute(0, 4, 1, 2, 3)


# diffusers' `_decode` drops the first frames and does not clamp
LOOP = frame_loop.FrameLoop(
    head=_head,
    body=_body,
    frames_out=lambda vae, t: _expanded(vae, t) - _dropped(vae, _expanded(vae, t)),
    drop_front=lambda vae, t: _dropped(vae, _expanded(vae, t)),
)


def untiled_encode(vae, x):
    check_one_shot(vae)
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


# -- spatial shard --------------------------------------------------------------------------------


def _plain_attention(attn) -> str | None:
    if (
        getattr(attn, "is_cross_attention", False)
        or getattr(attn, "spatial_norm", None) is not None
        or getattr(attn, "added_kv_proj_dim", None) is not None
    ):
        return "attention with a spatial norm or cross/added keys"
    return None


def _looped_conv_problem(conv) -> str | None:
    return replicate_causal_problem(conv) or loop_problem(conv)


# Which per-frame GroupNorm writes into which causal convolution's padded input in the fast tier
# (fast/producers.py), through the block's SiLU module: diffusers' forward of the residual block
# (mirrored below) passes each norm's output only through it to the convolution after it. Only the
# decoder's convolutions take such a buffer (its frame loop's `CachedReplicateCachedCausalConv3d`).
NORM_INTO_CONV = (
    NormIntoConv("MochiResnetBlock3D", "norm1", "nonlinearity", "conv1"),
    NormIntoConv("MochiResnetBlock3D", "norm2", "nonlinearity", "conv2"),
)


# Encoder and decoder, of a VAE in diffusers' one-shot mode (`check_one_shot`).
# CogVideoXCausalConv3d ("replicate" mode) -> halo rows in place of its replicate padding on the
# sharded axis (its child convolution is unpadded, run by it), and in the decoder the frame loop's
# cache (the encoder's patchifying ones never run in it); nn.GroupNorm (inside MochiChunkedGroupNorm3D,
# per frame) -> statistics combined over the ranks; Attention (over each pixel's frames, with its
# projections and q/k norms) -> local; a 1x1x1 nn.Conv3d, Linear, SiLU, Fourier features, the up
# blocks' depth-to-space rearrange, the containers -> local.
SHARD_PLAN = ShardPlan(
    roots=("encoder", "decoder"),
    check_model=check_one_shot,
    rules=(
        Rule(
            "CogVideoXCausalConv3d",
            HALO,
            CachedReplicateCachedCausalConv3d,
            where="decoder.*",
            check=_looped_conv_problem,
            layer=Layer(padding="replicate", cache=True),
        ),
        Rule(
            "CogVideoXCausalConv3d",
            HALO,
            HaloPadThenCachedConv,
            check=replicate_causal_problem,
            layer=Layer(padding="replicate"),
        ),
        Rule("CogVideoXSafeConv3d", LOCAL, parent="CogVideoXCausalConv3d"),  # unpadded, run by its parent
        Rule("GroupNorm", GLOBAL_NORM, GlobalGroupNorm, layer=Layer(norm="group")),
        Rule("Attention", LOCAL, check=_plain_attention, subtree=True),
        Rule("Conv3d", LOCAL, check=pointwise_problem),
        local("MochiEncoder3D", "MochiDecoder3D", "MochiMidBlock3D", "MochiDownBlock3D"),
        Rule("MochiUpBlock3D", FAST, MochiUpBlock),
        Rule("MochiChunkedGroupNorm3D", LOCAL, FrameGroupNormSiLUIntoConv),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        Rule("MochiResnetBlock3D", FAST, MochiResnet),
        local("FourierFeatures", "Linear"),
        CONTAINERS,
    ),
)


_M = "diffusers.models.autoencoders.autoencoder_kl_mochi:"
_COG = "diffusers.models.autoencoders.autoencoder_kl_cogvideox:"


class _Mochi(Family):
    name = "mochi"
    classes = ("AutoencoderKLMochi",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"mochi": ("AutoencoderKLMochi", {})}  # its defaults are the Mochi 1 VAE
    # every kind of layer of the real one (tests/models.py says which) at widths of 32 and 64, one
    # resnet per block below full resolution and none at it
    test_configs = {
        "mochi": (
            "AutoencoderKLMochi",
            {
                "encoder_block_out_channels": (32, 32, 32, 64),
                "decoder_block_out_channels": (32, 32, 32, 64),
                "latent_channels": 4,
                "layers_per_block": (0, 1, 1, 1, 1),
                "latents_mean": (0.0,) * 4,
                "latents_std": (1.0,) * 4,
            },
        )
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # each up block expands height and width by its spatial expansion and time by its temporal one;
        # diffusers drops the frames the first latent frame expands to, but one
        space, time = math.prod(config["spatial_expansions"]), math.prod(config["temporal_expansions"])
        return ShapeFacts(5, config["latent_channels"], space, time, config["out_channels"])

    mirrors = (
        Mirror(
            _M + "AutoencoderKLMochi._decode",
            "families/mochi.py decode_tile_ops (when diffusers tiles), _decoded_shape, LOOP (frames dropped)",
            "404f79215d20c1f0",
        ),
        Mirror(
            _M + "AutoencoderKLMochi._encode",
            "families/mochi.py encode_tile_ops (when diffusers tiles)",
            "b3e4dbfdb9a8028b",
        ),
        Mirror(
            _M + "AutoencoderKLMochi.tiled_decode",
            "families/mochi.py decode_tile_ops, _decode_tile",
            "cf2a6d6b8dd004b3",
        ),
        Mirror(_M + "AutoencoderKLMochi.tiled_encode", "families/mochi.py encode_tile_ops", "20f412a2903f327f"),
        Mirror(
            _M + "AutoencoderKLMochi._enable_framewise_decoding",
            "families/mochi.py check_one_shot (the switch sets pad_mode 'constant')",
            "90b5600501920c4e",
        ),
        Mirror(
            _M + "MochiUpBlock3D.forward",
            "families/mochi.py _decoded_shape; depth-to-space kept local; fast/depth_to_space.py MochiUpBlock",
            "aa044c20321c63b9",
        ),
        Mirror(
            _M + "MochiDecoder3D.forward",
            "families/mochi.py _decoded_shape (output channels), _head, _body (the frame loop's split)",
            "ef4c4b601c7f247d",
        ),
        Mirror(
            _M + "MochiEncoder3D.forward", "families/mochi.py _encoded_shape (moments of proj_out)", "37bfa7d19e337c14"
        ),
        Mirror(
            _M + "MochiChunkedGroupNorm3D.forward",
            "families/mochi.py SHARD_PLAN (per-frame GroupNorm chunks: GlobalGroupNorm on each)",
            "15e1b1ffbfad5413",
        ),
        Mirror(
            _M + "MochiResnetBlock3D.forward",
            "families/mochi.py NORM_INTO_CONV (norm -> SiLU -> causal convolution, nothing else reads the norm); "
            "fast/residual_blocks.py MochiResnet",
            "dccba3b81b0e45c2",
        ),
        Mirror(
            _M + "MochiDownBlock3D.forward",
            "families/mochi.py SHARD_PLAN (attention over each pixel's frames: local)",
            "2ff2c963ceed8f89",
        ),
        Mirror(
            _COG + "CogVideoXCausalConv3d.forward",
            "layers/halo.py HaloPadThenCachedConv.forward; fast/causal_conv.py padded_in_loop",
            "bae9401dabb7f044",
        ),
        Mirror(
            _COG + "CogVideoXCausalConv3d.fake_context_parallel_forward",
            "layers/halo.py HaloPadThenCachedConv.forward (replicate padding)",
            "ef6a7f17d4baf334",
        ),
    )
    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    frame_loop = True  # in the fast tier: fast/frame_loop.py, `LOOP`
    norm_into_conv = NORM_INTO_CONV
    frame_loop_graphs = False
    layer_parts = False  # diffusers' layers, a whole call's frames at once
    streams_steps = True  # the frame loop's chunks, in the fast tier
    fast_tier = True
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    direct_decode = staticmethod(direct_decode)
    stream_decode = staticmethod(stream_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN

    def spatial_ratio(self, vae) -> int:
        ratio = 1
        for up in vae.decoder.up_blocks:
            ratio *= up.spatial_expansion
        return ratio


FAMILY = _Mochi()
