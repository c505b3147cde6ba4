"""AutoencoderDC (Sana's DC-AE): 4-D latents; tile decode and encode on gloo ranks bit-identical to
diffusers' `tiled_decode` / `tiled_encode`; spatial-shard decode and encode within 1e-5 of the untiled
ones, with the multi-scale linear attention's score matrix all-reduced (never a feature map gathered)
and the quadratic branch of small maps chosen by the whole map's size.
"""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard.families.dcae import FAMILY, SANA_F32C32

from ..dist_harness import run_ranks
from ..models import dcae_small, latent
from ..parity import CPU_FP32, assert_close, assert_identical, reference_from_rank0


def _build(layout: str, tile=None):
    """models.dcae_small, with `tile=(min, stride)` in sample pixels (diffusers' tiling left off)."""
    return dcae_small(layout, tile=tile or (32, 24))


# -- tile: bit-identical to diffusers -------------------------------------------------------------------


def _tile_parity(rank, world, layout, op, shape):
    vae = _build(layout, tile=(16, 12))  # latent tiles of 4 every 3; encode: 16-pixel tiles every 12
    x = latent(shape, seed=3)

    def diffusers_tiled():
        with torch.no_grad():
            vae.use_tiling = True
            out = vae.decode(x).sample if op == "decode" else vae.encode(x).latent
            vae.use_tiling = False
        return out

    reference = reference_from_rank0(rank, diffusers_tiled)
    vaeshard.parallelize(vae, mode="tile")
    assert vaeshard.plan(vae, x.shape, world, "tile", op=op).strategy == "tile"
    out = vae.decode(x).sample if op == "decode" else vae.encode(x).latent
    assert_identical(out, reference, f"{layout} tile {op}")


TILE_CASES = [
    # id, layout, op, input shape, world
    ("decode-sana-2", "sana", "decode", (1, 4, 8, 10), 2),
    ("decode-shuffle-3", "shuffle", "decode", (1, 4, 7, 5), 3),
    # 30 x 22 pixels: the edge tiles (6 and 10 pixels) are zero-padded to a multiple of 4, then cropped
    ("encode-sana-2-padded-edges", "sana", "encode", (1, 3, 30, 22), 2),
    ("encode-shuffle-3", "shuffle", "encode", (1, 3, 28, 20), 3),
]


@pytest.mark.parametrize("case", TILE_CASES, ids=[c[0] for c in TILE_CASES])
def test_tile_bit_identical(case):
    _, layout, op, shape, world = case
    run_ranks(_tile_parity, world, layout, op, shape)


# -- spatial shard: within 1e-5 of the untiled decode and encode; no feature map gathered ------------------


def _spatial_parity(rank, world, layout, op, shape, mode, quadratic):
    """Spatial `op` against diffusers' untiled one. Every all-gather of a feature map raises (the only
    gather allowed is the final assembly of the result), except for the keys and values of a map of at
    most attention_head_dim pixels (`quadratic`); the all-reduces of the score matrices are counted."""
    from vaeshard.layers import linear_attention
    from vaeshard.runtime.comm import Comm

    vae = _build(layout)
    x = latent(shape, seed=5)

    def diffusers_untiled():
        with torch.no_grad():
            return vae.decode(x).sample if op == "decode" else vae.encode(x).latent

    reference = reference_from_rank0(rank, diffusers_untiled)
    vaeshard.parallelize(vae, mode=mode)
    strategy = vaeshard.plan(vae, x.shape, world, mode, op=op).strategy
    assert strategy.startswith("spatial_shard"), strategy

    gathered, reduced = [], []
    gather, reduce = Comm.all_gather_along, linear_attention.all_reduce_sum

    def no_whole_map(self, t, dim, extents):
        gathered.append(tuple(t.shape))
        whole_pixels = t.shape[-2] * t.shape[-1] * sum(extents) // t.shape[dim]
        if not quadratic or whole_pixels > vae.config.attention_head_dim:  # not the quadratic branch's K, V
            raise AssertionError(f"a whole feature map was gathered: {sum(extents)} rows of {tuple(t.shape)}")
        return gather(self, t, dim, extents)

    def counted(comm, t):
        reduced.append(tuple(t.shape))
        return reduce(comm, t)

    Comm.all_gather_along, linear_attention.all_reduce_sum = no_whole_map, counted
    try:
        out = vae.decode(x).sample if op == "decode" else vae.encode(x).latent
    finally:
        Comm.all_gather_along, linear_attention.all_reduce_sum = gather, reduce
    assert_close(out, reference, CPU_FP32, f"{layout} {mode} {op}")
    part = vae.decoder if op == "decode" else vae.encoder
    num_attention = sum(type(m).__name__ == "SanaMultiscaleLinearAttention" for m in part.modules())
    # one all-reduce per linear attention layer (and one gather of K and V per quadratic one)
    assert len(reduced) + len(gathered) // 2 == num_attention, (reduced, gathered)
    assert bool(gathered) == quadratic, gathered
    return strategy


SPATIAL_CASES = [
    # id, layout, op, input shape, world, mode, quadratic branch taken somewhere
    ("decode-sana-h-2-uneven", "sana", "decode", (1, 4, 5, 4), 2, "spatial_shard_height", False),
    ("decode-sana-w-3-uneven-batch2", "sana", "decode", (2, 4, 4, 7), 3, "spatial_shard_width", False),
    ("decode-shuffle-h-3-uneven", "shuffle", "decode", (1, 4, 7, 3), 3, "spatial_shard_height", False),
    # a 2 x 4 latent (8 pixels, not above head_dim 8): its attention is quadratic, the level above's linear
    ("decode-sana-quadratic-w-2", "sana", "decode", (1, 4, 2, 4), 2, "spatial_shard_width", True),
    # a 2 x 6 latent (12 pixels: linear) over 3 ranks of 2 x 2 (4 pixels each): the whole map decides
    ("decode-sana-switch-by-whole-map-w-3", "sana", "decode", (1, 4, 2, 6), 3, "spatial_shard_width", False),
    ("encode-sana-h-3-uneven", "sana", "encode", (1, 3, 28, 12), 3, "spatial_shard_height", False),
    ("encode-shuffle-w-2-uneven", "shuffle", "encode", (1, 3, 12, 20), 2, "spatial_shard_width", False),
    ("encode-sana-auto-2", "sana", "encode", (1, 3, 12, 28), 2, "auto", False),
]


@pytest.mark.parametrize("case", SPATIAL_CASES, ids=[c[0] for c in SPATIAL_CASES])
def test_spatial_matches_untiled_without_gathering_a_feature_map(case):
    _, layout, op, shape, world, mode, quadratic = case
    strategies = run_ranks(_spatial_parity, world, layout, op, shape, mode, quadratic)
    if mode == "auto":
        assert strategies[0] == "spatial_shard_width"  # tiling off: auto keeps the untiled result


def test_slices_hold_the_rows_of_the_widest_halo():
    # the 5x5 multi-scale convolution at the latent's resolution takes 2 halo rows from one neighbour
    vae = _build("sana")
    assert FAMILY.min_shard_rows(vae) == 2
    forced = vaeshard.plan(vae, (1, 4, 4, 5), 3, "spatial_shard_width")
    assert (forced.strategy, forced.fallback) == ("direct", True)  # one of diffusers' default tiles
    assert "latent width 5 is shorter than the group (3 ranks of 2 latent rows each)" in forced.reason
    assert vaeshard.plan(vae, (1, 4, 4, 6), 3, "spatial_shard_width").strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 4, 5, 7), 3).strategy == "spatial_shard_width"  # auto: height 5 < 3 x 2


def test_auto_follows_the_vae_own_tiling():
    vae = _build("sana")  # latent tiles of 8
    assert vaeshard.plan(vae, (1, 4, 8, 10), 2).strategy == "spatial_shard_width"
    vae.use_tiling = True  # diffusers tiles this latent: auto gives its tiled result
    chosen = vaeshard.plan(vae, (1, 4, 8, 10), 2)
    assert chosen.strategy == "tile" and not chosen.changes_result, chosen.explain()


def _direct_encode(rank, world, output):
    """A 3 x 2 latent cannot give 2 ranks 2 rows each: rank 0 encodes it with the VAE's own encode; the
    result is diffusers' EncoderOutput (a latent), or None off rank 0 with output='rank0'."""
    vae = _build("sana")
    x = latent((1, 3, 12, 8), seed=7)
    reference = reference_from_rank0(rank, lambda: diffusers_encode(vae, x))
    vaeshard.parallelize(vae, output=output)
    assert vaeshard.plan(vae, x.shape, world, op="encode").strategy == "direct"
    encoded = vae.encode(x)
    if output == "rank0" and rank != 0:
        assert encoded.latent is None and vae.encode(x, return_dict=False) == (None,)
    else:
        assert_identical(encoded.latent, reference, "direct encode")
        assert_identical(vae.encode(x, return_dict=False)[0], reference, "direct encode, tuple")


def diffusers_encode(vae, x):
    with torch.no_grad():
        return vae.encode(x).latent


@pytest.mark.parametrize("output", ["all", "rank0"])
def test_direct_encode_returns_diffusers_encoder_output(output):
    run_ranks(_direct_encode, 2, output)


# -- refusals ---------------------------------------------------------------------------------------------


def test_install_refuses_a_non_nearest_upsampler_before_swapping():
    vae = _build("sana")
    vae.decoder.up_blocks[0][0].interpolation_mode = "bilinear"  # not exact on shard boundaries
    with pytest.raises(ValueError, match=r"decoder\.up_blocks\.0\.0 \(DCUpBlock2d\) is a bilinear upsampler"):
        FAMILY.install_layers(vae)
    assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())


def test_batch_norm_in_training_mode_is_refused_when_sharded():
    from vaeshard.runtime import spatial
    from vaeshard.runtime.comm import Comm

    vae = _build("sana")
    vaeshard.parallelize(vae, mode="spatial_shard_height")
    z = latent((1, 4, 4, 4))
    ctx = spatial.ShardContext(comm=Comm(group=None, rank=0, world=1), axis=spatial.HEIGHT, extents=[4])
    vae.decoder.up_blocks[0][1].norm.train()  # batch statistics: a slice's would not be the whole map's
    with torch.no_grad(), spatial.sharding(ctx), pytest.raises(ValueError, match="only with running statistics"):
        FAMILY.untiled_decode(vae, z)
    vae.decoder.up_blocks[0][1].norm.eval()
    with torch.no_grad(), spatial.sharding(ctx):  # in eval, per channel: a one-rank shard is diffusers' decode
        sharded = FAMILY.untiled_decode(vae, z)
    with torch.no_grad():
        assert_close(sharded, vae.decoder(z), CPU_FP32, "one-rank shard")


# -- the real config (Sana's dc-ae-f32c32-sana-1.0), on the meta device -------------------------------------


def test_real_sana_config_installs_and_plans_on_meta():
    from diffusers import AutoencoderDC

    with torch.device("meta"):
        vae = AutoencoderDC(**SANA_F32C32)
    assert vae.spatial_compression_ratio == 32 and vae.config.latent_channels == 32
    vaeshard.parallelize(vae, mode="auto")
    swapped = {type(m).__mro__[1].__name__ for m in vae.modules() if vaeshard.runtime.swap.is_swapped(m)}
    assert swapped == {"HaloConv2d", "ShardedLinearAttention"}
    attention = [m for m in vae.modules() if type(m).__name__ == "SanaMultiscaleLinearAttention"]
    assert len(attention) == 18 and all(vaeshard.runtime.swap.is_swapped(m) for m in attention)
    # 1024 x 1024 -> a 32 x 32 latent; diffusers' default tiles: 16 latent rows every 14
    assert vaeshard.plan(vae, (1, 32, 32, 32), 4).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 3, 1024, 1536), 4, op="encode").strategy == "spatial_shard_width"
    ops = FAMILY.decode_tile_ops(vae, torch.empty((1, 32, 32, 40), device="meta"))
    assert (ops.grid.num_rows, ops.grid.num_cols, ops.grid.keep_rows, ops.grid.blend_rows) == (3, 3, 448, 64)
    ops = FAMILY.encode_tile_ops(vae, torch.empty((1, 3, 1000, 600), device="meta"))
    assert (ops.grid.num_rows, ops.grid.num_cols, ops.grid.out_rows) == (3, 2, 31)
    vaeshard.unparallelize(vae)
    assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())
