"""The auto rule and forced-mode fallbacks, through `plan` (no process group needed)."""

from __future__ import annotations

import pytest
import torch

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
    ((1, 16, 64, 64), 4, "refused"),  # 4-D: decode refuses it, and so does the plan
    ((1, 16, 5, 60, 104), 1, "direct"),
]


@pytest.mark.parametrize("shape,world,expected", AUTO_TABLE)
def test_auto_rule(wan, shape, world, expected):
    p = vaeshard.plan(wan, shape, world)
    assert p.strategy == expected, p
    assert p.reason and "\n" not in p.reason


@pytest.mark.parametrize(
    "shape,world,op,expected",
    [
        ((1, 16, 21, 90, 160), 2, "decode", "spatial_shard_height"),  # Wan 2.1 720p: measured faster by height
        ((1, 16, 21, 60, 104), 2, "decode", "spatial_shard_height"),  # 480p: likewise
        ((1, 16, 5, 1, 104), 2, "decode", "spatial_shard_width"),  # one latent row: height cannot cover 2 ranks
        ((1, 16, 21, 90, 160), 4, "decode", "spatial_shard_width"),  # not measured at 4 ranks: the baseline
        ((1, 3, 17, 720, 1280), 2, "encode", "spatial_shard_width"),  # encode: the baseline
    ],
)
def test_auto_takes_the_family_measured_axis_for_wan_decodes_over_two_ranks(
    monkeypatch, wan, shape, world, op, expected
):
    from vaeshard import policy

    # on CPU, where it was not measured, the baseline rule: the longer axis (width for all of these)
    assert vaeshard.plan(wan, shape, world, op=op).strategy == "spatial_shard_width"
    monkeypatch.setattr(policy, "_device_of", lambda vae: torch.device("cuda"))  # the VAE as if on a GPU
    p = vaeshard.plan(wan, shape, world, op=op)
    assert p.strategy == expected, p
    if expected == "spatial_shard_height":
        assert "on cuda measured faster by height" in p.reason


def test_the_measured_axis_is_the_wan_2_1_layers_own():
    # the refinement covers what was measured: Wan 2.1's layers (and Qwen-Image's, the same) on 2
    # ranks; Wan 2.2 (measured within 1%) and AutoencoderKL keep the baseline rule
    from vaeshard.families import family_for

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for name, axis in (("wan21", "height"), ("qwenimage", "height"), ("wan22", None)):
        vae = build(name)
        vae.config.decoder_base_dim = None  # the small test models: give them the real layer widths
        vae.register_to_config(base_dim=96 if axis else 160)
        assert family_for(vae).decode_axis(vae, 2, cuda) == axis, name
        assert family_for(vae).decode_axis(vae, 4, cuda) is None
        assert family_for(vae).decode_axis(vae, 2, cpu) is None
    kl = build("autoencoder_kl")
    assert family_for(kl).decode_axis(kl, 2, cuda) is None
    assert vaeshard.plan(kl, (1, 4, 60, 104), 2).strategy == "spatial_shard_width"


def test_auto_never_tiles_a_vae_whose_tiling_is_off(wan):
    # no axis covers the group and the latent is several tiles: tiles would change the untiled result,
    # so one rank decodes it directly; with diffusers' tiling on, auto tiles as the VAE itself does
    wan.tile_sample_min_height = wan.tile_sample_min_width = 16
    wan.tile_sample_stride_height = wan.tile_sample_stride_width = 8
    try:
        off = vaeshard.plan(wan, (1, 16, 5, 3, 3), 4)
        assert off.strategy == "direct" and not off.changes_result and "tiles would change" in off.reason
        forced = vaeshard.plan(wan, (1, 16, 5, 3, 3), 4, "tile")
        assert forced.strategy == "tile" and forced.changes_result and "NOT what this VAE computes" in forced.result
        wan.use_tiling = True
        for shape in ((1, 16, 5, 3, 3), (1, 16, 5, 60, 104)):
            on = vaeshard.plan(wan, shape, 4)
            assert on.strategy == "tile" and not on.changes_result and "tiled decode" in on.result, on
        sharded = vaeshard.plan(wan, (1, 16, 5, 60, 104), 4, "spatial_shard_width")
        assert sharded.changes_result and "NOT what this VAE computes" in sharded.explain()
        assert vaeshard.plan(wan, (1, 16, 5, 1, 2), 4).strategy == "direct"  # one tile: diffusers decodes it whole
    finally:
        wan.use_tiling = False
        wan.tile_sample_min_height = wan.tile_sample_min_width = 256
        wan.tile_sample_stride_height = wan.tile_sample_stride_width = 192


def test_partial_group_never_shards(wan):
    p = vaeshard.plan(wan, (1, 16, 5, 60, 104), 4, size=2)
    assert p.strategy == "direct" and not p.fallback and "partial group" in p.reason
    assert vaeshard.plan(wan, (1, 16, 5, 60, 104), 4, "tile", size=2).strategy == "tile"


def test_plan_of_a_request_decode_refuses_says_so_with_its_message(wan):
    from vaeshard.runtime.requests import size_message

    p = vaeshard.plan(wan, (1, 8, 2, 6, 8), 2)  # wan21_real: 16 latent channels
    vaeshard.parallelize(wan)
    try:
        with pytest.raises(ValueError) as raised:
            wan.decode(torch.zeros(1, 8, 2, 6, 8))  # one process: the agreement is this rank's own check
    finally:
        vaeshard.unparallelize(wan)
    assert p.strategy == "refused" and p.explain() == f"refused: {raised.value}"
    assert "16 channels" in p.reason and p.fast is None
    assert vaeshard.plan(wan, (1, 16, 2, 6, 8), 2, size=3).explain() == f"refused: {size_message(3, 2)}"


@pytest.mark.parametrize(
    "mode,shape,world",
    [
        ("spatial_shard_height", (1, 16, 5, 3, 90), 4),  # H shorter than the group: never width
        ("spatial_shard_width", (1, 16, 5, 90, 3), 4),
    ],
)
def test_forced_spatial_that_cannot_run_falls_back_to_tile_not_other_axis(wan, mode, shape, world):
    p = vaeshard.plan(wan, shape, world, mode)
    assert p.fallback and p.strategy in ("tile", "direct")
    assert "cannot run" in p.reason
    if p.strategy == "tile":  # the tiled result, not this VAE's untiled one: explain() says so
        assert p.changes_result and "could not run, so the result is the tiled one" in p.explain()


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


def test_plan_defaults_its_settings_from_a_parallelized_vae():
    """plan(vae, shape) takes the VAE's own mode, size and fast options, and its group's size (no
    process group here: 1 rank)."""
    vae = build("wan21", (32, 24))
    assert vaeshard.plan(vae, (1, 4, 2, 6, 8)).strategy == "direct"  # a plain VAE: the defaults, one rank
    vaeshard.parallelize(vae, "tile", fast=vaeshard.FastOptions(frames_per_step=3))
    p = vaeshard.plan(vae, (1, 4, 2, 6, 8))
    assert p.strategy == "tile" and p.fast is None  # tile is the exact tier
    assert vaeshard.plan(vae, (1, 4, 2, 6, 8), 2, "spatial_shard_width").fast.frames_per_step == 3
    vaeshard.parallelize(vae, "auto", exact=True)
    assert vaeshard.plan(vae, (1, 4, 2, 6, 8), 2).fast is None  # exact: diffusers' own layers
    assert vaeshard.plan(vae, (1, 4, 2, 6, 8), 2, exact=False).fast is not None


def test_plan_explains_every_choice():
    vae = build("wan21_real")
    p = vaeshard.plan(vae, (1, 16, 21, 90, 160), 2, "spatial_shard_width")
    text = p.explain()
    assert text.splitlines()[0].startswith("strategy: spatial_shard_width")
    for name in ("frame", "frames_per_step", "cuda_graphs", "layer frames"):
        assert any(line.strip().startswith(name + ":") for line in text.splitlines()), (name, text)
    # the largest rank's output frame: 80 of 160 latent columns, 8x upsampled, by 90 rows
    assert p.fast.frame_pixels == 90 * 8 * 80 * 8


def test_a_request_looks_up_its_family_and_builds_its_tile_ops_once(monkeypatch):
    # a request carries its family (found by parallelize) and the tile ops its plan built into its
    # execution: no lookup while it runs, one construction of its tile ops, one answer of its own result
    import vaeshard.api
    from vaeshard import families

    from .parity import CPU_FP32, assert_close, assert_identical

    vae = build("wan21", tile_sample=(16, 8))  # latent tiles of 2 every 1: a 3 x 3 latent is 4 tiles
    z = torch.randn(1, 4, 1, 3, 3, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        untiled = vae.decode(z).sample
        vae.enable_tiling()
        tiled = vae.decode(z).sample
        vae.disable_tiling()
    assert not torch.equal(tiled, untiled)
    found = families.family_for(vae)
    kind = type(found)
    lookups, built, owns = [], [], []

    def lookup(v):
        lookups.append(type(v).__name__)
        return found

    def decode_tile_ops(self, v, x, real=kind.decode_tile_ops):
        built.append(x.device.type)
        return real(self, v, x)

    def own_result(self, v, op, shape, real=kind.own_result):
        owns.append(tuple(shape))
        return real(self, v, op, shape)

    monkeypatch.setattr(families, "family_for", lookup)
    monkeypatch.setattr(vaeshard.api, "family_for", lookup)
    monkeypatch.setattr(kind, "decode_tile_ops", decode_tile_ops)
    monkeypatch.setattr(kind, "own_result", own_result)

    vaeshard.parallelize(vae, "tile")
    assert lookups == ["AutoencoderKLWan"]  # parallelize's own
    assert_identical(vae.decode(z).sample, tiled, "mode tile: diffusers' tiled decode")
    assert (lookups, built, owns) == (["AutoencoderKLWan"], ["cpu"], [tuple(z.shape)])

    vaeshard.parallelize(vae, "auto")  # one rank in the fast tier: planned, and resolved its choices
    for calls in (lookups, built, owns):
        calls.clear()
    assert_close(vae.decode(z).sample, untiled, CPU_FP32, "auto on one rank: diffusers' untiled decode")
    assert (lookups, built, owns) == ([], [], [tuple(z.shape)])

    # the plan of a shape (no request): one lookup, the tile ops built on a meta tensor of that shape
    assert vaeshard.plan(vae, z.shape, 2, "tile").strategy == "tile"
    assert (lookups, built) == (["AutoencoderKLWan"], ["meta"])
    vaeshard.unparallelize(vae)


def test_a_family_measured_slower_runs_diffusers_layers_on_cuda_and_says_why(monkeypatch):
    """Never slower: a family in tuning.FAST_TIER_SLOWER_FAMILIES gets diffusers' layers on CUDA
    although the fast tier was asked for (the plan's tier says why); elsewhere, and for the others,
    the fast tier plans as before."""
    from vaeshard import policy, tuning

    shapes = {"cogvideox": (1, 4, 2, 3, 4), "hunyuanvideo": (1, 4, 2, 3, 4)}
    vaes = {name: vaeshard.parallelize(build(name)) for name in shapes}
    for name, vae in vaes.items():
        assert vaeshard.plan(vae, shapes[name]).fast is not None  # CPU: the gate is a GPU measurement's
    monkeypatch.setattr(policy, "_device_of", lambda vae: torch.device("cuda"))
    monkeypatch.setattr(policy, "kernels_unavailable", lambda device: None)
    forced = vaeshard.FastOptions(norm_into_conv=True)  # asks for the norms into the convolutions
    for name, vae in vaes.items():
        plan = vaeshard.plan(vae, shapes[name])
        assert plan.fast is None, name
        assert f"{name}'s fast tier is off on a GPU by default" in plan.explain(), name
        assert plan.same_kernels and "in PyTorch's arithmetic" in plan.explain(), name  # its GroupNorms faster
        assert vaeshard.plan(vae, shapes[name], fast=forced).fast.norm_into_conv, name
    monkeypatch.setattr(tuning, "FAST_TIER_SLOWER_FAMILIES", ())
    assert all(vaeshard.plan(vae, shapes[name]).fast is not None for name, vae in vaes.items())
