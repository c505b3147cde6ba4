"""Seeded VAEs for tests: small configs for most checks, the real Wan 2.1 config for a few."""

from __future__ import annotations

import torch


def _seeded(build):
    torch.manual_seed(0)
    return build().eval()


def wan21_small():
    from diffusers import AutoencoderKLWan

    return _seeded(
        lambda: AutoencoderKLWan(
            base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, latents_mean=[0.0] * 4, latents_std=[1.0] * 4
        )
    )


def wan21_real():
    from diffusers import AutoencoderKLWan

    return _seeded(lambda: AutoencoderKLWan())


def wan22_small():
    from diffusers import AutoencoderKLWan

    return _seeded(
        lambda: AutoencoderKLWan(
            base_dim=8,
            decoder_base_dim=16,
            z_dim=4,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            is_residual=True,
            in_channels=12,
            out_channels=12,
            patch_size=2,
            scale_factor_spatial=16,
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        )
    )


def qwenimage_small():
    from diffusers import AutoencoderKLQwenImage

    return _seeded(
        lambda: AutoencoderKLQwenImage(
            base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, latents_mean=[0.0] * 4, latents_std=[1.0] * 4
        )
    )


BUILDERS = {"wan21": wan21_small, "wan22": wan22_small, "qwenimage": qwenimage_small, "wan21_real": wan21_real}


def build(name: str, tile_sample: tuple[int, int] | None = None):
    """A seeded VAE; `tile_sample=(min, stride)` sets diffusers' tile size in sample pixels."""
    vae = BUILDERS[name]()
    if tile_sample is not None:
        size, stride = tile_sample
        vae.tile_sample_min_height = vae.tile_sample_min_width = size
        vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride
    return vae


def latent(shape, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def autoencoder_kl_small(**overrides):
    """A seeded image AutoencoderKL (SD-style by default); `overrides` change the config."""
    from diffusers import AutoencoderKL

    config = dict(
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=4,
        sample_size=32,
    )
    config.update(overrides)
    n = len(config["block_out_channels"])
    config["down_block_types"] = config["down_block_types"][:1] * n
    config["up_block_types"] = config["up_block_types"][:1] * n
    return _seeded(lambda: AutoencoderKL(**config))


BUILDERS["autoencoder_kl"] = autoencoder_kl_small
# SD3 / FLUX.1 layout: 16 latent channels, no (post_)quant_conv; three levels (two upsamplers)
BUILDERS["autoencoder_kl_flux"] = lambda: autoencoder_kl_small(
    block_out_channels=(8, 8, 16), latent_channels=16, use_quant_conv=False, use_post_quant_conv=False
)
