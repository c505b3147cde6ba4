"""The auto rule and forced-mode fallbacks, through `plan` (no process group needed)."""

from __future__ import annotations

import pytest

import vaeshard

from .models import build


@pytest.fixture(scope="module")
def wan():
    return build("wan21_real")


AUTO_TABLE = [
    # latent shape, world, expected strategy
    ((1, 16, 1, 60, 104), 4, "spatial_shard_width"),
    ((1, 16, 5, 60, 104), 4, "spatial_shard_width"),
    ((1, 16, 5, 104, 60), 4, "spatial_shard_height"),
    ((1, 16, 5, 64, 64), 4, "spatial_shard_width"),  # tie: width wins
    ((1, 16, 5, 2, 2), 4, "direct"),  # neither axis covers 4 ranks; one tile
    ((1, 16, 5, 3, 90), 4, "spatial_shard_width"),
    ((1, 16, 5, 90, 3), 4, "spatial_shard_height"),
    ((1, 16, 64, 64), 4, "direct"),  # 4-D: never spatial
    ((1, 16, 5, 60, 104), 1, "direct"),
]


@pytest.mark.parametrize("shape,world,expected", AUTO_TABLE)
def test_auto_rule(wan, shape, world, expected):
    p = vaeshard.plan(wan, shape, world)
    assert p.strategy == expected, p
    assert p.reason and "\n" not in p.reason


def test_auto_uses_tile_when_no_axis_covers_group_and_several_tiles(wan):
    wan.tile_sample_min_height = wan.tile_sample_min_width = 16
    wan.tile_sample_stride_height = wan.tile_sample_stride_width = 8
    try:
        assert vaeshard.plan(wan, (1, 16, 5, 3, 3), 4).strategy == "tile"
    finally:
        wan.tile_sample_min_height = wan.tile_sample_min_width = 256
        wan.tile_sample_stride_height = wan.tile_sample_stride_width = 192


def test_partial_group_never_shards(wan):
    p = vaeshard.plan(wan, (1, 16, 5, 60, 104), 4, size=2)
    assert p.strategy == "tile" and not p.fallback and "partial group" in p.reason


@pytest.mark.parametrize(
    "mode,shape,world",
    [
        ("spatial_shard_height", (1, 16, 5, 3, 90), 4),  # H shorter than the group: never width
        ("spatial_shard_width", (1, 16, 5, 90, 3), 4),
        ("spatial_shard_height", (1, 16, 90, 90), 4),  # not 5-D
    ],
)
def test_forced_spatial_that_cannot_run_falls_back_to_tile_not_other_axis(wan, mode, shape, world):
    p = vaeshard.plan(wan, shape, world, mode)
    assert p.fallback and p.strategy in ("tile", "direct")
    assert "cannot run" in p.reason


def test_forced_modes_and_tile(wan):
    assert vaeshard.plan(wan, (1, 16, 5, 60, 104), 2, "spatial_shard_height").strategy == "spatial_shard_height"
    assert vaeshard.plan(wan, (1, 16, 5, 60, 104), 2, "tile").strategy == "tile"
    assert vaeshard.plan(wan, (1, 16, 5, 60, 104), 1, "tile").strategy == "tile"  # still diffusers' tiling


def test_plan_is_deterministic_and_side_effect_free(wan):
    state = {k: v.clone() for k, v in wan.state_dict().items()}
    first = vaeshard.plan(wan, (1, 16, 5, 60, 104), 3)
    assert all(vaeshard.plan(wan, (1, 16, 5, 60, 104), 3) == first for _ in range(3))
    assert all((wan.state_dict()[k] == v).all() for k, v in state.items())
    assert not hasattr(wan, "_vaeshard")


def test_plan_rejects_unknown_mode(wan):
    with pytest.raises(ValueError, match="valid modes"):
        vaeshard.plan(wan, (1, 16, 5, 60, 104), 2, "rows")
