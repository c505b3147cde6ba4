"""Qwen-Image (diffusers AutoencoderKLQwenImage): the Wan 2.1 architecture under its own class names.

Differences from Wan that matter to vaeshard: the decoder takes no `first_chunk`, there is no
patchify, and diffusers' tiled decode returns the blended tiles without clamping.
"""

from __future__ import annotations

from .wan import WanLike


class _QwenImage(WanLike):
    name = "qwenimage"
    classes = ("AutoencoderKLQwenImage",)
    decoder_takes_first_chunk = False
    clamp_tiled_decode = False

    @property
    def causal_conv_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d

        return QwenImageCausalConv3d

    @property
    def attention_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock

        return QwenImageAttentionBlock

    @property
    def residual_block_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageResidualBlock

        return QwenImageResidualBlock

    @property
    def resample_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageResample

        return QwenImageResample

    @property
    def upsample_cls(self):
        from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageUpsample

        return QwenImageUpsample


FAMILY = _QwenImage()
