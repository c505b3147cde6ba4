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


def flux2_small():
    """A seeded AutoencoderKLFlux2: FLUX.2's layout (32 latent channels in the real model; quant convs,
    mid-block attention) at tiny widths."""
    from diffusers import AutoencoderKLFlux2

    return _seeded(
        lambda: AutoencoderKLFlux2(
            block_out_channels=(8, 16),
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1,
            norm_num_groups=4,
            latent_channels=8,
            sample_size=32,
        )
    )


def flux2_real():
    from diffusers import AutoencoderKLFlux2

    return _seeded(lambda: AutoencoderKLFlux2())  # its defaults are the FLUX.2 VAE's config


BUILDERS["flux2"] = flux2_small
BUILDERS["flux2_real"] = flux2_real


def qwenimage21_small():
    """A seeded AutoencoderKLQwenImage21 with every kind of layer the real one has: residual up and
    down blocks with pixel (un)shuffle shortcuts, a temporal and a spatial-only resample each way, a
    decoder wider than the encoder, the mid-block attention; 4x spatial, z=4, RGBA."""
    from diffusers import AutoencoderKLQwenImage21

    vae = _seeded(
        lambda: AutoencoderKLQwenImage21(
            base_dim=8,
            decoder_base_dim=12,
            z_dim=4,
            dim_mult=[1, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
            scale_factor_spatial=4,
        )
    )
    # diffusers' 256-pixel tiles are 64 latent rows at this model's 4x (16x for the real one): half that
    vae.tile_sample_min_height = vae.tile_sample_min_width = 128
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = 96
    return vae


BUILDERS["qwenimage21"] = qwenimage21_small


def hunyuanvideo15_small(**overrides):
    """A seeded AutoencoderKLHunyuanVideo15 keeping every kind of layer of the real one: up/down blocks
    that resample space and time, space only, and neither; causal replicate-padded convs, RMS norms,
    1x1x1 shortcuts, the frame-causal mid-block attention. 4x spatial, 2x temporal by default."""
    from diffusers import AutoencoderKLHunyuanVideo15

    config = dict(
        latent_channels=4,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        spatial_compression_ratio=4,
        temporal_compression_ratio=2,
    )
    config.update(overrides)
    vae = _seeded(lambda: AutoencoderKLHunyuanVideo15(**config))
    # diffusers' tiles are 256 sample pixels; a tiny model's are 64, so small latents tile
    vae.tile_sample_min_height = vae.tile_sample_min_width = 64
    vae.tile_latent_min_height = vae.tile_latent_min_width = 64 // config["spatial_compression_ratio"]
    return vae


BUILDERS["hunyuanvideo15"] = hunyuanvideo15_small
# the real config's layout (five levels, 16x spatial, 4x temporal, 32 latent channels, two layers per
# block) with every width a sixteenth of the real one, for numerical checks at 16x
BUILDERS["hunyuanvideo15_layout"] = lambda: hunyuanvideo15_small(
    latent_channels=32,
    block_out_channels=(8, 16, 32, 64, 64),
    layers_per_block=2,
    spatial_compression_ratio=16,
    temporal_compression_ratio=4,
)


def qwenimage21_real():
    from diffusers import AutoencoderKLQwenImage21

    return _seeded(lambda: AutoencoderKLQwenImage21())  # its defaults are the Qwen-Image 2.1 VAE's config


BUILDERS["qwenimage21_real"] = qwenimage21_real


def ltx_small(**overrides):
    """A seeded LTX-Video 0.9.5-style VAE: timestep-conditioned decoder with noise injection, residual
    pixel-shuffle upsamplers, and the 0.9.5 encoder's spatial / temporal / spatiotemporal pixel-unshuffle
    downsamplers (32x spatial, 8x temporal)."""
    from diffusers import AutoencoderKLLTXVideo

    config = dict(
        latent_channels=4,
        block_out_channels=(8, 8, 16, 16, 16),
        down_block_types=("LTXVideo095DownBlock3D",) * 4,
        downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
        spatio_temporal_scaling=(True, True, True, True),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_block_out_channels=(8, 16, 32),
        decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(True, True, True, False),
        upsample_residual=(True, True, True),
        upsample_factor=(2, 2, 2),
        timestep_conditioning=True,
        spatial_compression_ratio=32,
        temporal_compression_ratio=8,
    )
    config.update(overrides)
    return _with_noise_scales(_seeded(lambda: AutoencoderKLLTXVideo(**config)))


def ltx2_small(**overrides):
    """A seeded LTX-2-style VAE: reflect-padded causal decoder with spatial-only and spatiotemporal
    upsamplers, timestep conditioning and noise injection; encoder with LTX-2's downsamplers."""
    from diffusers import AutoencoderKLLTX2Video

    config = dict(
        latent_channels=4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=(1, 1, 1, 1, 1),
        downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
        decoder_block_out_channels=(8, 16, 32),
        decoder_layers_per_block=(1, 1, 1, 1),
        upsample_type=("spatial", "spatiotemporal", "spatiotemporal"),
        decoder_inject_noise=(True, True, False, True),
        timestep_conditioning=True,
        spatial_compression_ratio=32,
        temporal_compression_ratio=8,
    )
    config.update(overrides)
    return _with_noise_scales(_seeded(lambda: AutoencoderKLLTX2Video(**config)))


def _with_noise_scales(vae):
    """diffusers starts the noise scales at zero (the noise then changes nothing): seeded values, so a
    wrong draw shows in the decode."""
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "per_channel_scale" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return vae


BUILDERS["ltx"] = ltx_small
BUILDERS["ltx2"] = ltx2_small


def mochi_small(**overrides):
    """A seeded AutoencoderKLMochi keeping every kind of layer of the real one: the real expansions
    (8x spatial; 1x, 2x, 3x temporal), replicate-padded causal convs and the encoder's patchifying
    downsamplers, chunked per-frame GroupNorms (2 channels per group at 64), attention over each
    pixel's frames in the encoder's down blocks and last mid block, Fourier features, Linear
    projections and depth-to-space upsampling; one resnet per block below full resolution (none at
    it: the encoder's first and the decoder's last mid block are empty), widths of 32 and 64 (diffusers'
    GroupNorm has 32 groups and its attention heads are 32 wide). The GroupNorms' affine weights are
    seeded (diffusers starts them at one and zero)."""
    from diffusers import AutoencoderKLMochi

    config = dict(
        encoder_block_out_channels=(32, 32, 32, 64),
        decoder_block_out_channels=(32, 32, 32, 64),
        latent_channels=4,
        layers_per_block=(0, 1, 1, 1, 1),  # none at full resolution (the slowest level on CPU)
        latents_mean=(0.0,) * 4,
        latents_std=(1.0,) * 4,
    )
    config.update(overrides)
    vae = _seeded(lambda: AutoencoderKLMochi(**config))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if ".norm_layer." in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return vae


BUILDERS["mochi"] = mochi_small


def cogvideox_small(**overrides):
    """A seeded AutoencoderKLCogVideoX keeping every kind of layer of the real one (CogVideoX 1.0 and
    1.5 share the layers; 1.5 changes only scaling_factor and invert_scale_latents): constant-mode
    causal convs with conv caches over frame batches, GroupNorms in the encoder, SpatialNorm3D in the
    decoder, 1x1x1 shortcuts, up/downsamplers that compress time and ones that do not. Three levels
    (4x spatial, 2x temporal), one resnet per block; GroupNorm affine weights seeded (diffusers starts
    them at one and zero). diffusers' tiles are half of sample_height / sample_width: 32 x 40 sample
    pixels here, 8 x 10 latent rows."""
    from diffusers import AutoencoderKLCogVideoX

    config = dict(
        block_out_channels=(8, 8, 16),
        down_block_types=("CogVideoXDownBlock3D",) * 3,
        up_block_types=("CogVideoXUpBlock3D",) * 3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=4,
        temporal_compression_ratio=2,
        sample_height=64,
        sample_width=80,
    )
    config.update(overrides)
    vae = _seeded(lambda: AutoencoderKLCogVideoX(**config))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for module in vae.modules():
            if type(module) is torch.nn.GroupNorm:
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
    return vae


BUILDERS["cogvideox"] = cogvideox_small
# the real config's layout (four levels: 8x spatial, 4x temporal with two time-compressing resamplers
# each way, 16 latent channels, three layers per block) with small widths, for numerical checks at 8x
BUILDERS["cogvideox_layout"] = lambda: cogvideox_small(
    block_out_channels=(8, 16, 16, 32),
    down_block_types=("CogVideoXDownBlock3D",) * 4,
    up_block_types=("CogVideoXUpBlock3D",) * 4,
    latent_channels=16,
    layers_per_block=3,
    temporal_compression_ratio=4,
    sample_height=128,
    sample_width=160,
)


def hunyuanvideo_small(**overrides):
    """A seeded AutoencoderKLHunyuanVideo keeping every kind of layer of the real one: four levels
    (8x spatial, 4x temporal) whose up/downsamplers resample space and time, space only, and neither;
    replicate-padded causal convs (stride 2 in the downsamplers), GroupNorms (affine weights seeded:
    diffusers starts them at one and zero), 1x1x1 shortcuts where the width changes, the mid-block
    attention with its causal frame mask and GroupNorm. diffusers' spatial tiles are 256 sample
    pixels every 192; here 32 every 24 (4 latent rows every 3), so small latents tile; its temporal
    tiles are diffusers' own (16 sample frames every 12: chunks of 5 latent frames every 3)."""
    from diffusers import AutoencoderKLHunyuanVideo

    config = dict(latent_channels=4, block_out_channels=(4, 8, 16, 16), layers_per_block=1, norm_num_groups=2)
    config.update(overrides)
    vae = _seeded(lambda: AutoencoderKLHunyuanVideo(**config))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for module in vae.modules():
            if type(module) is torch.nn.GroupNorm:
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
    vae.tile_sample_min_height = vae.tile_sample_min_width = 32
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = 24
    return vae


BUILDERS["hunyuanvideo"] = hunyuanvideo_small


def minimax_h3_small(**overrides):
    """A seeded AutoencoderKLMiniMaxH3 keeping every kind of layer of the real one: an encoder of four
    levels whose downsamplers resample space only, space and time (twice) and nothing (8x spatial, 4x
    temporal; stride-2 convolutions after their (0, 1) reflect pad), causal reflect-padded 3x3x3
    convolutions, per-frame GroupNorms (affine weights seeded), 1x1x1 shortcuts where the width
    changes; a ViT decoder of two blocks (RMS-normed Q/K, rotary positions over t, h, w, two register
    tokens and the zero token, SwiGLU feed-forward; the zero-initialised residual scales and registers
    seeded). Clips of 7 sample frames (2 latent frames, 1 dropped): the decoder's clips overlap by one
    latent frame, cross-faded over 3 sample frames, and the encoder's last clip is padded. Tiles of 64
    sample pixels with at least 16 overlapping (the real 256 and 64: 8 and 2 latent pixels); the real
    clip geometry (17 frames, 3 dropped) is `clip_length=17, token_drop=3`."""
    from diffusers import AutoencoderKLMiniMaxH3

    config = dict(
        latent_channels=4,
        block_out_channels=(4, 8, 8, 8),
        layers_per_block=1,
        spatial_downsample_factors=(2, 2, 2, 1),
        temporal_downsample_factors=(1, 2, 2, 1),
        norm_num_groups=2,
        decoder_num_layers=2,
        decoder_num_attention_heads=2,
        decoder_attention_head_dim=8,
        decoder_num_register_tokens=2,
        decoder_ffn_mult=2,
        clip_length=7,
        token_drop=1,
        latents_mean=(0.0,) * 4,
        latents_std=(1.0,) * 4,
    )
    config.update(overrides)
    vae = _seeded(lambda: AutoencoderKLMiniMaxH3(**config))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name or name.endswith(("scale1", "scale2", "register_tokens")):
                base = 1.0 if name.endswith("weight") and "norm" in name else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
    vae.enable_tiling(64, 64, 16, 16)
    return vae


BUILDERS["minimax_h3"] = minimax_h3_small


def minimax_h3_untiled():
    """minimax_h3_small with diffusers' tiling off: the untiled decode the spatial modes give."""
    vae = minimax_h3_small()
    vae.disable_tiling()
    return vae


BUILDERS["minimax_h3_untiled"] = minimax_h3_untiled


# Two tiny AutoencoderDC layouts that keep every kind of layer the real ones have. "sana": the f32c32
# layout (stride-2 conv downsampling, nearest-interpolate upsampling), BatchNorm ResBlocks at the top
# decoder level, multi-scale attention (3x3 and 5x5 depthwise) on the two lower levels. "shuffle": pixel
# (un)shuffle resampling, the first level without layers (conv_in / conv_out are down / up blocks).
DCAE_LAYOUTS = {
    "sana": {
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
    "shuffle": {
        "encoder_block_types": ("ResBlock", "ResBlock", "EfficientViTBlock"),
        "decoder_block_types": ("ResBlock", "ResBlock", "EfficientViTBlock"),
        "encoder_qkv_multiscales": ((), (), (5,)),
        "decoder_qkv_multiscales": ((), (), (5,)),
        "encoder_layers_per_block": (0, 1, 1),
        "decoder_layers_per_block": (0, 1, 1),
    },
}


def dcae_small(layout: str = "sana", tile: tuple[int, int] = (32, 24)):
    """A seeded tiny AutoencoderDC (4x compression, 4 latent channels, head_dim 8) of a DCAE_LAYOUTS
    layout, with diffusers' tile size and stride `tile` in sample pixels and its tiling off."""
    from diffusers import AutoencoderDC

    vae = _seeded(
        lambda: AutoencoderDC(
            latent_channels=4,
            attention_head_dim=8,
            encoder_block_out_channels=(8, 16, 16),
            decoder_block_out_channels=(8, 16, 16),
            **DCAE_LAYOUTS[layout],
        )
    )
    with torch.no_grad():  # BatchNorm's running statistics start at 0 and 1: seeded ones, so they matter
        for module in vae.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    vae.enable_tiling(tile[0], tile[0], tile[1], tile[1])  # also sets the latent tile size diffusers derives
    vae.disable_tiling()
    return vae


BUILDERS["dcae"] = dcae_small
