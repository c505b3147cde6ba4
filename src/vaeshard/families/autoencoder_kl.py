"""AutoencoderKL (diffusers `AutoencoderKL`): the image VAE of SD 1.x/2.x, SDXL, SD3 and FLUX.1, and
`AutoencoderKLFlux2` (FLUX.2 and the models built on its VAE), which holds the same Encoder and
Decoder with FLUX.2's config and whose decode, encode and tiled loops are AutoencoderKL's line for
line (both are mirrored below, so a change to either fails the drift test). FLUX.2's pipeline runs
its 2x2 patchify and BatchNorm outside `decode` / `encode`; vaeshard sees the same 4-D latents.

Latents are 4-D (B, C, H, W). Declared: which decoder layers get which treatment when the feature map
is sharded: 3x3 convs take halo rows, every GroupNorm (resnets, attention, `conv_norm_out`) takes
whole-map statistics, the mid-block attention sees the whole image. Code, because it cannot be data:
the tile grid arithmetic and the per-tile run, kept line for line with diffusers' `tiled_decode` /
`_tiled_encode` (same `int()` roundings, same unclipped concatenation) so `tile` stays bit-identical.
Spatial-shard encode is not offered: the encoder's Downsample2D pads (0, 1, 0, 1) inline with F.pad
before its stride-2 conv, and a halo-aware Downsample2D is not written yet; encode runs `tile` or
directly.
"""

from __future__ import annotations

from ..fast.producers import GlobalGroupNormIntoConv, NormIntoConv, ProducedConv2d, SiLUAfterProducer
from ..layers.attention import WholeImageAttention
from ..runtime.tile import TileOps
from .base import (
    CONTAINERS,
    GLOBAL_NORM,
    HALO,
    LOCAL,
    REFUSED,
    WHOLE_MAP,
    Family,
    Layer,
    Mirror,
    Rule,
    ShapeFacts,
    ShardPlan,
    concatenated_tile_ops,
    local,
    padded,
    pointwise_problem,
    same_conv_problem,
    with_tiling_off,
)


def _plain_attention(attn) -> str | None:
    if (
        getattr(attn, "spatial_norm", None) is not None
        or getattr(attn, "is_cross_attention", False)
        or getattr(attn, "added_kv_proj_dim", None) is not None
    ):
        return "attention with a spatial norm or cross/added keys"
    return None


def _nearest_then_conv(up) -> str | None:
    transposed, interpolates = getattr(up, "use_conv_transpose", False), getattr(up, "interpolate", True)
    if transposed or not interpolates or getattr(up, "norm", None) is not None:
        return "an upsampler other than nearest 2x then conv"
    return None


# Which GroupNorm writes silu(norm(x)) into which 3x3 convolution's input buffer in the fast tier
# (fast/producers.py), through which SiLU module: diffusers' forwards of these blocks (mirrored below)
# pass the norm's output only through that SiLU (and an eval-mode dropout) to that convolution where
# the attributes named in `unless` are None (no resampling between them, no timestep's scale and shift).
NORM_INTO_CONV = (
    NormIntoConv("ResnetBlock2D", "norm1", "nonlinearity", "conv1", unless=("upsample", "downsample")),
    NormIntoConv("ResnetBlock2D", "norm2", "nonlinearity", "conv2", unless=("time_emb_proj",)),
    NormIntoConv("Decoder", "conv_norm_out", "conv_act", "conv_out"),
)


# The decoder only (spatial-shard encode is not offered): 3x3 stride-1 Conv2d -> halo rows replace its
# zero padding on the sharded axis; 1x1 Conv2d -> local; GroupNorm -> whole-map statistics;
# Attention -> whole-image keys and values (its projections act per token); Upsample2D -> its nearest
# 2x interpolation is local and its conv is one of the 3x3 above.
SHARD_PLAN = ShardPlan(
    roots=("decoder",),
    rules=(
        Rule("Conv2d", HALO, ProducedConv2d, when=padded, check=same_conv_problem, layer=Layer(padding="zeros")),
        Rule("Conv2d", LOCAL, check=pointwise_problem),
        Rule("GroupNorm", GLOBAL_NORM, GlobalGroupNormIntoConv, layer=Layer(norm="group")),
        Rule("Attention", WHOLE_MAP, WholeImageAttention, check=_plain_attention),
        Rule("Upsample2D", LOCAL, check=_nearest_then_conv),
        Rule("Downsample2D", REFUSED, reason="a downsampler (no halo rows for its inline pad here)"),
        local("Decoder", "UNetMidBlock2D", "UpDecoderBlock2D", "AttnUpDecoderBlock2D", "ResnetBlock2D"),
        Rule("SiLU", LOCAL, SiLUAfterProducer),
        local("Mish", "GELU", "ReLU", "Linear"),
        CONTAINERS,
    ),
)


def latent_channels(vae) -> int:
    return vae.config.latent_channels


def _tile_sizes(vae) -> tuple[int, int]:
    """(tile_sample_min_size, tile_latent_min_size) as the ints diffusers' square tile loops use."""
    return _square(vae, "tile_sample_min_size"), _square(vae, "tile_latent_min_size")


def _square(vae, attr: str) -> int:
    # diffusers copies a list-valued `sample_size` config into tile_sample_min_size; its loops need one int
    value = getattr(vae, attr)
    if isinstance(value, (list, tuple)) and len(set(value)) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{type(vae).__name__}.{attr} is {value!r}: diffusers' tiled decode and encode cut square tiles "
            f"and need one integer size; set vae.{attr} to an int"
        )
    return value


def _num_upsamplers(vae) -> int:
    return sum(1 for block in vae.decoder.up_blocks if getattr(block, "upsamplers", None) is not None)


def _num_downsamplers(vae) -> int:
    return sum(1 for block in vae.encoder.down_blocks if getattr(block, "downsamplers", None) is not None)


def _tile_ops(vae, x, tile_in: int, tile_out: int, scale_out, run, channels: int) -> TileOps:
    """diffusers' square tile grid over `x`: tiles of `tile_in` every `(1 - overlap) * tile_in`,
    blended over `overlap * tile_out` and cut to the rest; `scale_out` maps an input extent to the
    finished tile's extent."""
    stride = int(tile_in * (1 - vae.tile_overlap_factor))
    blend = int(tile_out * vae.tile_overlap_factor)
    keep = tile_out - blend
    return concatenated_tile_ops(
        vae,
        x,
        (tile_in, tile_in),
        (stride, stride),
        (blend, blend),
        (keep, keep),
        scale_out,
        run,
        lambda s: (s[0], channels, scale_out(s[2]), scale_out(s[3])),
    )


def decode_tile_ops(vae, z_bchw):
    sample, latent = _tile_sizes(vae)
    if not (z_bchw.shape[-1] > latent or z_bchw.shape[-2] > latent):
        return None  # diffusers' _decode does not tile this latent
    up = 2 ** _num_upsamplers(vae)
    return _tile_ops(
        vae,
        z_bchw,
        latent,
        sample,
        lambda n: n * up,
        lambda tile: _decode_tile(vae, tile),
        vae.decoder.conv_out.out_channels,
    )


def _decode_tile(vae, tile_bchw):
    if vae.config.use_post_quant_conv:
        tile_bchw = vae.post_quant_conv(tile_bchw)
    return vae.decoder(tile_bchw)


def encode_tile_ops(vae, x_bchw):
    sample, latent = _tile_sizes(vae)
    if not (x_bchw.shape[-1] > sample or x_bchw.shape[-2] > sample):
        return None  # diffusers' _encode does not tile this image
    stages = _num_downsamplers(vae)
    return _tile_ops(
        vae,
        x_bchw,
        sample,
        latent,
        lambda n: n >> stages,
        lambda tile: _encode_tile(vae, tile),
        vae.encoder.conv_out.out_channels,  # quant_conv keeps the channel count
    )


def _encode_tile(vae, tile_bchw):
    moments = vae.encoder(tile_bchw)
    if vae.config.use_quant_conv:
        moments = vae.quant_conv(moments)
    return moments


def untiled_decode(vae, z):
    # contiguous: the fast tier computes channels-last; callers get diffusers' layout back
    return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()


def untiled_encode(vae, x):
    return with_tiling_off(vae, lambda: vae._encode(x)).contiguous()


def release(vae) -> None:
    """AutoencoderKL keeps no feature cache between calls: nothing to drop."""


_KL = "diffusers.models.autoencoders.autoencoder_kl:"
_FLUX2 = "diffusers.models.autoencoders.autoencoder_kl_flux2:"

# The image VAE of Stable Diffusion 1.x/2.x, SDXL and FLUX.1 (diffusers AutoencoderKL): four levels of
# 128-512 channels; their vae/config.json values that differ from the class's defaults.
_SD_LAYOUT = {
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2,
}
SD15_CONFIG = {**_SD_LAYOUT, "latent_channels": 4, "sample_size": 512, "scaling_factor": 0.18215}
SDXL_CONFIG = {**_SD_LAYOUT, "latent_channels": 4, "sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True}
FLUX1_CONFIG = {
    **_SD_LAYOUT,
    "latent_channels": 16,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}

# SD's layout at tiny widths (two levels); FLUX.1's (16 latent channels, no (post_)quant_conv, three
# levels); FLUX.2's (quant convs, mid-block attention; 32 latent channels in the real model)
_TINY = {
    "block_out_channels": (8, 16),
    "down_block_types": ("DownEncoderBlock2D",) * 2,
    "up_block_types": ("UpDecoderBlock2D",) * 2,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "latent_channels": 4,
    "sample_size": 32,
}
_TINY_FLUX1 = {
    **_TINY,
    "block_out_channels": (8, 8, 16),
    "down_block_types": ("DownEncoderBlock2D",) * 3,
    "up_block_types": ("UpDecoderBlock2D",) * 3,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}


class _AutoencoderKL(Family):
    name = "autoencoder_kl"
    classes = ("AutoencoderKL", "AutoencoderKLFlux2")
    # -- facts ----------------------------------------------------------------------------------
    configs = {
        "sd15": ("AutoencoderKL", SD15_CONFIG),
        "sdxl": ("AutoencoderKL", SDXL_CONFIG),
        "flux1": ("AutoencoderKL", FLUX1_CONFIG),
        "flux2": ("AutoencoderKLFlux2", {}),  # AutoencoderKLFlux2's defaults are the FLUX.2 VAE
    }
    test_configs = {
        "autoencoder_kl": ("AutoencoderKL", _TINY),
        "autoencoder_kl_flux": ("AutoencoderKL", _TINY_FLUX1),
        "flux2": ("AutoencoderKLFlux2", {**_TINY, "latent_channels": 8}),
    }

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        # a 2x upsampler after every up block but the last (FLUX.2's 2x2 patchify is its pipeline's)
        blocks = config.get("decoder_block_out_channels") or config["block_out_channels"]
        return ShapeFacts(4, config["latent_channels"], 2 ** (len(blocks) - 1), 1, config["out_channels"])

    mirrors = (
        Mirror(
            _KL + "AutoencoderKL.tiled_decode",
            "families/autoencoder_kl.py decode_tile_ops, _tile_ops",
            "2a6e434fca5643e3",
        ),
        Mirror(
            _KL + "AutoencoderKL._tiled_encode",
            "families/autoencoder_kl.py encode_tile_ops, _tile_ops",
            "bbb7495e91377277",
        ),
        Mirror(
            _FLUX2 + "AutoencoderKLFlux2.tiled_decode",
            "families/autoencoder_kl.py decode_tile_ops, _tile_ops",
            "2a6e434fca5643e3",
        ),
        Mirror(
            _FLUX2 + "AutoencoderKLFlux2._tiled_encode",
            "families/autoencoder_kl.py encode_tile_ops, _tile_ops",
            "bbb7495e91377277",
        ),
        Mirror(
            "diffusers.models.resnet:ResnetBlock2D.forward",
            "families/autoencoder_kl.py NORM_INTO_CONV (norm1 -> nonlinearity -> conv1, norm2 -> dropout -> conv2)",
            "a30ae9277b79e8d2",
        ),
        Mirror(
            "diffusers.models.autoencoders.vae:Decoder.forward",
            "families/autoencoder_kl.py NORM_INTO_CONV (conv_norm_out -> conv_act -> conv_out)",
            "f745d319263a350b",
        ),
        Mirror(
            "diffusers.models.attention_processor:AttnProcessor2_0.__call__",
            "layers/attention.py WholeImageAttention (keys and values from encoder_hidden_states)",
            "d5a292e89ccd77a2",
        ),
    )
    latent_ndim = 4
    spatial_decode = True
    spatial_encode = False
    latent_channels = staticmethod(latent_channels)
    decode_tile_ops = staticmethod(decode_tile_ops)
    encode_tile_ops = staticmethod(encode_tile_ops)
    untiled_decode = staticmethod(untiled_decode)
    untiled_encode = staticmethod(untiled_encode)
    shard_plan = SHARD_PLAN
    release = staticmethod(release)
    # the fast tier: channels-last convolutions, the GroupNorms + SiLU written into them
    # (kernels/group_norm.py); requests: tuning.NORM_INTO_CONV_ONLY_FAMILIES
    fast_tier = True
    layer_parts = False
    norm_into_conv = NORM_INTO_CONV

    def spatial_ratio(self, vae) -> int:
        return 2 ** _num_upsamplers(vae)


FAMILY = _AutoencoderKL()
