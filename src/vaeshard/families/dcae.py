"""AutoencoderDC (diffusers `AutoencoderDC`): the deep-compression image autoencoder of Sana (DC-AE,
32x spatial compression, 32 latent channels in Sana's f32c32).

Latents are 4-D (B, C, H, W). Declared (`SHARD_PLAN`): which layer of the encoder and decoder gets
which treatment when the feature map is sharded. Its EfficientViT blocks hold Sana's multi-scale
linear attention, which couples every pixel of a map through one small (head_dim + 1) x head_dim
matrix per head: sharded, each rank sums its pixels' part and one all-reduce per attention layer
adds them (`layers/linear_attention.py`). Its 3x3 and 5x5 (depthwise) convolutions take halo rows,
including the encoder's stride-2 downsampling convolutions (shards are whole latent rows, so every
slice starts and ends on the stride lattice); RMSNorm, BatchNorm in eval, nearest 2x interpolation
and pixel (un)shuffle are local. Code, because it cannot be data: the tile grids, which follow
diffusers' `tiled_decode` / `tiled_encode` (with the encode's zero padding of edge tiles to a
multiple of the compression ratio and its final crop) so `tile` stays bit-identical; and
`encode`'s result, a plain latent (`EncoderOutput`) rather than a distribution.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.convs import HaloConv2d
from ..layers.linear_attention import EvalBatchNorm2d, ShardedLinearAttention
from ..runtime.tile import TileOps
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
    local,
    pointwise_problem,
    request_inputs,
    strided_decode_grid,
    strided_encode_grid,
    with_tiling_off,
)

# -- the shard plan: every module of the encoder and decoder ----------------------------------------------


def _conv_problem(conv) -> str | None:
    """3x3 and 5x5 (depthwise) convolutions, stride 1 or 2 (the encoder's downsampling): halo rows
    replace their zero padding; shards are whole latent rows, so a stride-2 slice starts on the lattice."""
    same = all(k == 2 * p + 1 for k, p in zip(conv.kernel_size, conv.padding))
    if conv.stride not in ((1, 1), (2, 2)) or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or not same:
        return "a convolution that is not stride 1 or 2, undilated, zero-padded 'same'"
    return None


def _nearest(up) -> str | None:
    if up.interpolate and up.interpolation_mode != "nearest":
        return f"a {up.interpolation_mode} upsampler (not nearest)"
    return None


SHARD_PLAN = ShardPlan(
    roots=("encoder", "decoder"),
    rules=(
        Rule("Conv2d", LOCAL, check=pointwise_problem, when=lambda c: c.kernel_size == (1, 1)),
        Rule("Conv2d", HALO, HaloConv2d, check=_conv_problem, layer=Layer(padding="zeros")),
        # one all-reduce of V_pad Kᵀ per layer (the quadratic branch of small maps: keys and values gathered)
        Rule("SanaMultiscaleLinearAttention", WHOLE_MAP, ShardedLinearAttention),
        # running statistics: per channel; refused at run time in training mode
        Rule("BatchNorm2d", LOCAL, EvalBatchNorm2d, layer=Layer(norm="batch")),
        Rule("DCUpBlock2d", LOCAL, check=_nearest),  # nearest 2x or pixel shuffle; its conv is a Conv2d above
        Rule("RMSNorm", LOCAL, layer=Layer(norm="rms_channels")),
        # pixel unshuffle and its shortcut's channel mean; containers and per-pixel layers
        local("DCDownBlock2d", "Encoder", "Decoder", "ResBlock", "EfficientViTBlock", "GLUMBConv"),
        local("SanaMultiscaleAttentionProjection", "Linear", "ReLU", "ReLU6", "SiLU", "Mish", "GELU"),
        CONTAINERS,
    ),
)

# Named real configs (constructor arguments that differ from AutoencoderDC's defaults), for the command
# line. dc-ae-f32c32-sana-1.0: the AutoencoderDC(...) call of diffusers' scripts/convert_dcae_to_diffusers.py
# (`convert_ae`, which converts that checkpoint): the default channels (128 ... 1024), layers
# (2, 2, 2, 3, 3, 3) / (3, 3, 3, 3, 3, 3) and multi-scales ((5,) on the three lowest levels), with these.
# diffusers' AutoencoderDC has no time axis (Sana-Video's pipeline decodes with other classes), so
# there is no Sana-Video DC-AE config to name.
SANA_F32C32 = {
    "encoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    "decoder_block_types": ["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    "downsample_block_type": "conv",
    "upsample_block_type": "interpolate",
    "scaling_factor": 0.41407,
}


# Two tiny layouts that keep every kind of layer the real ones have (4x compression, 4 latent channels,
# head_dim 8). "dcae": the f32c32 layout (stride-2 conv downsampling, nearest-interpolate upsampling),
# BatchNorm ResBlocks at the top decoder level, multi-scale attention (3x3 and 5x5 depthwise) on the two
# lower levels. "dcae_shuffle": pixel (un)shuffle resampling, the first level without layers (conv_in /
# conv_out are down / up blocks).
_TINY = {
    "latent_channels": 4,
    "attention_head_dim": 8,
    "encoder_block_out_channels": (8, 16, 16),
    "decoder_block_out_channels": (8, 16, 16),
}
TEST_CONFIGS = {
    "dcae": {
        **_TINY,
        "encoder_block_types": ("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
        "decoder_block_types": ("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
        "encoder_qkv_multiscales": ((), (3,), (5,)),
        "decoder_qkv_multiscales": ((), (3,), (5,)),
        "downsample_block_type": "conv",
        "upsample_block_type": "interpolate",
        "decoder_norm_types": ("batch_norm", "rms_norm", "rms_norm"),
        "decoder_act_fns": ("relu", "silu", "silu"),
        "encoder_layers_per_block": (1, 1, 1),
        "decoder_layers_per_block": (1, 1, 1),
    },
    "dcae_shuffle": {
        **_TINY,
        "encoder_block_types": ("ResBlock", "ResBlock", "EfficientViTBlock"),
        "decoder_block_types": ("ResBlock", "ResBlock", "EfficientViTBlock"),
        "encoder_qkv_multiscales": ((), (), (5,)),
        "decoder_qkv_multiscales": ((), (), (5,)),
        "encoder_layers_per_block": (0, 1, 1),
        "decoder_layers_per_block": (0, 1, 1),
    },
}


def latent_channels(vae) -> int:
    return vae.config.latent_channels


# -- tile ---------------------------------------------------------------------------------------------------


def decode_tile_ops(vae, z_bchw):
    height, width = z_bchw.shape[-2:]
    if not (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height):
        return None  # diffusers' _decode does not tile this latent
    ratio = vae.spatial_compression_ratio
    channels = vae.config.in_channels
    return TileOps(
        grid=strided_decode_grid(vae, height, width, ratio),  # diffusers concatenates without a crop
        source=z_bchw,
        run=vae.decoder,
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=lambda s: (s[0], channels, s[2] * ratio, s[3] * ratio),
        out_dtype=z_bchw.dtype,
    )


def encode_tile_ops(vae, x_bchw):
    height, width = x_bchw.shape[-2:]
    if not (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
        return None  # diffusers' _encode does not tile this image
    ratio = vae.spatial_compression_ratio
    channels = vae.config.latent_channels
    return TileOps(
        grid=strided_encode_grid(vae, height, width, ratio),  # the crop to height // ratio is diffusers'
        source=x_bchw,
        run=lambda tile: vae.encoder(_pad_to_ratio(tile, ratio)),
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        finish=lambda merged: merged,
        out_shape=lambda s: (s[0], channels, -(-s[2] // ratio), -(-s[3] // ratio)),
        out_dtype=x_bchw.dtype,
    )


def _pad_to_ratio(tile, ratio: int):
    """diffusers' tiled_encode: an edge tile not a multiple of the ratio is zero-padded at its end."""
    if tile.shape[2] % ratio != 0 or tile.shape[3] % ratio != 0:
        pad_h = (ratio - tile.shape[2]) % ratio
        pad_w = (ratio - tile.shape[3]) % ratio
        tile = F.pad(tile, (0, pad_w, 0, pad_h))
    return tile


def untiled_decode(vae, z):
    return with_tiling_off(vae, lambda: vae._decode(z)).contiguous()


def untiled_encode(vae, x):
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


_DC = "diffusers.models.autoencoders.autoencoder_dc:AutoencoderDC."
_SANA = "diffusers.models.attention_processor:"


class _AutoencoderDC(Family):
    name = "dcae"
    classes = ("AutoencoderDC",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"dc-ae-f32c32-sana-1.0": ("AutoencoderDC", SANA_F32C32)}
    test_configs = {name: ("AutoencoderDC", config) for name, config in TEST_CONFIGS.items()}

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # every encoder level but the last halves height and width
        ratio = 2 ** (len(config["encoder_block_out_channels"]) - 1)
        return ShapeFacts(4, config["latent_channels"], ratio, 1, config["in_channels"])

    mirrors = (
        Mirror(_DC + "tiled_decode", "families/dcae.py decode_tile_ops (base.strided_decode_grid)", "ff8b0e9e08b37327"),
        Mirror(
            _DC + "tiled_encode",
            "families/dcae.py encode_tile_ops, _pad_to_ratio (base.strided_encode_grid)",
            "e20fdbd352542829",
        ),
        Mirror(
            _SANA + "SanaMultiscaleAttnProcessor2_0.__call__",
            "layers/linear_attention.py ShardedLinearAttention.forward",
            "e1a431fe02a6a4b1",
        ),
        Mirror(
            _SANA + "SanaMultiscaleLinearAttention.apply_linear_attention",
            "layers/linear_attention.py ShardedLinearAttention._linear",
            "699902b37f194fb7",
        ),
        Mirror(
            _SANA + "SanaMultiscaleLinearAttention.apply_quadratic_attention",
            "layers/linear_attention.py ShardedLinearAttention._quadratic",
            "862e3bb0981b546a",
        ),
    )
    latent_ndim = 4
    spatial_decode = True
    spatial_encode = True
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN

    def min_shard_rows(self, vae) -> int:
        """The widest halo of a convolution (5x5 multi-scale projections: 2 rows): the latent-level
        ones take it from the neighbouring rank's slice, which must hold that many rows."""
        pads = [max(m.padding) for m in vae.modules() if isinstance(m, nn.Conv2d) and isinstance(m.padding, tuple)]
        return max([1, *pads])

    def direct_encode(self, vae, x) -> torch.Tensor:
        return type(vae).encode(vae, x, return_dict=False, **request_inputs())[0]

    def encode_output(self, result, return_dict: bool):
        """diffusers' AutoencoderDC.encode returns the latent itself (EncoderOutput.latent)."""
        from diffusers.models.autoencoders.vae import EncoderOutput

        return EncoderOutput(latent=result) if return_dict else (result,)


FAMILY = _AutoencoderDC()
