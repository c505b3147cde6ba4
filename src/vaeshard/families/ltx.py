"""LTX-Video 0.9.x (diffusers AutoencoderKLLTXVideo) and LTX-2 / 2.3 (AutoencoderKLLTX2Video).

Latents are 5-D (B, C, T, H, W). The decoder may be conditioned on a timestep (`decode(z, temb)`;
LTX-2 also takes `causal`), which a request passes on to every rank's decoder, and may inject noise
drawn from the global RNG. Declared: which layers get which treatment when the feature map is
sharded. The causal convolutions pad time themselves (local) and leave the spatial padding to an
inner nn.Conv3d (zeros; reflect in LTX-2's decoder), which takes halo rows (`HaloPaddedConv`); the
residual blocks run `LTXResnet`: one that injects noise draws the whole map and keeps its slice, and
in the fast tier a block adds its residual in its second convolution's bias pass; the per-channel
RMS and layer norms, the timestep embeddings and scale/shift, and the pixel (un)shuffles of the
up- and downsamplers are per pixel or local to whole latent rows. Code, because it cannot be data:
the tile grid and per-tile run, kept line for line with diffusers' `tiled_decode` / `tiled_encode`,
and the noise draws a tile's decode makes, which a rank replays for the tiles other ranks decode so
every tile sees the RNG state it has in diffusers' tiled decode.
"""

from __future__ import annotations

import torch

from ..fast.causal_conv import ProducedRuntimeCausalConv3d, ProducedTimePaddedConv3d
from ..fast.norm_parts import FramePartsPerChannelRMSNorm, FramePartsRMSNorm
from ..fast.producers import (
    ChannelsLastRMSNormSiLUIntoConv,
    NormIntoConv,
    PerChannelRMSNormSiLUIntoConv,
    SiLUAfterProducer,
)
from ..layers.halo import PADDING_MODES, HaloPaddedConv
from ..layers.ltx_resnet import LTXResnet
from ..runtime.tile import TileOps
from .base import (
    CONTAINERS,
    FAST,
    HALO,
    LOCAL,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    local,
    padded,
    request_inputs,
    strided_decode_grid,
    strided_encode_grid,
    with_tiling_off,
)


def _halo_conv3d_problem(conv) -> str | None:
    same = all(k == 2 * p + 1 for k, p in zip(conv.kernel_size[1:], conv.padding[1:]))
    if conv.dilation[1:] != (1, 1) or conv.padding_mode not in PADDING_MODES or not same:
        return "a convolution that is not undilated 'same' with zeros/reflect/replicate padding"
    return None


def _unpadded_problem(conv) -> str | None:
    return None if conv.kernel_size[1:] == (1, 1) else "an unpadded convolution wider than 1x1"


class RMSNormIntoConvOrParts(ChannelsLastRMSNormSiLUIntoConv, FramePartsRMSNorm):
    """LTX-Video's RMS norm in the fast tier: into the next convolution's buffer where declared
    (NORM_INTO_CONV) and the request runs it, else in parts of frames."""


class PerChannelRMSNormIntoConvOrParts(PerChannelRMSNormSiLUIntoConv, FramePartsPerChannelRMSNorm):
    """LTX-2's RMS norm in the fast tier: into the next convolution's buffer where declared
    (LTX2_NORM_INTO_CONV) and the request runs it, else in parts of frames."""


# Which norm writes into which convolution's padded input in the fast tier (fast/producers.py), through
# which SiLU module: diffusers' forwards of these blocks (mirrored below) pass the norm's output only
# through that SiLU (and an eval-mode dropout) to that convolution, unless the block scales and
# shifts it by a timestep in between.
NORM_INTO_CONV = (
    NormIntoConv("LTXVideoResnetBlock3d", "norm1", "nonlinearity", "conv1", unless=("scale_shift_table",)),
    NormIntoConv("LTXVideoResnetBlock3d", "norm2", "nonlinearity", "conv2", unless=("scale_shift_table",)),
    NormIntoConv("LTXVideoDecoder3d", "norm_out", "conv_act", "conv_out", unless=("time_embedder",)),
    NormIntoConv("LTXVideoEncoder3d", "norm_out", "conv_act", "conv_out"),
)
LTX2_NORM_INTO_CONV = (
    NormIntoConv("LTX2VideoResnetBlock3d", "norm1", "nonlinearity", "conv1", unless=("scale_shift_table",)),
    NormIntoConv("LTX2VideoResnetBlock3d", "norm2", "nonlinearity", "conv2", unless=("scale_shift_table",)),
    NormIntoConv("LTX2VideoDecoder3d", "norm_out", "conv_act", "conv_out", unless=("time_embedder",)),
    NormIntoConv("LTX2VideoEncoder3d", "norm_out", "conv_act", "conv_out"),
)


# Decoder and encoder (either may be absent: a VAE kept for one direction). nn.Conv3d with spatial
# padding (inside every causal conv) -> halo rows in place of that padding, in its own mode at the
# global edges; an unpadded nn.Conv3d must be 1x1 spatially (LTX-2's shortcut); a residual block that
# injects noise -> whole-map noise, sliced; the timestep embedders are per sample (no feature map);
# the causal convs' time padding, the per-channel RMS and layer norms, the up/downsamplers' pixel
# (un)shuffles and the containers -> local.
SHARD_PLAN = ShardPlan(
    roots=("decoder", "encoder"),
    rules=(
        Rule((), LOCAL, where="*time_embedder", subtree=True),
        Rule("Conv3d", HALO, HaloPaddedConv, when=padded, check=_halo_conv3d_problem),
        Rule("Conv3d", LOCAL, check=_unpadded_problem),
        Rule(
            ("LTXVideoResnetBlock3d", "LTX2VideoResnetBlock3d"),
            WHOLE_MAP,
            LTXResnet,
            when=lambda block: getattr(block, "per_channel_scale1", None) is not None,
        ),
        Rule(("LTXVideoResnetBlock3d", "LTX2VideoResnetBlock3d"), FAST, LTXResnet),
        local("LTXVideoEncoder3d", "LTXVideoDecoder3d", "LTXVideoDownBlock3D", "LTXVideo095DownBlock3D"),
        local("LTXVideoMidBlock3d", "LTXVideoUpBlock3d", "LTXVideoResnetBlock3d"),
        Rule("LTXVideoCausalConv3d", LOCAL, ProducedTimePaddedConv3d),
        local("LTXVideoDownsampler3d", "LTXVideoUpsampler3d", "LTX2VideoEncoder3d", "LTX2VideoDecoder3d"),
        local("LTX2VideoDownBlock3D", "LTX2VideoMidBlock3d", "LTX2VideoUpBlock3d", "LTX2VideoResnetBlock3d"),
        Rule("LTX2VideoCausalConv3d", LOCAL, ProducedRuntimeCausalConv3d),
        local("LTX2VideoDownsampler3d", "LTX2VideoUpsampler3d"),
        Rule("RMSNorm", FAST, RMSNormIntoConvOrParts, layer=Layer(norm="rms_channels")),
        Rule("PerChannelRMSNorm", FAST, PerChannelRMSNormIntoConvOrParts, layer=Layer(norm="rms_channels")),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        local("LayerNorm"),
        CONTAINERS,
    ),
)


class LTXLike(Family):
    """Tile and shard behaviour of an LTX-Video VAE; the subclasses name the classes and mirrors."""

    latent_ndim = 5
    spatial_decode = True
    spatial_encode = True
    fast_tier = True  # the RMS norms in parts of frames (fast/norm_parts.py) or into the next conv
    layer_parts = False  # (FastPlan's layer parts: Wan's blocks)
    call_inputs = {"decode": ("temb",)}

    # -- facts (the subclasses' configs; their upsamplers' strides) -------------------------------

    @staticmethod
    def upsample_strides(config: dict) -> list[tuple[int, int, int]]:
        """(time, height, width) strides of the decoder's upsamplers: LTX-Video's resample all three."""
        return [(2, 2, 2) for scaled in config["decoder_spatio_temporal_scaling"] if scaled]

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # the decoder's upsamplers, then its unpatchify (its own patch sizes, in space and in time)
        space, time = config["patch_size"], config["patch_size_t"]
        for t, h, _ in self.upsample_strides(config):
            space, time = space * h, time * t
        return ShapeFacts(5, config["latent_channels"], space, time, config["out_channels"])

    def latent_channels(self, vae) -> int:
        return vae.config.latent_channels

    # -- shapes ---------------------------------------------------------------------------------

    @staticmethod
    def _upsamplers(vae):
        return [u for block in vae.decoder.up_blocks for u in (block.upsamplers or ())]

    def spatial_ratio(self, vae) -> int:
        """The decoder's own: the patch times each upsampler's spatial stride (LTX-2's class default
        `spatial_compression_ratio` counts temporal-only stages too, so it is not read here)."""
        ratio = vae.decoder.patch_size
        for up in self._upsamplers(vae):
            ratio *= up.stride[1]
        return ratio

    def _decoded_shape(self, vae, s):
        """A latent of shape `s` decoded (the upsamplers' shuffles, then the unpatchify)."""
        frames, height, width = s[2], s[3], s[4]
        for up in self._upsamplers(vae):
            frames = frames * up.stride[0] - (up.stride[0] - 1)
            height, width = height * up.stride[1], width * up.stride[2]
        dec = vae.decoder
        p, pt = dec.patch_size, dec.patch_size_t
        return (s[0], dec.conv_out.conv.out_channels // (p * p * pt), frames * pt, height * p, width * p)

    def _encoded_shape(self, vae, s):
        """A sample of shape `s` encoded: the patchify, then each downsampler (strided causal conv or
        pixel unshuffle)."""
        enc = vae.encoder
        frames, height, width = s[2] // enc.patch_size_t, s[3] // enc.patch_size, s[4] // enc.patch_size
        for block in enc.down_blocks:
            for down in block.downsamplers or ():
                if hasattr(down, "group_size"):  # pixel unshuffle after repeating the first frames
                    st = down.stride
                    frames, height, width = (frames + st[0] - 1) // st[0], height // st[1], width // st[2]
                else:
                    conv = down.conv
                    k, st = conv.kernel_size, conv.stride
                    tpad = k[0] - 1 if _is_causal(down) else 2 * ((k[0] - 1) // 2)
                    frames = (frames + tpad - k[0]) // st[0] + 1
                    height = (height + 2 * conv.padding[1] - k[1]) // st[1] + 1
                    width = (width + 2 * conv.padding[2] - k[2]) // st[2] + 1
        return (s[0], 2 * enc.conv_out.conv.out_channels - 2, frames, height, width)

    # -- decode ---------------------------------------------------------------------------------

    def _decoder_call(self, vae, z, inputs):
        return vae.decoder(z, inputs.get("temb"))

    def decode_tile_ops(self, vae, z):
        _, _, _, height, width = z.shape
        ratio = vae.spatial_compression_ratio
        tile_h = vae.tile_sample_min_height // ratio
        tile_w = vae.tile_sample_min_width // ratio
        if not (width > tile_w or height > tile_h):
            return None  # diffusers' _decode does not tile this latent
        grid = strided_decode_grid(vae, height, width, ratio)
        inputs = request_inputs()
        return TileOps(
            grid=grid,
            source=z,
            run=lambda tile: self._decoder_call(vae, tile, inputs),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: merged,
            out_shape=lambda s: self._decoded_shape(vae, s),
            out_dtype=z.dtype,
            skip=(lambda tile: self._replay_noise(vae, tile)) if self._noise_blocks(vae) else None,
        )

    def draws_noise(self, vae) -> bool:
        return bool(self._noise_blocks(vae))

    @staticmethod
    def _noise_blocks(vae):
        return [m for m in vae.decoder.modules() if getattr(m, "per_channel_scale1", None) is not None]

    def _replay_noise(self, vae, tile):
        """The RNG draws the decode of `tile` makes, in its order, without decoding it: each noise
        block draws an (H, W) map after each of its convolutions, at its level's extent."""
        dec = vae.decoder
        height, width = tile.shape[-2:]
        draws = []

        def block(resnet):
            if resnet is not None and resnet.per_channel_scale1 is not None:
                draws.extend([(height, width)] * (1 + (resnet.per_channel_scale2 is not None)))

        for resnet in dec.mid_block.resnets:
            block(resnet)
        for up_block in dec.up_blocks:
            block(up_block.conv_in)
            for up in up_block.upsamplers or ():
                height, width = height * up.stride[1], width * up.stride[2]
            for resnet in up_block.resnets:
                block(resnet)
        dtype = dec.conv_in.conv.weight.dtype  # the features' dtype, which diffusers draws in
        for shape in draws:
            torch.randn(shape, device=tile.device, dtype=dtype)

    def untiled_decode(self, vae, z):
        inputs = request_inputs()
        return with_tiling_off(vae, lambda: vae._decode(z, **inputs, return_dict=False)[0]).contiguous()

    def untiled_encode(self, vae, x):
        inputs = request_inputs()
        return with_tiling_off(vae, lambda: vae._encode(x, **inputs)).contiguous()

    # -- encode ---------------------------------------------------------------------------------

    def _encoder_call(self, vae, x, inputs):
        return vae.encoder(x)

    def encode_tile_ops(self, vae, x):
        _, _, _, height, width = x.shape
        if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
            return None  # diffusers' _encode does not tile this sample
        grid = strided_encode_grid(vae, height, width, vae.spatial_compression_ratio)
        inputs = request_inputs()
        return TileOps(
            grid=grid,
            source=x,
            run=lambda tile: self._encoder_call(vae, tile, inputs),
            blend_v=vae.blend_v,
            blend_h=vae.blend_h,
            finish=lambda merged: merged,
            out_shape=lambda s: self._encoded_shape(vae, s),
            out_dtype=x.dtype,
        )

    shard_plan = SHARD_PLAN


def _is_causal(conv) -> bool:
    return getattr(conv, "is_causal", True)


_LTX = "diffusers.models.autoencoders.autoencoder_kl_ltx:"
_LTX2 = "diffusers.models.autoencoders.autoencoder_kl_ltx2:"


def _mirrors(module: str, cls: str, prefix: str, shas: dict[str, str]) -> tuple[Mirror, ...]:
    ours = {
        f"{cls}.tiled_decode": "families/ltx.py decode_tile_ops",
        f"{cls}.tiled_encode": "families/ltx.py encode_tile_ops",
        f"{prefix}ResnetBlock3d.forward": "layers/ltx_resnet.py LTXResnet; families/ltx.py _replay_noise, "
        "NORM_INTO_CONV",
        f"{prefix}MidBlock3d.forward": "families/ltx.py _replay_noise (order of the noise draws)",
        f"{prefix}UpBlock3d.forward": "families/ltx.py _replay_noise (order of the noise draws)",
        f"{prefix}Upsampler3d.forward": "families/ltx.py _decoded_shape, _replay_noise (extents)",
        f"{prefix}Downsampler3d.forward": "families/ltx.py _encoded_shape",
        f"{prefix}Decoder3d.forward": "families/ltx.py _decoded_shape (unpatchify), NORM_INTO_CONV",
        f"{prefix}Encoder3d.forward": "families/ltx.py _encoded_shape (patchify, output channels), NORM_INTO_CONV",
        f"{prefix}CausalConv3d.forward": "layers/halo.py HaloPaddedConv (pads time, leaves space to self.conv); "
        "fast/causal_conv.py ProducedTimePaddedConv3d, ProducedRuntimeCausalConv3d",
    }
    norm = {
        "LTXVideo": (
            "diffusers.models.normalization:",
            "RMSNorm.forward",
            "fast/norm_parts.py FramePartsRMSNorm; kernels/norm.py mean_rms_norm",
        ),
        "LTX2Video": (
            module,
            "PerChannelRMSNorm.forward",
            "fast/norm_parts.py FramePartsPerChannelRMSNorm; kernels/norm.py per_channel_rms_norm",
        ),
    }[prefix]
    extra = (Mirror(norm[0] + norm[1], norm[2], shas[norm[1]]),)
    return tuple(Mirror(module + theirs, where, shas[theirs]) for theirs, where in ours.items()) + extra


class _LTXVideo(LTXLike):
    name = "ltx"
    classes = ("AutoencoderKLLTXVideo",)
    norm_into_conv = NORM_INTO_CONV
    # -- facts ----------------------------------------------------------------------------------
    configs = {"ltx": ("AutoencoderKLLTXVideo", {})}  # its defaults are the LTX-Video 0.9 VAE
    # LTX-Video 0.9.5's layout: a timestep-conditioned decoder with noise injection, residual
    # pixel-shuffle upsamplers, and the 0.9.5 encoder's spatial / temporal / spatiotemporal
    # pixel-unshuffle downsamplers (32x spatial, 8x temporal)
    test_configs = {
        "ltx": (
            "AutoencoderKLLTXVideo",
            {
                "latent_channels": 4,
                "block_out_channels": (8, 8, 16, 16, 16),
                "down_block_types": ("LTXVideo095DownBlock3D",) * 4,
                "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                "spatio_temporal_scaling": (True, True, True, True),
                "layers_per_block": (1, 1, 1, 1, 1),
                "decoder_block_out_channels": (8, 16, 32),
                "decoder_layers_per_block": (1, 1, 1, 1),
                "decoder_spatio_temporal_scaling": (True, True, True),
                "decoder_inject_noise": (True, True, True, False),
                "upsample_residual": (True, True, True),
                "upsample_factor": (2, 2, 2),
                "timestep_conditioning": True,
                "spatial_compression_ratio": 32,
                "temporal_compression_ratio": 8,
            },
        )
    }
    mirrors = _mirrors(
        _LTX,
        "AutoencoderKLLTXVideo",
        "LTXVideo",
        {
            "AutoencoderKLLTXVideo.tiled_decode": "f5e5eea05f5cafe8",
            "AutoencoderKLLTXVideo.tiled_encode": "1a8dda86ddb837d0",
            "LTXVideoResnetBlock3d.forward": "08c7d0a813e922a8",
            "LTXVideoMidBlock3d.forward": "6097bc2f085edb90",
            "LTXVideoUpBlock3d.forward": "afba7d71e0cf162b",
            "LTXVideoUpsampler3d.forward": "a4e78415a16cfb00",
            "LTXVideoDownsampler3d.forward": "472ad4a8f0c9966c",
            "LTXVideoDecoder3d.forward": "2be406b37a295abd",
            "LTXVideoEncoder3d.forward": "991b83d8cd14f556",
            "LTXVideoCausalConv3d.forward": "9c8e3f9c4707609b",
            "RMSNorm.forward": "25f4c6d067d464a9",
        },
    )


class _LTX2Video(LTXLike):
    name = "ltx2"
    classes = ("AutoencoderKLLTX2Video",)
    norm_into_conv = LTX2_NORM_INTO_CONV
    # -- facts ----------------------------------------------------------------------------------
    configs = {"ltx2": ("AutoencoderKLLTX2Video", {})}  # its defaults are the LTX-2 VAE
    # LTX-2's layout: a reflect-padded causal decoder with spatial-only and spatiotemporal upsamplers,
    # timestep conditioning and noise injection; an encoder with LTX-2's downsamplers
    test_configs = {
        "ltx2": (
            "AutoencoderKLLTX2Video",
            {
                "latent_channels": 4,
                "block_out_channels": (8, 8, 16, 16),
                "layers_per_block": (1, 1, 1, 1, 1),
                "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                "decoder_block_out_channels": (8, 16, 32),
                "decoder_layers_per_block": (1, 1, 1, 1),
                "upsample_type": ("spatial", "spatiotemporal", "spatiotemporal"),
                "decoder_inject_noise": (True, True, False, True),
                "timestep_conditioning": True,
                "spatial_compression_ratio": 32,
                "temporal_compression_ratio": 8,
            },
        )
    }

    @staticmethod
    def upsample_strides(config: dict) -> list[tuple[int, int, int]]:
        # diffusers reverses the scaling flags (not the types) and takes a bool for every block
        scaling = config["decoder_spatio_temporal_scaling"]
        if isinstance(scaling, bool):
            scaling = (scaling,) * (len(config["decoder_layers_per_block"]) - 1)
        strides = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}
        return [strides[kind] for scaled, kind in zip(reversed(scaling), config["upsample_type"]) if scaled]

    call_inputs = {"decode": ("temb", "causal"), "encode": ("causal",)}
    mirrors = _mirrors(
        _LTX2,
        "AutoencoderKLLTX2Video",
        "LTX2Video",
        {
            "AutoencoderKLLTX2Video.tiled_decode": "0e1f07d8950dd168",
            "AutoencoderKLLTX2Video.tiled_encode": "0eacb232edb0c438",
            "LTX2VideoResnetBlock3d.forward": "ace29674f0c831ba",
            "LTX2VideoMidBlock3d.forward": "2e251c5f6fe55330",
            "LTX2VideoUpBlock3d.forward": "9f083ffc90a0c4c3",
            "LTX2VideoUpsampler3d.forward": "d8ffe7d1d71c84ea",
            "LTX2VideoDownsampler3d.forward": "3045048f0b6e08d3",
            "LTX2VideoDecoder3d.forward": "9b636b882880eb5f",
            "LTX2VideoEncoder3d.forward": "26753daac3fdb3af",
            "LTX2VideoCausalConv3d.forward": "a36ffb016bcb1d81",
            "PerChannelRMSNorm.forward": "8af7076a14ff8423",
        },
    )

    def _decoder_call(self, vae, z, inputs):
        return vae.decoder(z, inputs.get("temb"), causal=inputs.get("causal"))

    def _encoder_call(self, vae, x, inputs):
        return vae.encoder(x, causal=inputs.get("causal"))


LTX_FAMILY = _LTXVideo()
LTX2_FAMILY = _LTX2Video()
