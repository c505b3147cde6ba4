"""Qwen-Image 2.1 (AutoencoderKLQwenImage21): one-frame 5-D latents, tile and spatial shard on gloo ranks.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode`; spatial shard (decode and encode,
height and width, uneven): within 1e-5 of diffusers' untiled decode / encode (CPU fp32); the
single-frame convolution's halo mixin against the layer on the whole frame; the real config at a
tiny latent size. Every reference is diffusers' own single-process result for the same weights.
"""

from __future__ import annotations

import pytest
import torch

import vaeshard

from ..dist_harness import run_ranks
from ..family_parity import Refusals, SpatialParity, TileParity, setting
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_REAL_SIZES, assert_close, reference_from_rank0

MODEL = "qwenimage21"  # 4x spatial, z=4, RGBA
TILES = (16, 12)  # sample pixels: latent tiles of 4 rows every 3


def _sample(shape, seed=3):
    return latent(shape, seed=seed).clamp(-1, 1)


# -- the single-frame convolution's halo rows -------------------------------------------------------


def _halo_frame_conv(rank, world, axis, fast):
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage21 import QwenImage21CausalConv3d

    from vaeshard.layers import tier
    from vaeshard.layers.halo import HaloFrameConv2d
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    torch.manual_seed(5)
    conv = QwenImage21CausalConv3d(3, 5, 3, padding=1)
    x = latent((2, 3, 1, 7, 8), seed=2)
    with torch.no_grad():
        whole = conv(x)  # diffusers' layer on the whole frame
    dim = 3 if axis == spatial.HEIGHT else 4
    extents = spatial.split_extents(x.shape[dim], world)  # 7 rows over 3: 3, 2, 2
    start = sum(extents[:rank])
    swap.swap(conv, HaloFrameConv2d)
    ctx = spatial.ShardContext(comm=Comm.for_group(torch.distributed.group.WORLD), axis=axis, extents=extents)
    with torch.no_grad(), tier.active(tier.FastPlan() if fast else None), spatial.sharding(ctx):
        out = conv(x.narrow(dim, start, extents[rank]))
        with pytest.raises(ValueError, match="cannot take a feature cache"):
            conv(x, x)  # diffusers' own refusal of a time cache stands
    assert_close(out, whole.narrow(dim, start, extents[rank]), CPU_FP32, f"{axis} fast={fast}")
    with torch.no_grad():
        assert torch.equal(conv(x), whole)  # outside a request: the original forward


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("axis", ["height", "width"])
def test_halo_frame_conv_matches_the_whole_frame(axis, fast):
    run_ranks(_halo_frame_conv, 3, axis, fast)


# -- tile (bit-identical to diffusers), spatial shard, refusals: the shared checks -------------------------


def _no_grad(fn):
    with torch.no_grad():
        return fn()


TILE_CASES = [
    # id, model, tiles (sample min, stride), shape, world, op
    ("decode-12-tiles-2", MODEL, TILES, (1, 4, 1, 7, 10), 2, "decode"),
    ("decode-batch2-uneven-3", MODEL, TILES, (2, 4, 1, 8, 7), 3, "decode"),
    ("decode-fewer-tiles-than-ranks-3", MODEL, TILES, (1, 4, 1, 5, 3), 3, "decode"),
    ("encode-12-tiles-2", MODEL, TILES, (1, 4, 1, 28, 40), 2, "encode"),
    ("encode-uneven-3", MODEL, TILES, (1, 4, 1, 20, 36), 3, "encode"),
    ("encode-fewer-tiles-than-ranks-3", MODEL, TILES, (1, 4, 1, 24, 12), 3, "encode"),
]


# -- spatial shard: diffusers' untiled decode and encode within 1e-5 ---------------------------------


def _spatial_parity(rank, world, op, shape, mode, exact):
    return _check_spatial(rank, world, build(MODEL), op, shape, mode, exact, CPU_FP32)


def _check_spatial(rank, world, vae, op, shape, mode, exact, tol):
    if op == "decode":
        x = latent(shape)
        reference = reference_from_rank0(rank, lambda: _no_grad(lambda: vae.decode(x).sample))
    else:
        x = _sample(shape)
        reference = reference_from_rank0(rank, lambda: _no_grad(lambda: vae._encode(x)))
    vaeshard.parallelize(vae, mode=mode, exact=exact)
    plan = vaeshard.plan(vae, x.shape, world, mode, op=op)
    assert plan.strategy.startswith("spatial_shard"), plan.explain()
    if op == "decode":
        out = vae.decode(x).sample
    else:
        dist = vae.encode(x).latent_dist
        out = torch.cat([dist.mean, dist.logvar], dim=1)
    vaeshard.unparallelize(vae)
    assert_close(out, reference, tol, f"{plan.strategy} {op} {shape} on {world} ranks")
    return plan.strategy


SPATIAL_CASES = [
    # id, model, shape, world, mode, op, exact
    ("decode-h-2-uneven", MODEL, (1, 4, 1, 7, 5), 2, "spatial_shard_height", "decode", False),
    ("decode-w-2-exact", MODEL, (1, 4, 1, 5, 6), 2, "spatial_shard_width", "decode", True),
    ("decode-h-3-uneven-batch2", MODEL, (2, 4, 1, 8, 5), 3, "spatial_shard_height", "decode", False),
    ("decode-w-3-uneven", MODEL, (1, 4, 1, 5, 7), 3, "spatial_shard_width", "decode", False),
    ("decode-h-4-9rows", MODEL, (1, 4, 1, 9, 4), 4, "spatial_shard_height", "decode", False),
    ("decode-w-4-one-column-each", MODEL, (1, 4, 1, 3, 4), 4, "spatial_shard_width", "decode", True),
    ("encode-h-2-uneven", MODEL, (1, 4, 1, 28, 20), 2, "spatial_shard_height", "encode", False),
    ("encode-w-3-uneven", MODEL, (1, 4, 1, 16, 44), 3, "spatial_shard_width", "encode", False),
    ("encode-h-4-9rows-exact", MODEL, (1, 4, 1, 36, 12), 4, "spatial_shard_height", "encode", True),
]


class TestQwenImage21(TileParity, SpatialParity, Refusals):
    """tile bit-identical to diffusers' `tiled_decode` / `tiled_encode`, the spatial shards within 1e-5 of
    the untiled decode / encode, an unknown layer refused: the shared checks (tests/family_parity.py)."""

    TILE_CASES = TILE_CASES
    SPATIAL_CASES = SPATIAL_CASES
    REFUSALS = [
        ("unknown-layer", MODEL,
         setting("encoder.mid_block.resnets.0.dropout", lambda: torch.nn.AvgPool2d(3, stride=1, padding=1)),
         r"encoder\.mid_block\.resnets\.0\.dropout"),
    ]  # fmt: skip

    @staticmethod
    def set_tiles(vae, tiles):
        size, stride = tiles
        vae.tile_sample_min_height = vae.tile_sample_min_width = size
        vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride

    @staticmethod
    def run(vae, x, op):
        with torch.no_grad():
            if op == "decode":
                return vae.decode(x).sample
            dist = vae.encode(x).latent_dist
            return torch.cat([dist.mean, dist.logvar], dim=1)

    @classmethod
    def diffusers_untiled(cls, vae, x, op):
        if op == "decode":
            return cls.run(vae, x, op)
        with torch.no_grad():
            return vae._encode(x)


@pytest.mark.parametrize(
    "shape, picked", [((1, 4, 1, 5, 9), "spatial_shard_width"), ((1, 4, 1, 9, 5), "spatial_shard_height")]
)
def test_auto_shards_the_longer_axis(shape, picked):
    assert set(run_ranks(_spatial_parity, 4, "decode", shape, "auto", False)) == {picked}


def test_real_config_spatial_decode_and_encode():
    # diffusers' default config (z=64, 16x, four stages, a 144-channel decoder) at a 3x2 latent
    run_ranks(_real_both, 2)


def _real_both(rank, world):
    vae = build("qwenimage21_real")  # built once for both: 338M parameters
    _check_spatial(rank, world, vae, "decode", (1, 64, 1, 3, 2), "spatial_shard_height", False, CPU_FP32_REAL_SIZES)
    _check_spatial(rank, world, vae, "encode", (1, 4, 1, 32, 48), "spatial_shard_width", False, CPU_FP32_REAL_SIZES)


# -- plan, install ---------------------------------------------------------------------------------


def test_plan_answers_for_one_frame_latents():
    vae = build(MODEL, TILES)
    assert vaeshard.plan(vae, (1, 4, 1, 8, 12), 4).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 4, 1, 12, 8), 4).strategy == "spatial_shard_height"
    assert vaeshard.plan(vae, (1, 4, 1, 2, 12), 4).strategy == "spatial_shard_width"  # height cannot cover 4
    assert vaeshard.plan(vae, (1, 4, 1, 3, 3), 4).strategy == "direct"  # one tile, no axis covers 4
    assert vaeshard.plan(vae, (1, 4, 1, 3, 12), 4, "tile").strategy == "tile"
    forced = vaeshard.plan(vae, (1, 4, 1, 3, 12), 4, "spatial_shard_height")
    assert (forced.strategy, forced.fallback) == ("tile", True)
    image = vaeshard.plan(vae, (1, 4, 8, 12), 2, "spatial_shard_width")
    assert image.strategy == "refused" and "expects a 5-D latent" in image.explain()  # as decode refuses it
    encode = vaeshard.plan(vae, (1, 4, 1, 32, 48), 2, op="encode")
    assert encode.strategy == "spatial_shard_width", encode.explain()
    odd = vaeshard.plan(vae, (1, 4, 1, 30, 48), 2, "spatial_shard_height", op="encode")
    assert odd.fallback and "multiple of 4" in odd.reason
    text = vaeshard.plan(vae, (1, 4, 1, 8, 12), 2).explain()
    assert "longer axis" in text and "norm into conv: on (auto: qwenimage21 is in" in text, text


def test_install_swaps_decoder_and_encoder_and_keeps_state_dict():
    vae = build(MODEL)
    state = {k: v.clone() for k, v in vae.state_dict().items()}
    classes = {n: type(m) for n, m in vae.named_modules()}
    vaeshard.parallelize(vae, mode="spatial_shard_height")
    swapped = {n for n, m in vae.named_modules() if type(m) is not classes[n]}
    for name in (
        "decoder.conv_in",
        "decoder.mid_block.attentions.0",
        "decoder.up_blocks.0.resnets.0.conv1",
        "decoder.up_blocks.0.upsampler.resample.1",
        "decoder.conv_out",
        "encoder.conv_in",
        "encoder.down_blocks.0.downsampler.resample.0",
    ):
        assert name in swapped, name
    for name in ("decoder.up_blocks.2.resnets.0.conv_shortcut", "encoder.down_blocks.0.downsampler.resample.1"):
        assert name not in swapped, name  # 1x1, and the stride-2 conv behind its ZeroPad2d: local
    assert "post_quant_conv" not in swapped and "quant_conv" not in swapped
    vae.load_state_dict(state, strict=True)
    vaeshard.unparallelize(vae)
    assert {n: type(m) for n, m in vae.named_modules()} == classes
