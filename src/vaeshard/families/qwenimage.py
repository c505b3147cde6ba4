"""Qwen-Image (diffusers AutoencoderKLQwenImage): the Wan 2.1 architecture under its own class names.

Differences from Wan that matter to vaeshard: the decoder takes no `first_chunk`, there is no
patchify, and diffusers' tiled decode returns the blended tiles without clamping.
"""

from __future__ import annotations

from .base import Mirror
from .wan import WanLike
from .wan.adapter import wan_plan

_QWEN = "diffusers.models.autoencoders.autoencoder_kl_qwenimage:"


class _QwenImage(WanLike):
    name = "qwenimage"
    classes = ("AutoencoderKLQwenImage",)
    # -- facts (shape_facts: WanLike) -------------------------------------------------------------
    configs = {"qwenimage": ("AutoencoderKLQwenImage", {})}  # its defaults are the Qwen-Image VAE
    test_configs = {
        "qwenimage": (
            "AutoencoderKLQwenImage",
            {
                "base_dim": 8,
                "z_dim": 4,
                "dim_mult": [1, 2, 4, 4],
                "num_res_blocks": 1,
                "latents_mean": [0.0] * 4,
                "latents_std": [1.0] * 4,
            },
        )
    }
    mirrors = (
        Mirror(_QWEN + "AutoencoderKLQwenImage._decode", "families/wan/frames.py decode_in_steps", "aa21d785622137b6"),
        Mirror(
            _QWEN + "AutoencoderKLQwenImage.tiled_decode",
            "families/wan/adapter.py decode_tile_ops, _decode_tile",
            "e738fe5a0cf065e9",
        ),
        Mirror(
            _QWEN + "AutoencoderKLQwenImage.tiled_encode",
            "families/wan/adapter.py encode_tile_ops, _encode_tile",
            "56f9b41070d0d151",
        ),
        Mirror(
            _QWEN + "QwenImageResidualBlock.forward", "families/wan/blocks.py FastResidualBlock", "7f1b4470f4ccd531"
        ),
        Mirror(_QWEN + "QwenImageDecoder3d.forward", "families/wan/blocks.py FastCoderHead", "4f2cbb0b6c6c533f"),
        Mirror(_QWEN + "QwenImageEncoder3d.forward", "families/wan/blocks.py FastCoderHead", "ddb3b53e9d9a21e2"),
        Mirror(_QWEN + "QwenImageResample.forward", "families/wan/blocks.py FastUpsample", "a040def587d7fe84"),
        Mirror(_QWEN + "QwenImageCausalConv3d.forward", "layers/convs.py HaloCausalConv3d", "8d0a00b9fa084679"),
        Mirror(
            _QWEN + "QwenImageAttentionBlock.forward", "layers/attention.py WholeFrameAttention", "7e88f423719e757d"
        ),
        Mirror(
            _QWEN + "QwenImageRMS_norm.forward",
            "layers/norms.py FusedRMSNormSiLU, kernels/norm_math.py",
            "727763e4a6e9ebea",
        ),
        Mirror(_QWEN + "QwenImageUpsample.forward", "layers/norms.py NearestUpsample", "98998cf69c268fa0"),
    )
    decoder_takes_first_chunk = False
    clamp_tiled_decode = False
    class_prefix = "QwenImage"
    shard_plan = wan_plan("QwenImage")


FAMILY = _QwenImage()
