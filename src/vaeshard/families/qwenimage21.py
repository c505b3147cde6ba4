"""Qwen-Image 2.1 (diffusers AutoencoderKLQwenImage21): Wan 2.2's residual layout for images.

Latents are (B, 64, 1, H, W): one frame, 16x spatial, RGBA (4-channel) pixels, no patchify by
default. The tile grid, the per-tile run and the blending are Wan's (`WanLike`: diffusers' tiled
decode and encode are Wan's, line for line, with their own patchify), so `tile` stays bit-identical.

What differs for sharding: every "causal Conv3d" is an nn.Conv2d over the squeezed frame with its
zero padding in `_padding` (`layers/halo.py` HaloFrameConv2d gives it halo rows); the
upsamplers' 3x3 nn.Conv2d take halo rows (HaloPaddedConv), the downsamplers' ZeroPad2d takes the
neighbour's row (HaloZeroPad2d), the mid-block attention sees the whole frame (WholeFrameAttention).
The RMS norms, SiLU, the 1x1 convolutions, nearest 2x upsampling and the shortcuts' pixel (un)shuffle
(DupUp3D, AvgDown3D) are per pixel or local to whole latent rows. The encoder is made of the same
kinds of layer, so encode shards too. Any other layer is refused before anything is swapped.

Fast tier (not Wan's: its blocks write into 3-D convolutions' buffers and step a causal frame loop,
neither of which this model has): diffusers' layers and layout, with each residual block's norm1 and
norm2 and the decoder's and encoder's norm_out writing silu(norm(x)) straight into the channels-first
zero-padded frame the convolution after them convolves (`NORM_INTO_CONV`, fast/producers.py
`ProducedFrameConv2d`: the convolution is diffusers' call on the tensor its F.pad would make; the
norm rounds as diffusers' does, normalised in fp32, kernels/norm.py), and the decode of the one
frame without diffusers' feature cache (`decode_frame`: no clone of every convolution's input).
`frame_loop` is False (one frame).
"""

from __future__ import annotations

import torch

from ..fast.producers import NormIntoConv, ProducedFrameConv2d, RMSNormSiLUIntoConv, SiLUAfterProducer
from ..layers import tier
from ..layers.attention import WholeFrameAttention
from ..layers.halo import HaloPaddedConv, HaloZeroPad2d
from .base import (
    CONTAINERS,
    HALO,
    LOCAL,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    channel_norm_problem,
    local,
    padded,
    same_conv_problem,
    with_tiling_off,
)
from .wan import WanLike

_Q21 = "diffusers.models.autoencoders.autoencoder_kl_qwenimage21:"


def _unpadded_problem(conv) -> str | None:
    return None if tuple(conv.kernel_size) == (1, 1) else "an unpadded convolution wider than 1x1"


def _nearest_2x(up) -> str | None:
    scale = up.scale_factor
    scale = tuple(scale) if isinstance(scale, (tuple, list)) else (scale, scale)
    if up.mode not in ("nearest", "nearest-exact") or up.size is not None or scale != (2.0, 2.0):
        return "an upsampler other than nearest 2x"
    return None


# Which norm writes into which single-frame convolution's padded input in the fast tier, through which
# SiLU module (fast/producers.py): diffusers' forwards of these blocks pass the norm's output only
# through that SiLU (and an eval-mode dropout, which returns it as it is) to that convolution.
NORM_INTO_CONV = (
    NormIntoConv("QwenImage21ResidualBlock", "norm1", "nonlinearity", "conv1"),
    NormIntoConv("QwenImage21ResidualBlock", "norm2", "nonlinearity", "conv2"),
    NormIntoConv("QwenImage21Decoder3d", "norm_out", "nonlinearity", "conv_out"),
    NormIntoConv("QwenImage21Encoder3d", "norm_out", "nonlinearity", "conv_out"),
)


# Decoder and encoder. Halo rows for the padded single-frame convolutions (in the fast tier, where
# declared above, the buffer a norm writes into) and the upsamplers' 3x3 Conv2d (HaloPaddedConv:
# diffusers' own call outside a sharded request, in either tier), the neighbour's row for the
# downsamplers' ZeroPad2d (the stride-2 convolution after it is then local), whole-frame keys and
# values for the attention. The RMS norms (over channels), SiLU, 1x1 convolutions, nearest 2x
# upsampling and the pixel (un)shuffles are per pixel or local to whole latent rows; so are the
# containers.
SHARD_PLAN = ShardPlan(
    roots=("decoder", "encoder"),
    rules=(
        Rule(
            "QwenImage21CausalConv3d",
            HALO,
            ProducedFrameConv2d,
            when=lambda conv: any(conv._padding),
            check=same_conv_problem,
            layer=Layer(padding="zeros"),
        ),
        Rule("QwenImage21CausalConv3d", LOCAL, check=_unpadded_problem),
        Rule("Conv2d", HALO, HaloPaddedConv, when=padded, check=same_conv_problem, layer=Layer(padding="zeros")),
        Rule("Conv2d", LOCAL, where="*.resample.1", parent="Sequential"),  # stride 2, after the ZeroPad2d
        Rule("Conv2d", LOCAL, check=_unpadded_problem),
        Rule("ZeroPad2d", HALO, HaloZeroPad2d, layer=Layer(padding="zeros")),
        Rule("QwenImage21AttentionBlock", WHOLE_MAP, WholeFrameAttention),
        Rule("QwenImage21Upsample", LOCAL, check=_nearest_2x),
        Rule(
            "QwenImage21RMS_norm",
            LOCAL,
            RMSNormSiLUIntoConv,
            check=channel_norm_problem,
            layer=Layer(norm="rms_channels"),
        ),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        local("QwenImage21Encoder3d", "QwenImage21Decoder3d", "QwenImage21MidBlock", "QwenImage21Resample"),
        local("QwenImage21ResidualBlock", "QwenImage21ResidualDownBlock", "QwenImage21ResidualUpBlock"),
        local("QwenImage21UpBlock", "QwenImage21AvgDown3D", "QwenImage21DupUp3D"),
        CONTAINERS,
    ),
)


def _diffusers():
    from diffusers.models.autoencoders import autoencoder_kl_qwenimage21

    return autoencoder_kl_qwenimage21


class _QwenImage21(WanLike):
    name = "qwenimage21"
    classes = ("AutoencoderKLQwenImage21",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"qwenimage21": ("AutoencoderKLQwenImage21", {})}  # its defaults are the Qwen-Image 2.1 VAE
    # every kind of layer the real one has: residual up and down blocks with pixel (un)shuffle
    # shortcuts, a temporal and a spatial-only resample each way, a decoder wider than the encoder,
    # the mid-block attention; 4x spatial, z=4, RGBA
    test_configs = {
        "qwenimage21": (
            "AutoencoderKLQwenImage21",
            {
                "base_dim": 8,
                "decoder_base_dim": 12,
                "z_dim": 4,
                "dim_mult": [1, 2, 2],
                "num_res_blocks": 1,
                "temperal_downsample": [False, True],
                "latents_mean": [0.0] * 4,
                "latents_std": [1.0] * 4,
                "scale_factor_spatial": 4,
            },
        )
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # Wan's shapes, but one frame: the decoder is 2-D, whatever temperal_downsample says
        return super().shape_facts(class_name, config)._replace(temporal_factor=1)

    mirrors = (
        Mirror(
            _Q21 + "AutoencoderKLQwenImage21.tiled_decode",
            "families/wan/adapter.py decode_tile_ops, _decode_tile",
            "5c9fb90e9ed8d0a0",
        ),
        Mirror(
            _Q21 + "AutoencoderKLQwenImage21.tiled_encode",
            "families/wan/adapter.py encode_tile_ops, _encode_tile",
            "62a8b87f3994e53b",
        ),
        Mirror(
            _Q21 + "AutoencoderKLQwenImage21._decode",
            "families/wan/adapter.py _exceeds_one_tile (when diffusers tiles a decode); decode_frame",
            "6cf0269d4d6e59ad",
        ),
        Mirror(
            _Q21 + "AutoencoderKLQwenImage21._encode",
            "families/wan/adapter.py encode_tile_ops (when diffusers tiles an encode), encode_prepare",
            "79f3a6f98ba0ef01",
        ),
        Mirror(
            _Q21 + "QwenImage21CausalConv3d.forward",
            "layers/halo.py HaloFrameConv2d, fast/producers.py ProducedFrameConv2d",
            "c5c6c09450f877f7",
        ),
        Mirror(
            _Q21 + "QwenImage21AttentionBlock.forward", "layers/attention.py WholeFrameAttention", "7e88f423719e757d"
        ),
    )
    frame_loop = False  # one frame: no causal frame loop, no frames_per_step or CUDA graphs
    layer_parts = False  # whole frames: no layer of this class takes parts
    streams_steps = False  # stream_decode yields the one frame once
    # diffusers' layers and layout with the declared norms into the next convolutions' padded frames,
    # and the one frame decoded without the feature cache (module docstring)
    fast_tier = True
    norm_into_conv = NORM_INTO_CONV
    decoder_takes_first_chunk = True
    clamp_tiled_decode = True

    class_prefix = "QwenImage21"
    shard_plan = SHARD_PLAN
    install_layers = Family.install_layers  # the plan alone: none of Wan's fast-tier links

    # -- patchify: this class's own functions ----------------------------------------------------

    def encode_prepare(self, vae, x):
        return _diffusers()._patchify(x, patch_size=self.patch(vae)) if self.patch(vae) > 1 else x

    def _unpatchify(self, vae, x):
        return _diffusers()._unpatchify(x, patch_size=self.patch(vae)) if self.patch(vae) > 1 else x

    # -- untiled: diffusers' own loops ------------------------------------------------------------

    def untiled_decode(self, vae, z):
        if tier.enabled() and z.shape[2] == 1:
            return self.decode_frame(vae, z)
        return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()

    def decode_frame(self, vae, z):
        """diffusers' untiled `_decode` of one latent frame without its feature cache: for the first
        (and only) frame no convolution reads a cache and the temporal upsamplers skip their time
        convolution either way, so only the clone of each convolution's input into the cache goes."""
        x = vae.post_quant_conv(z)
        out = vae.decoder(x, first_chunk=True)
        return torch.clamp(self._unpatchify(vae, out), min=-1.0, max=1.0)

    def direct_decode(self, vae, z):
        return Family.direct_decode(self, vae, z)

    def decode_axis(self, vae, ranks, device):
        return None  # not measured: auto's baseline rule (the longer axis)


FAMILY = _QwenImage21()
