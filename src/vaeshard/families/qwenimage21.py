"""Qwen-Image 2.1 (diffusers AutoencoderKLQwenImage21): Wan 2.2's residual layout for images.

Latents are (B, 64, 1, H, W): one frame, 16x spatial, RGBA (4-channel) pixels, no patchify by
default. The tile grid, the per-tile run and the blending are Wan's (`WanLike`: diffusers' tiled
decode and encode are Wan's, line for line, with their own patchify), so `tile` stays bit-identical.

What differs for sharding: every "causal Conv3d" is an nn.Conv2d over the squeezed frame with its
zero padding in `_padding` (`layers/halo_frame.py` HaloFrameConv2d gives it halo rows); the
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

import torch.nn as nn

from ..layers.attention import WholeFrameAttention
from ..layers.convs import HaloConv2d, HaloZeroPad2d
from ..layers.halo_frame import HaloFrameConv2d
from ..runtime.swap import is_swapped, swap
from .base import Family, Mirror, ShapeFacts, with_tiling_off
from .wan import WanLike

_Q21 = "diffusers.models.autoencoders.autoencoder_kl_qwenimage21:"

# Containers and leaves whose forward is local to whole latent rows (or whose coupling layers are
# swapped children): per-pixel norms and activations, 1x1 convolutions, pixel (un)shuffles.
_LOCAL = (
    "QwenImage21Encoder3d",
    "QwenImage21Decoder3d",
    "QwenImage21MidBlock",
    "QwenImage21ResidualBlock",
    "QwenImage21ResidualDownBlock",
    "QwenImage21ResidualUpBlock",
    "QwenImage21UpBlock",
    "QwenImage21Resample",
    "QwenImage21RMS_norm",
    "QwenImage21AvgDown3D",
    "QwenImage21DupUp3D",
    "ModuleList",
    "Sequential",
    "Dropout",
    "Identity",
    "SiLU",
)


def _diffusers():
    from diffusers.models.autoencoders import autoencoder_kl_qwenimage21

    return autoencoder_kl_qwenimage21


def _treatments(vae) -> list[tuple[nn.Module, type]]:
    """(module, mixin) for every layer of the decoder and encoder that couples pixels across rows;
    ValueError naming the first layer vaeshard cannot shard exactly."""
    q21 = _diffusers()
    swaps = []
    for part_name in ("decoder", "encoder"):
        part = getattr(vae, part_name)
        # the stride-2 convolutions that diffusers pads with the ZeroPad2d just before them
        after_pad = {
            id(m.resample[1])
            for m in part.modules()
            if isinstance(m, q21.QwenImage21Resample)
            and m.mode in ("downsample2d", "downsample3d")
            and isinstance(m.resample[0], nn.ZeroPad2d)
        }
        for name, module in part.named_modules():
            where = f"{part_name}.{name}" if name else part_name
            if is_swapped(module):
                continue  # installed already (install_layers is idempotent)
            if isinstance(module, q21.QwenImage21CausalConv3d):
                if any(module._padding):
                    _check_same(where, module, (module._padding[2], module._padding[0]))
                    swaps.append((module, HaloFrameConv2d))
                elif module.kernel_size != (1, 1):
                    raise _refuse(where, module, "an unpadded convolution wider than 1x1")
            elif type(module) is nn.Conv2d:
                if any(module.padding):
                    _check_same(where, module, module.padding)
                    swaps.append((module, HaloConv2d))
                elif module.kernel_size != (1, 1) and id(module) not in after_pad:
                    raise _refuse(where, module, "an unpadded convolution wider than 1x1")
            elif type(module) is nn.ZeroPad2d:
                swaps.append((module, HaloZeroPad2d))
            elif isinstance(module, q21.QwenImage21AttentionBlock):
                swaps.append((module, WholeFrameAttention))
            elif isinstance(module, q21.QwenImage21Upsample):
                scale = module.scale_factor
                scale = tuple(scale) if isinstance(scale, (tuple, list)) else (scale, scale)
                if module.mode not in ("nearest", "nearest-exact") or module.size is not None or scale != (2.0, 2.0):
                    raise _refuse(where, module, "an upsampler other than nearest 2x")
            elif type(module).__name__ not in _LOCAL:
                raise _refuse(where, module, "a layer vaeshard does not know")
    return swaps


def _check_same(where: str, conv: nn.Conv2d, padding) -> None:
    same = all(k == 2 * p + 1 for k, p in zip(conv.kernel_size, padding))
    if conv.stride != (1, 1) or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or not same:
        raise _refuse(where, conv, "a convolution that is not stride-1, undilated, zero-padded 'same'")


def _refuse(where: str, module: nn.Module, what: str) -> ValueError:
    return ValueError(
        f"vaeshard cannot shard this AutoencoderKLQwenImage21: {where} ({type(module).__name__}) is {what}; "
        "use mode='tile'"
    )


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
        Mirror(_Q21 + "QwenImage21CausalConv3d.forward", "layers/halo_frame.py HaloFrameConv2d", "c5c6c09450f877f7"),
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

    @property
    def causal_conv_cls(self):
        return _diffusers().QwenImage21CausalConv3d

    @property
    def attention_cls(self):
        return _diffusers().QwenImage21AttentionBlock

    @property
    def residual_block_cls(self):
        return _diffusers().QwenImage21ResidualBlock

    @property
    def resample_cls(self):
        return _diffusers().QwenImage21Resample

    @property
    def upsample_cls(self):
        return _diffusers().QwenImage21Upsample

    @property
    def up_block_cls(self):
        return _diffusers().QwenImage21ResidualUpBlock

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

    # -- spatial shard ----------------------------------------------------------------------------

    def install_layers(self, vae) -> None:
        """Halo rows for the padded single-frame convolutions (HaloFrameConv2d) and the upsamplers'
        3x3 Conv2d (HaloConv2d), the neighbour's row for the downsamplers' ZeroPad2d, whole-frame keys
        and values for the attention; decoder and encoder. Every layer is checked before any swap."""
        for module, mixin in _treatments(vae):
            swap(module, mixin)

    def decode_axis(self, vae, ranks, device):
        return None  # not measured: auto's baseline rule (the longer axis)


FAMILY = _QwenImage21()
