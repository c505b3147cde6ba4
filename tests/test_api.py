"""Public API: config validation, parallelize/unparallelize, parameters and state_dict untouched."""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard import VaeParallelConfig

from .models import build, latent


def test_modes_are_the_four_names():
    assert vaeshard.MODES == ("tile", "auto", "spatial_shard_height", "spatial_shard_width")


def test_config_rejects_unknown_mode_listing_valid_ones():
    with pytest.raises(ValueError) as err:
        VaeParallelConfig(size=2, mode="rows")
    msg = str(err.value)
    assert "'rows'" in msg
    for mode in vaeshard.MODES:
        assert mode in msg


@pytest.mark.parametrize("size", [0, -3])
def test_config_rejects_size_below_one(size):
    with pytest.raises(ValueError, match="size must be at least 1"):
        VaeParallelConfig(size=size, mode="tile")


def test_config_rejects_bad_output_and_timeout():
    with pytest.raises(ValueError, match="output"):
        VaeParallelConfig(output="rank1")
    with pytest.raises(ValueError, match="timeout"):
        VaeParallelConfig(timeout=0)


def test_unsupported_class_names_class_and_supported_ones():
    from diffusers import AutoencoderKLCogVideoX

    with pytest.raises(ValueError) as err:
        vaeshard.parallelize(torch.nn.Linear(2, 2))
    assert "Linear" in str(err.value) and "AutoencoderKLWan" in str(err.value)
    assert "AutoencoderKLCogVideoX" not in vaeshard.families.supported_classes()
    del AutoencoderKLCogVideoX


def test_parameters_and_state_dict_unchanged_and_strict_load():
    vae = build("wan21")
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    names = [n for n, _ in vae.named_parameters()]
    vaeshard.parallelize(vae, mode="spatial_shard_width")
    vaeshard.parallelize(vae, mode="tile")  # again: updates, does not install twice
    assert [n for n, _ in vae.named_parameters()] == names
    after = vae.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    vae.load_state_dict(before, strict=True)
    assert vaeshard.parallel.config_of(vae).mode == "tile"


def test_unparallelize_restores_plain_diffusers():
    vae = build("wan21")
    cls_before = {n: type(m) for n, m in vae.named_modules()}
    vaeshard.parallelize(vae, mode="auto")
    assert any(type(m) is not cls_before[n] for n, m in vae.named_modules())  # halo layers installed
    vaeshard.unparallelize(vae)
    assert {n: type(m) for n, m in vae.named_modules()} == cls_before
    assert "decode" not in vae.__dict__ and not hasattr(vae, "_vaeshard")


def test_without_process_group_exact_decode_is_plain_diffusers():
    vae = build("wan21")
    z = latent((1, 4, 2, 5, 6))
    with torch.no_grad():
        reference = vae.decode(z).sample
    vaeshard.parallelize(vae, exact=True)
    out = vae.decode(z)
    assert torch.equal(out.sample, reference)
    assert torch.equal(vae.decode(z, return_dict=False)[0], reference)
    vaeshard.parallelize(vae)  # the default fast tier: within the CPU fp32 tolerance
    assert (vae.decode(z).sample - reference).abs().max() <= 1e-5


def test_fast_tier_settings_are_named_alike_everywhere():
    """One list of the fast tier's settings: each is a VaeParallelConfig field, a parallelize keyword
    and a fast.tier argument with the same default, and an option of `decode` and `bench`."""
    import argparse
    import inspect
    from dataclasses import fields

    from vaeshard import fast
    from vaeshard.cli import build_parser
    from vaeshard.config import FAST_TIER_SETTINGS, VaeParallelConfig

    defaults = {f.name: f.default for f in fields(VaeParallelConfig)}
    keywords = inspect.signature(vaeshard.parallelize).parameters
    tier = inspect.signature(fast.tier).parameters
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert FAST_TIER_SETTINGS
    for name in FAST_TIER_SETTINGS:
        assert keywords[name].default == defaults[name] == tier[name].default, name
        for command in ("decode", "bench"):
            dests = {a.dest: a.default for a in commands[command]._actions}
            assert dests[name] == defaults[name], (command, name)
