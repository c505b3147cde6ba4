"""Qwen-Image 2.1 (diffusers AutoencoderKLQwenImage21): Wan 2.2's residual layout for images.

Latents are (B, 64, 1, H, W): one frame, 16x spatial, RGBA (4-channel) pixels, no patchify by
default. The tile grid, the per-tile run and the blending are Wan's (`WanLike`: diffusers' tiled
decode and encode are Wan's, line for line, with their own patchify), so `tile` stays bit-identical.

What differs for sharding: every "causal Conv3d" is an nn.Conv2d over the squeezed frame with its
zero padding in `_padding` (`layers/halo.py` HaloFrameConv2d gives it halo rows); the
upsamplers' 3x3 nn.Conv2d take halo rows (HaloConv2d), the downsamplers' ZeroPad2d takes the
neighbour's row (HaloZeroPad2d), the mid-block attention sees the whole frame (WholeFrameAttention).
The RMS norms, SiLU, the 1x1 convolutions, nearest 2x upsampling and the shortcuts' pixel (un)shuffle
(DupUp3D, AvgDown3D) are per pixel or local to whole latent rows. The encoder is made of the same
kinds of layer, so encode shards too. Any other layer is refused before anything is swapped.

Not served by the Wan fast tier (families/wan/blocks.py, frames.py): its residual blocks, head and
upsamplers write into `HaloCausalConv3d` input buffers of 3-D convolutions and step a causal frame
loop, neither of which this model has. A sharded or fast-tier request runs diffusers' own
`_decode` / `_encode` with the leaf layers above swapped; `frame_loop` is False (one frame).
"""

from __future__ import annotations

from ..layers.attention import WholeFrameAttention
from ..layers.convs import HaloConv2d
from ..layers.halo import HaloFrameConv2d, HaloZeroPad2d
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


# Decoder and encoder. Halo rows for the padded single-frame convolutions (HaloFrameConv2d) and the
# upsamplers' 3x3 Conv2d (HaloConv2d), the neighbour's row for the downsamplers' ZeroPad2d (the
# stride-2 convolution after it is then local), whole-frame keys and values for the attention. The
# RMS norms (over channels), SiLU, 1x1 convolutions, nearest 2x upsampling and the pixel
# (un)shuffles are per pixel or local to whole latent rows; so are the containers.
SHARD_PLAN = ShardPlan(
    roots=("decoder", "encoder"),
    rules=(
        Rule(
            "QwenImage21CausalConv3d",
            HALO,
            HaloFrameConv2d,
            when=lambda conv: any(conv._padding),
            check=same_conv_problem,
            layer=Layer(padding="zeros"),
        ),
        Rule("QwenImage21CausalConv3d", LOCAL, check=_unpadded_problem),
        Rule("Conv2d", HALO, HaloConv2d, when=padded, check=same_conv_problem, layer=Layer(padding="zeros")),
        Rule("Conv2d", LOCAL, where="*.resample.1", parent="Sequential"),  # stride 2, after the ZeroPad2d
        Rule("Conv2d", LOCAL, check=_unpadded_problem),
        Rule("ZeroPad2d", HALO, HaloZeroPad2d, layer=Layer(padding="zeros")),
        Rule("QwenImage21AttentionBlock", WHOLE_MAP, WholeFrameAttention),
        Rule("QwenImage21Upsample", LOCAL, check=_nearest_2x),
        Rule("QwenImage21RMS_norm", LOCAL, layer=Layer(norm="rms_channels")),
        local("QwenImage21Encoder3d", "QwenImage21Decoder3d", "QwenImage21MidBlock", "QwenImage21Resample"),
        local("QwenImage21ResidualBlock", "QwenImage21ResidualDownBlock", "QwenImage21ResidualUpBlock"),
        local("QwenImage21UpBlock", "QwenImage21AvgDown3D", "QwenImage21DupUp3D", "SiLU"),
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
            "families/wan/adapter.py _exceeds_one_tile (when diffusers tiles a decode)",
            "6cf0269d4d6e59ad",
        ),
        Mirror(
            _Q21 + "AutoencoderKLQwenImage21._encode",
            "families/wan/adapter.py encode_tile_ops (when diffusers tiles an encode), encode_prepare",
            "79f3a6f98ba0ef01",
        ),
        Mirror(_Q21 + "QwenImage21CausalConv3d.forward", "layers/halo.py HaloFrameConv2d", "c5c6c09450f877f7"),
        Mirror(
            _Q21 + "QwenImage21AttentionBlock.forward", "layers/attention.py WholeFrameAttention", "7e88f423719e757d"
        ),
    )
    frame_loop = False  # one frame: no causal frame loop, no frames_per_step or CUDA graphs
    streams_steps = False  # stream_decode yields the one frame once
    # Wan's fast tier measured slower than diffusers' layers on this class (BENCHMARKS.md, "The other
    # families"): channels-last convolutions between channels-first norms; so it is off
    fast_tier = False
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
        # contiguous: the fast tier computes channels-last; callers get diffusers' layout back
        return with_tiling_off(vae, lambda: vae._decode(z, return_dict=False)[0]).contiguous()

    def direct_decode(self, vae, z):
        return Family.direct_decode(self, vae, z)

    def decode_axis(self, vae, ranks, device):
        return None  # not measured: auto's baseline rule (the longer axis)


FAMILY = _QwenImage21()
