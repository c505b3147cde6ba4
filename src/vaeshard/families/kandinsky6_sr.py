"""Kandinsky 6's super-resolution VAE (diffusers `Kandinsky6SRVAE`): a causal 3-D VAE that decodes and
encodes in segments of 16 frames, each causal convolution carrying its last input frames to the next
segment in a cache dict. Latents are 5-D (B, C, T, H, W); 2^(levels - 1) spatial (16x in the real
config) and 4x temporal compression.

diffusers has no tiled path for it, so `tile` is refused and `auto` shards the feature maps by rows.
Sharded, every rank runs diffusers' own segmented `decode` / `encode` on its rows, keeping the caches
of its rows; the plan below says what each layer needs:

- `Kandinsky6SRCausalConv3d` zero-pads height and width inline, prepends its cached frames, then runs
  its unpadded child convolution: the child takes the neighbours' rows in place of those zero rows
  (layers/halo.py HaloInlineSamePadConv); a child of 1x1 in space (the temporal convolutions) is local;
- the up- and downsamplers' own 'same'-padded (1, 3, 3) convolutions (stride 2 in the encoder) take
  halo rows (HaloPaddedConv); shards of whole latent rows start on the stride lattice;
- the channel RMS norms, the 1x1x1 convolutions, pixel unshuffle with its pair means, nearest 2x
  upsampling, the frame repeats and pair averages in time: local;
- `Kandinsky6SRSpatialNorm3D` nearest-interpolates the decoder's latent to the feature map: by a power
  of two, so each rank's latent rows give exactly its feature rows (as CogVideoX's).

No attention and no GroupNorm: nothing sees the whole map. Every other layer is refused.
"""

from __future__ import annotations

from ..layers.halo import HaloInlineSamePadConv, HaloPaddedConv
from .base import CONTAINERS, HALO, LOCAL, Family, Layer, Rule, ShapeFacts, ShardPlan, local, padded


def _spatially_pointwise(conv) -> bool:
    return conv.kernel_size[1:] == (1, 1) and conv.stride[1:] == (1, 1) and not any(conv.padding[1:])


def _same_in_space(conv) -> str | None:
    k, p = conv.kernel_size[1:], conv.padding[1:]
    if k[0] != k[1] or any(k_ != 2 * p_ + 1 for k_, p_ in zip(k, p)) or conv.dilation != (1, 1, 1):
        return "a convolution that is not 'same' and undilated in height and width"
    return None


def _inline_same(conv) -> str | None:
    k = conv.kernel_size[1:]
    if k[0] != k[1] or k[0] % 2 == 0 or conv.stride[1:] != (1, 1) or any(conv.padding) or conv.dilation != (1, 1, 1):
        return "a causal convolution other than odd, square, stride 1 and unpadded in height and width"
    return None


SAFE = "Kandinsky6SRSafeConv3d"
SHARD_PLAN = ShardPlan(
    roots=("encoder", "decoder"),
    rules=(
        Rule(SAFE, LOCAL, when=_spatially_pointwise),  # 1x1x1, and the (2|3, 1, 1) convolutions in time
        Rule(SAFE, HALO, HaloInlineSamePadConv, parent="Kandinsky6SRCausalConv3d", check=_inline_same),
        Rule(SAFE, HALO, HaloPaddedConv, when=padded, check=_same_in_space, layer=Layer(padding="zeros")),
        Rule("Kandinsky6VAERMSNorm", LOCAL, layer=Layer(norm="rms_channels", activation="silu")),
        Rule("Kandinsky6SRCausalConv3d", LOCAL, layer=Layer(padding="zeros", cache=True)),
        local("Kandinsky6SREncoder3D", "Kandinsky6SRDecoder3D", "Kandinsky6SRResnetBlock3D", "Module"),
        local("Kandinsky6SRSpatialNorm3D", "Kandinsky6SRDownsample", "Kandinsky6SRUpsample", "PixelUnshuffle"),
        CONTAINERS,
    ),
)


class _Kandinsky6SR(Family):
    name = "kandinsky6_sr"
    classes = ("Kandinsky6SRVAE",)
    # -- facts ----------------------------------------------------------------------------------
    configs = {"kandinsky6_sr": ("Kandinsky6SRVAE", {})}  # its defaults are Kandinsky 6's SR VAE
    # every kind of layer of the real one: three levels (4x), both compressing time (2x), so the
    # decoder's segments of 16 frames are 8 latent frames and its upsamplers repeat frames
    test_configs = {
        "kandinsky6_sr": (
            "Kandinsky6SRVAE",
            {
                "latent_channels": 4,
                "encoder_block_out_channels": (8, 16, 16),
                "decoder_block_out_channels": (8, 16, 32),
                "layers_per_block": 1,
                "temporal_compression_ratio": 2,
                "temporal_compression_start_level": 0,
            },
        )
    }
    latent_ndim = 5
    tile_decode = tile_encode = False  # diffusers has no tiled decode or encode for it
    spatial_decode = spatial_encode = True
    shard_plan = SHARD_PLAN

    def latent_channels(self, vae) -> int:
        return vae.config.latent_channels

    def decode_tile_ops(self, vae, z):
        return None

    def encode_tile_ops(self, vae, x):
        return None

    def untiled_decode(self, vae, z):
        return type(vae).decode(vae, z, return_dict=False)[0]

    def untiled_encode(self, vae, x):
        return type(vae).encode(vae, x, return_dict=False)[0].parameters

    def shape_facts(self, class_name: str, config: dict) -> ShapeFacts:
        ratio = 2 ** (len(config["encoder_block_out_channels"]) - 1)
        return ShapeFacts(
            5, config["latent_channels"], ratio, config["temporal_compression_ratio"], config["out_channels"]
        )


FAMILY = _Kandinsky6SR()
