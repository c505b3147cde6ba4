"""Tile strategy: bit-identical to diffusers' own single-process tiled decode/encode, on 1-4 gloo ranks."""

from __future__ import annotations

import pytest
import torch

from vaeshard.runtime.tile import Tile, TileGrid, balance

from ..dist_harness import run_ranks
from ..models import build, latent


def test_regular_grid_matches_diffusers_loops():
    grid = TileGrid.regular(
        10, 13, 4, 4, 3, 3, blend_rows=8, blend_cols=8, keep_rows=24, keep_cols=24, out_rows=80, out_cols=104
    )
    assert (grid.num_rows, grid.num_cols) == (len(range(0, 10, 3)), len(range(0, 13, 3)))
    last = grid.tiles[-1]
    assert (last.h0, last.h1, last.w0, last.w1) == (9, 10, 12, 13)  # clipped edge tile


def test_balance_largest_first_to_least_loaded():
    tiles = (Tile(0, 0, 0, 4, 0, 4), Tile(0, 1, 0, 4, 3, 5), Tile(1, 0, 3, 5, 0, 4), Tile(1, 1, 3, 5, 3, 5))
    # workloads 16, 8, 8, 4 over 2 ranks: 16 -> r0; 8 -> r1; 8 -> r1; 4 -> r0  => loads 20 / 16
    a = balance(tiles, 2)
    assert [(t.row, t.col) for t in a[0]] == [(0, 0), (1, 1)]
    assert [(t.row, t.col) for t in a[1]] == [(0, 1), (1, 0)]
    # more ranks than tiles: some ranks get nothing, every tile exactly once
    a = balance(tiles, 6)
    assert sorted((t.row, t.col) for r in a for t in r) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(1 for r in a if not r) == 2


def _tile_decode_parity(rank, world, model, tile_sample, shape, output, size):
    import vaeshard

    vae = build(model, tile_sample)
    z = latent(shape)
    with torch.no_grad():
        reference = vae.tiled_decode(z).sample  # diffusers, this process, same weights
    vaeshard.parallelize(vae, mode="tile", output=output, size=size)
    out = vae.decode(z).sample
    if output == "rank0" and rank != 0:
        assert out.numel() == 0
        return None
    assert out.shape == reference.shape, (out.shape, reference.shape)
    assert reference.std() > 0.01  # real values, not zeros
    assert torch.equal(out, reference), (out - reference).abs().max().item()
    return out.shape


TILE_CASES = [
    # id, model, (tile size, stride) in pixels, latent shape, world
    ("many-tiles-2", "wan21", (32, 24), (1, 4, 3, 10, 13), 2),
    ("many-tiles-3-uneven", "wan21", (32, 24), (1, 4, 2, 11, 7), 3),
    ("fewer-tiles-than-ranks-4", "wan21", (32, 24), (1, 4, 2, 5, 7), 4),
    ("wan22-3", "wan22", (64, 48), (1, 4, 3, 6, 9), 3),
    ("qwenimage-2", "qwenimage", (32, 24), (1, 4, 1, 9, 10), 2),
    ("batch2-2", "wan21", (32, 24), (2, 4, 2, 7, 6), 2),
]


@pytest.mark.parametrize("case", TILE_CASES, ids=[c[0] for c in TILE_CASES])
def test_tile_decode_bit_identical(case):
    _, model, tile_sample, shape, world = case
    run_ranks(_tile_decode_parity, world, model, tile_sample, shape, "all", None)


def test_tile_decode_output_rank0_and_partial_group():
    # rank0 placement, and size=2 of a 3-rank group: rank 2 has no tile but enters the gather
    run_ranks(_tile_decode_parity, 3, "wan21", (32, 24), (1, 4, 2, 10, 9), "rank0", 2)


def _single_tile_is_direct(rank, world):
    import vaeshard

    vae = build("wan21", (32, 24))
    z = latent((1, 4, 2, 4, 3))  # smaller than one 4x4-latent tile
    with torch.no_grad():
        reference = vae.decode(z).sample
    assert vaeshard.plan(vae, z.shape, world, "tile").strategy == "direct"
    vaeshard.parallelize(vae, mode="tile")
    assert torch.equal(vae.decode(z).sample, reference)


def test_latent_smaller_than_one_tile_decodes_directly():
    run_ranks(_single_tile_is_direct, 2)


def _tile_encode_parity(rank, world, model, tile_sample, shape):
    import vaeshard

    vae = build(model, tile_sample)
    x = latent(shape, seed=3).clamp(-1, 1)
    vae.enable_tiling()
    with torch.no_grad():
        reference = vae.encode(x).latent_dist  # diffusers' tiled encode (sizes exceed one tile)
    vae.disable_tiling()
    vaeshard.parallelize(vae, mode="tile")
    dist = vae.encode(x).latent_dist
    assert reference.mean.std() > 0.001
    assert torch.equal(dist.mean, reference.mean)
    assert torch.equal(dist.logvar, reference.logvar)


@pytest.mark.parametrize(
    "model,tile_sample,shape,world",
    [("wan21", (32, 24), (1, 3, 5, 72, 56), 2), ("wan22", (32, 24), (1, 3, 5, 80, 64), 3)],
    ids=["wan21-2", "wan22-3"],
)
def test_tile_encode_bit_identical(model, tile_sample, shape, world):
    run_ranks(_tile_encode_parity, world, model, tile_sample, shape)


def _real_wan21_tiny(rank, world):
    import vaeshard

    vae = build("wan21_real", (64, 48))
    z = latent((1, 16, 2, 12, 10))
    with torch.no_grad():
        reference = vae.tiled_decode(z).sample
    vaeshard.parallelize(vae, mode="tile")
    assert torch.equal(vae.decode(z).sample, reference)


def test_real_wan21_config_tile_decode():
    run_ranks(_real_wan21_tiny, 2, timeout=400)
