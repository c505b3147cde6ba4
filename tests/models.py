"""Seeded VAEs for tests: each family's tiny test configs (its `test_configs`, read through the
registry) for most checks, its real configs for a few. What is set here is the tests' own: seeded
weights where diffusers starts them at a constant, and tile sizes that make small latents tile."""

from __future__ import annotations

import torch

from vaeshard.families import named_configs, tiny_configs


def _seeded(build):
    torch.manual_seed(0)
    return build().eval()


def _tiny(name: str, **overrides):
    """The family's tiny config `name`, with `overrides`, seeded."""
    import diffusers

    class_name, config = tiny_configs()[name]
    return _seeded(lambda: getattr(diffusers, class_name)(**{**config, **overrides}))


def _real(name: str):
    """The family's real config `name` (random weights, seeded)."""
    import diffusers

    class_name, config = named_configs()[name]
    return _seeded(lambda: getattr(diffusers, class_name)(**config))


def wan21_small():
    return _tiny("wan21")


def wan21_real():
    return _real("wan21")


def wan22_small():
    return _tiny("wan22")


def qwenimage_small():
    return _tiny("qwenimage")


BUILDERS = {"wan21": wan21_small, "wan22": wan22_small, "qwenimage": qwenimage_small, "wan21_real": wan21_real}


def build(name: str, tile_sample: tuple[int, int] | None = None):
    """A seeded VAE: a builder's, else the family's tiny test config `name` as it is;
    `tile_sample=(min, stride)` sets diffusers' tile size in sample pixels."""
    vae = BUILDERS[name]() if name in BUILDERS else _tiny(name)
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
    return _tiny("autoencoder_kl", **overrides)


BUILDERS["autoencoder_kl"] = autoencoder_kl_small
# SD3 / FLUX.1 layout: 16 latent channels, no (post_)quant_conv; three levels (two upsamplers)
BUILDERS["autoencoder_kl_flux"] = lambda: _tiny("autoencoder_kl_flux")


def flux2_small():
    """A seeded AutoencoderKLFlux2: FLUX.2's layout (32 latent channels in the real model; quant convs,
    mid-block attention) at tiny widths."""
    return _tiny("flux2")


def flux2_real():
    return _real("flux2")


BUILDERS["flux2"] = flux2_small
BUILDERS["flux2_real"] = flux2_real


def qwenimage21_small():
    """A seeded AutoencoderKLQwenImage21 with every kind of layer the real one has (the family's
    test config); 4x spatial, z=4, RGBA."""
    vae = _tiny("qwenimage21")
    # diffusers' 256-pixel tiles are 64 latent rows at this model's 4x (16x for the real one): half that
    vae.tile_sample_min_height = vae.tile_sample_min_width = 128
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = 96
    return vae


BUILDERS["qwenimage21"] = qwenimage21_small


def hunyuanvideo15_small(name: str = "hunyuanvideo15", **overrides):
    """A seeded AutoencoderKLHunyuanVideo15 keeping every kind of layer of the real one (the family's
    test config): 4x spatial, 2x temporal by default."""
    vae = _tiny(name, **overrides)
    # diffusers' tiles are 256 sample pixels; a tiny model's are 64, so small latents tile
    vae.tile_sample_min_height = vae.tile_sample_min_width = 64
    vae.tile_latent_min_height = vae.tile_latent_min_width = 64 // vae.config.spatial_compression_ratio
    return vae


BUILDERS["hunyuanvideo15"] = hunyuanvideo15_small
# the real config's layout at a sixteenth of its widths, for numerical checks at 16x
BUILDERS["hunyuanvideo15_layout"] = lambda: hunyuanvideo15_small("hunyuanvideo15_layout")


def qwenimage21_real():
    return _real("qwenimage21")


BUILDERS["qwenimage21_real"] = qwenimage21_real


def ltx_small(**overrides):
    """A seeded LTX-Video 0.9.5-style VAE (the family's test config: 32x spatial, 8x temporal)."""
    return _with_noise_scales(_tiny("ltx", **overrides))


def ltx2_small(**overrides):
    """A seeded LTX-2-style VAE (the family's test config)."""
    return _with_noise_scales(_tiny("ltx2", **overrides))


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
    vae = _tiny("mochi", **overrides)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if ".norm_layer." in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return vae


BUILDERS["mochi"] = mochi_small


def _seeded_group_norms(vae):
    """GroupNorm affine weights seeded (diffusers starts them at one and zero)."""
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for module in vae.modules():
            if type(module) is torch.nn.GroupNorm:
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
    return vae


def cogvideox_small(name: str = "cogvideox", **overrides):
    """A seeded AutoencoderKLCogVideoX keeping every kind of layer of the real one (CogVideoX 1.0 and
    1.5 share the layers; 1.5 changes only scaling_factor and invert_scale_latents): constant-mode
    causal convs with conv caches over frame batches, GroupNorms in the encoder, SpatialNorm3D in the
    decoder, 1x1x1 shortcuts, up/downsamplers that compress time and ones that do not. Three levels
    (4x spatial, 2x temporal), one resnet per block; GroupNorm affine weights seeded. diffusers' tiles
    are half of sample_height / sample_width: 32 x 40 sample pixels here, 8 x 10 latent rows."""
    return _seeded_group_norms(_tiny(name, **overrides))


BUILDERS["cogvideox"] = cogvideox_small
# the real config's layout (8x spatial, 4x temporal, 16 latent channels) with small widths
BUILDERS["cogvideox_layout"] = lambda: cogvideox_small("cogvideox_layout")


def hunyuanvideo_small(**overrides):
    """A seeded AutoencoderKLHunyuanVideo keeping every kind of layer of the real one: four levels
    (8x spatial, 4x temporal) whose up/downsamplers resample space and time, space only, and neither;
    replicate-padded causal convs (stride 2 in the downsamplers), GroupNorms (affine weights seeded),
    1x1x1 shortcuts where the width changes, the mid-block attention with its causal frame mask and
    GroupNorm. diffusers' spatial tiles are 256 sample pixels every 192; here 32 every 24 (4 latent
    rows every 3), so small latents tile; its temporal tiles are diffusers' own (16 sample frames
    every 12: chunks of 5 latent frames every 3)."""
    vae = _seeded_group_norms(_tiny("hunyuanvideo", **overrides))
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
    seeded here). Clips of 7 sample frames (2 latent frames, 1 dropped): the decoder's clips overlap by one
    latent frame, cross-faded over 3 sample frames, and the encoder's last clip is padded. Tiles of 64
    sample pixels with at least 16 overlapping (the real 256 and 64: 8 and 2 latent pixels); the real
    clip geometry (17 frames, 3 dropped) is `clip_length=17, token_drop=3`."""
    vae = _tiny("minimax_h3", **overrides)
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


def dcae_small(layout: str = "sana", tile: tuple[int, int] = (32, 24)):
    """A seeded tiny AutoencoderDC of the family's test config `dcae` ("sana") or `dcae_shuffle`, with
    diffusers' tile size and stride `tile` in sample pixels and its tiling off."""
    vae = _tiny("dcae" if layout == "sana" else f"dcae_{layout}")
    with torch.no_grad():  # BatchNorm's running statistics start at 0 and 1: seeded ones, so they matter
        for module in vae.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    vae.enable_tiling(tile[0], tile[0], tile[1], tile[1])  # also sets the latent tile size diffusers derives
    vae.disable_tiling()
    return vae


BUILDERS["dcae"] = dcae_small
