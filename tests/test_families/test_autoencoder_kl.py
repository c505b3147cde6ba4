"""AutoencoderKL (SD 1.x/2.x, SDXL, SD3, FLUX.1) and AutoencoderKLFlux2 (FLUX.2): 4-D latents, tile and
spatial-shard decode on gloo ranks.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode`; spatial shard: within 1e-5 of the
untiled decode (CPU fp32); the sharded GroupNorm: whole-map statistics, stable at a large mean.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import vaeshard
from vaeshard import tuning

from ..dist_harness import run_ranks
from ..family_parity import Refusals, SpatialParity, TileParity, setting
from ..models import build, latent
from ..parity import CPU_FP32 as TOL_CPU_FP32
from ..parity import CPU_FP32_GROUPNORM, assert_close, assert_identical, max_diff, reference_from_rank0


def _build(model: str, tiles=None):
    """`tiles=(sample, latent, overlap)` sets diffusers' tile settings on the VAE."""
    vae = build(model)
    if tiles is not None:
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = tiles
    return vae


# -- GroupNorm with whole-map statistics ---------------------------------------------------------------


def _naive_group_norm(x, groups, weight, bias, eps):
    """E[x^2] - E[x]^2 in the input dtype: what a sharded GroupNorm must not do."""
    x_bgn = x.reshape(x.shape[0], groups, -1)
    mean = x_bgn.mean(-1, keepdim=True)
    var = (x_bgn * x_bgn).mean(-1, keepdim=True) - mean * mean
    y = ((x_bgn - mean) * (var.clamp_min(0) + eps).rsqrt()).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return y * weight.view(shape) + bias.view(shape)


def _sharded_group_norm(rank, world, dim, offset):
    from vaeshard.layers import norms
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    g = torch.Generator().manual_seed(7)
    x = offset + (torch.rand(2, 8, 11, 9, generator=g) * 2 - 1)  # values offset +- 1
    norm = torch.nn.GroupNorm(4, 8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=g))
        norm.bias.copy_(torch.randn(8, generator=g))
    exact = F.group_norm(x.double(), 4, norm.weight.double(), norm.bias.double(), norm.eps)  # whole tensor

    extents = spatial.split_extents(x.shape[dim], world)  # uneven: 11 rows over 3 ranks -> 4, 4, 3
    start = sum(extents[:rank])
    local = x.narrow(dim, start, extents[rank])
    swap.swap(norm, norms.GlobalGroupNorm)
    axis = spatial.HEIGHT if dim == 2 else spatial.WIDTH
    ctx = spatial.ShardContext(comm=Comm.for_group(torch.distributed.group.WORLD), axis=axis, extents=extents)
    with torch.no_grad(), spatial.sharding(ctx):
        out = norm(local)
        tokens = norm(local.reshape(2, 8, -1))  # the (B, C, N) layout the attention's GroupNorm sees
    want = exact.narrow(dim, start, extents[rank])
    assert out.dtype == torch.float32 and out.shape == local.shape
    assert want.std() > 0.5  # real normalized values
    diff = (out.double() - want).abs().max().item()
    assert diff <= TOL_CPU_FP32, diff
    assert torch.equal(tokens, out.reshape(2, 8, -1))
    with torch.no_grad():
        plain = norm(local)  # outside the shard context: the module's own (local-statistics) forward
    assert (plain.double() - want).abs().max().item() > 1e-2
    if offset:
        naive = _naive_group_norm(x, 4, norm.weight.detach(), norm.bias.detach(), norm.eps)
        whole_fp32 = F.group_norm(x, 4, norm.weight, norm.bias, norm.eps)
        return (naive.double() - exact).abs().max().item(), (whole_fp32.double() - exact).abs().max().item()
    whole_fp32 = F.group_norm(x, 4, norm.weight, norm.bias, norm.eps).narrow(dim, start, extents[rank])
    assert (out - whole_fp32).abs().max().item() <= TOL_CPU_FP32
    return None


@pytest.mark.parametrize("dim", [2, 3], ids=["height", "width"])
def test_group_norm_whole_map_statistics_at_large_mean(dim):
    # 1000 +- 1 in fp32: the naive E[x^2] - E[x]^2 is off by ~1 here; the sharded GroupNorm must stay
    # within 1e-5 of the exact (float64) GroupNorm of the whole tensor. torch's own fp32 group_norm
    # is ~3e-4 off at this offset (the fp32 resolution of its mean), so it is not the yardstick here.
    naive_err, fp32_err = run_ranks(_sharded_group_norm, 3, dim, 1000.0)[0]
    assert naive_err > 1e-2, naive_err
    assert fp32_err < 1e-3, fp32_err


def test_group_norm_matches_torch_group_norm_of_whole_tensor():
    run_ranks(_sharded_group_norm, 2, 3, 0.0)


# -- tile: bit-identical to diffusers --------------------------------------------------------------------


TILE_CASES = [
    # id, model, (tile_sample_min_size, tile_latent_min_size, tile_overlap_factor), latent shape, world, op
    ("12-tiles-2", "autoencoder_kl", (16, 8, 0.25), (1, 4, 14, 20), 2, "decode"),
    ("uneven-3-stride-not-keep", "autoencoder_kl", (16, 8, 0.3), (2, 4, 13, 11), 3, "decode"),
    ("fewer-tiles-than-ranks-3", "autoencoder_kl", (16, 8, 0.25), (1, 4, 8, 12), 3, "decode"),
    ("flux-layout-2", "autoencoder_kl_flux", (32, 8, 0.25), (1, 16, 11, 14), 2, "decode"),
    ("flux2-3-uneven", "flux2", (16, 8, 0.25), (1, 8, 13, 10), 3, "decode"),
]

SPATIAL_CASES = [
    # id, model, latent shape, world, mode, op
    ("h-2-uneven", "autoencoder_kl", (1, 4, 7, 6), 2, "spatial_shard_height", "decode"),
    ("w-2", "autoencoder_kl", (1, 4, 5, 8), 2, "spatial_shard_width", "decode"),
    ("h-3-uneven", "autoencoder_kl", (1, 4, 8, 5), 3, "spatial_shard_height", "decode"),
    ("w-3-uneven", "autoencoder_kl", (1, 4, 5, 7), 3, "spatial_shard_width", "decode"),
    ("h-4-9rows", "autoencoder_kl", (1, 4, 9, 4), 4, "spatial_shard_height", "decode"),
    ("w-4-one-column-each", "autoencoder_kl", (1, 4, 3, 4), 4, "spatial_shard_width", "decode"),
    ("flux-h-3-batch2", "autoencoder_kl_flux", (2, 16, 7, 5), 3, "spatial_shard_height", "decode"),
    ("flux-auto-4", "autoencoder_kl_flux", (1, 16, 5, 9), 4, "auto", "decode"),
    ("flux2-h-3-uneven", "flux2", (1, 8, 8, 5), 3, "spatial_shard_height", "decode"),
    ("flux2-w-2-batch2", "flux2", (2, 8, 5, 7), 2, "spatial_shard_width", "decode"),
    ("flux2-auto-4", "flux2", (1, 8, 5, 9), 4, "auto", "decode"),
]


class TestAutoencoderKL(TileParity, SpatialParity, Refusals):
    """tile decode bit-identical to diffusers' `tiled_decode`, the spatial-shard decode within 1e-5 of
    the untiled one, an unknown decoder layer refused: the shared checks (tests/family_parity.py) with
    this family's cases."""

    TILE_CASES = TILE_CASES
    SPATIAL_CASES = SPATIAL_CASES
    REFUSALS = [
        ("unknown-layer", "autoencoder_kl", setting("decoder.conv_act", lambda: torch.nn.Upsample(scale_factor=1.0)),
         "decoder.conv_act"),
    ]  # fmt: skip
    SPATIAL_TOL = TOL_CPU_FP32
    MIN_STD = 0.01

    @staticmethod
    def set_tiles(vae, tiles):
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = tiles


def _tile_encode_parity(rank, world, model, tiles, shape):
    vae = _build(model, tiles)
    x = latent(shape, seed=3).clamp(-1, 1)
    vae.enable_tiling()
    with torch.no_grad():
        reference = vae.encode(x).latent_dist  # diffusers' _tiled_encode (the image exceeds one tile)
    vae.disable_tiling()
    vaeshard.parallelize(vae, mode="tile")
    dist = vae.encode(x).latent_dist
    assert reference.mean.std() > 1e-3
    assert torch.equal(dist.mean, reference.mean)
    assert torch.equal(dist.logvar, reference.logvar)


@pytest.mark.parametrize("model", ["autoencoder_kl", "flux2"])
def test_tile_encode_bit_identical(model):
    run_ranks(_tile_encode_parity, 2, model, (16, 8, 0.25), (1, 3, 40, 54))


def _auto_encode_keeps_the_vae_own_tiling(rank, world, model):
    """auto encodes as the VAE is configured: untiled with diffusers' tiling off (this family has no
    spatial-shard encode, so one rank encodes and shares), tiled with it on."""
    vae = _build(model, (16, 8, 0.25))
    x = latent((1, 3, 40, 54), seed=3).clamp(-1, 1)  # larger than one 16-pixel tile

    def diffusers_encodes():
        with torch.no_grad():
            plain = vae.encode(x).latent_dist.parameters
            vae.enable_tiling()
            tiled = vae.encode(x).latent_dist.parameters
            vae.disable_tiling()
        return plain, tiled

    plain, tiled = reference_from_rank0(rank, diffusers_encodes)
    assert max_diff(tiled, plain) > TOL_CPU_FP32 * 100  # the tiles do change the result, so this can fail
    vaeshard.parallelize(vae)  # auto
    assert_close(vae.encode(x).latent_dist.parameters, plain, TOL_CPU_FP32, f"{model} auto encode, tiling off")
    vae.enable_tiling()
    plan = vaeshard.plan(vae, x.shape, world, op="encode")
    assert plan.strategy == "tile" and not plan.changes_result, plan.explain()
    assert_identical(vae.encode(x).latent_dist.parameters, tiled, f"{model} auto encode, tiling on")
    # a forced spatial encode falls back to tile: the warning says the result is the tiled one
    vae.disable_tiling()
    vaeshard.parallelize(vae, "spatial_shard_width")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("vaeshard").addHandler(handler)
    try:
        assert_identical(vae.encode(x).latent_dist.parameters, tiled, f"{model} forced spatial encode")
    finally:
        logging.getLogger("vaeshard").removeHandler(handler)
    assert any("cannot run" in m and "the result is the tiled one" in m for m in seen), seen
    # auto's strategy follows the VAE's tiling, so ranks that set it differently are refused, on every rank
    vaeshard.parallelize(vae)
    vae.use_tiling = rank == 0
    with pytest.raises(ValueError, match="ranks disagree.*enable_tiling on every rank or none"):
        vae.encode(x)


@pytest.mark.parametrize("model", ["autoencoder_kl", "flux2"])
def test_auto_encode_gives_diffusers_plain_encode_not_tiles(model):
    run_ranks(_auto_encode_keeps_the_vae_own_tiling, 2, model)


# -- spatial shard: the untiled decode within 1e-5 -------------------------------------------------------


def _spatial_parity(rank, world, model, shape, mode, default_processor, tol=TOL_CPU_FP32):
    vae = _build(model)
    if default_processor:
        vae.set_default_attn_processor()  # the classic AttnProcessor instead of AttnProcessor2_0
    z = latent(shape)
    with torch.no_grad():
        reference = vae.decode(z).sample  # diffusers untiled, this process, same weights
    vaeshard.parallelize(vae, mode=mode)
    strategy = vaeshard.plan(vae, z.shape, world, mode).strategy
    assert strategy.startswith("spatial_shard"), strategy
    out = vae.decode(z).sample
    assert out.shape == reference.shape
    assert reference.std() > 0.01
    diff = (out - reference).abs().max().item()
    assert diff <= tol, diff
    return strategy


def test_spatial_decode_with_classic_attention_processor():
    run_ranks(_spatial_parity, 2, "autoencoder_kl", (1, 4, 6, 5), "spatial_shard_height", True)


def _fused_attention_refused(rank, world):
    vae = _build("autoencoder_kl")
    vae.fuse_qkv_projections()
    vaeshard.parallelize(vae, mode="spatial_shard_width")
    with pytest.raises(ValueError, match="FusedAttnProcessor2_0"):
        vae.decode(latent((1, 4, 4, 6)))
    vaeshard.parallelize(vae, mode="tile")  # the group is still usable afterwards
    vae.tile_sample_min_size, vae.tile_latent_min_size = 16, 8
    z = latent((1, 4, 4, 10))
    with torch.no_grad():
        reference = vae.tiled_decode(z).sample
    assert torch.equal(vae.decode(z).sample, reference)


def test_unsupported_attention_processor_fails_on_every_rank():
    run_ranks(_fused_attention_refused, 2)


# -- plan, install -------------------------------------------------------------------------------------


def test_plan_answers_for_4d_latents(monkeypatch):
    vae = _build("autoencoder_kl", (16, 8, 0.25))
    assert vaeshard.plan(vae, (1, 4, 16, 24), 4).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 4, 24, 16), 4).strategy == "spatial_shard_height"
    assert vaeshard.plan(vae, (1, 4, 2, 40), 4).strategy == "spatial_shard_width"  # height cannot cover 4
    assert vaeshard.plan(vae, (1, 4, 3, 3), 4).strategy == "direct"  # one tile, no axis covers 4
    assert vaeshard.plan(vae, (1, 4, 3, 20), 4, "tile").strategy == "tile"
    assert vaeshard.plan(vae, (1, 4, 16, 24), 1).strategy == "direct"
    forced = vaeshard.plan(vae, (1, 4, 3, 20), 4, "spatial_shard_height")
    assert (forced.strategy, forced.fallback) == ("tile", True)  # never the other axis
    video = vaeshard.plan(vae, (1, 4, 2, 16, 24), 4, "spatial_shard_width")
    assert video.strategy == "refused" and "expects a 4-D latent" in video.explain()  # as decode refuses it
    # the fast tier (the GroupNorms written into the convolutions) is faster but its bf16 output is not
    # within the bf16 rule (tuning.NORM_INTO_CONV_ONLY_FAMILIES): requests run diffusers' layers unless
    # they set norm_into_conv=True, and the plan says why
    sharded = vaeshard.plan(vae, (1, 4, 16, 24), 4)
    assert sharded.fast is None and "runs only with FastOptions(norm_into_conv=True)" in sharded.explain()
    forced = vaeshard.plan(vae, (1, 4, 16, 24), 4, fast=vaeshard.FastOptions(norm_into_conv=True))
    assert forced.fast is not None and forced.fast.norm_into_conv
    # diffusers' layers; their GroupNorms by the kernels that give PyTorch's bits while those are switched
    # on (tuning.GROUP_NORM_SAME_KERNELS, the default), never with exact=True or in mode tile
    one = vaeshard.plan(vae, (1, 4, 16, 24), 1)
    assert one.fast is None and one.same_kernels and "in PyTorch's arithmetic, bit for bit" in one.explain()
    monkeypatch.setattr(tuning, "GROUP_NORM_SAME_KERNELS", False)
    assert not vaeshard.plan(vae, (1, 4, 16, 24), 1).same_kernels
    monkeypatch.setattr(tuning, "GROUP_NORM_SAME_KERNELS", True)
    assert not vaeshard.plan(vae, (1, 4, 16, 24), 1, exact=True).same_kernels
    assert not vaeshard.plan(vae, (1, 4, 16, 24), 4, "tile").same_kernels
    encode = vaeshard.plan(vae, (1, 3, 64, 64), 2, "spatial_shard_width", op="encode")
    assert (encode.strategy, encode.fallback) == ("tile", True)
    assert "no spatial-shard encode" in encode.reason
    assert encode.changes_result and "the result is the tiled one" in encode.explain()  # diffusers' tiling is off
    auto = vaeshard.plan(vae, (1, 3, 64, 64), 2, op="encode")  # never tiles an untiled VAE
    assert auto.strategy == "direct" and not auto.changes_result and "shares the result" in auto.reason


def test_install_swaps_decoder_only_and_keeps_state_dict():
    vae = _build("autoencoder_kl")
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    classes = {n: type(m) for n, m in vae.named_modules()}
    vaeshard.parallelize(vae, mode="spatial_shard_height")
    swapped = {n for n, m in vae.named_modules() if type(m) is not classes[n]}
    assert "decoder.mid_block.attentions.0" in swapped
    assert "decoder.mid_block.attentions.0.group_norm" in swapped
    assert "decoder.conv_norm_out" in swapped and "decoder.up_blocks.0.upsamplers.0.conv" in swapped
    assert all(n.startswith("decoder.") for n in swapped)
    assert "decoder.up_blocks.1.resnets.0.conv_shortcut" not in swapped  # 1x1: local
    vae.load_state_dict(before, strict=True)
    vaeshard.unparallelize(vae)
    assert {n: type(m) for n, m in vae.named_modules()} == classes


def test_real_flux2_config_spatial_decode():
    # FLUX.2's own config (32 latent channels, 128-512 channels, three upsamplers) at a 4x6 latent,
    # within the tolerance for GroupNorm statistics combined across ranks at real channel counts
    run_ranks(
        _spatial_parity, 2, "flux2_real", (1, 32, 4, 6), "spatial_shard_width", False, CPU_FP32_GROUPNORM, timeout=300
    )
