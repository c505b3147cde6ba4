"""Public API: config validation, parallelize/unparallelize, parameters and state_dict untouched."""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard.config import ParallelConfig as VaeParallelConfig

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
    from diffusers import AutoencoderTiny

    with pytest.raises(ValueError) as err:
        vaeshard.parallelize(torch.nn.Linear(2, 2))
    assert "Linear" in str(err.value) and "AutoencoderKLWan" in str(err.value)
    assert "AutoencoderTiny" not in vaeshard.supported_classes()
    del AutoencoderTiny


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
    assert vaeshard.api.config_of(vae).mode == "tile"


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


def test_every_fast_knob_is_an_option_of_decode_and_bench_with_its_default():
    """The command line maps onto FastOptions: each knob is an option of `decode` and `bench` whose
    destination is the knob's name and whose default is the knob's."""
    import argparse
    from dataclasses import fields

    from vaeshard.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    knobs = {f.name: f.default for f in fields(vaeshard.FastOptions)}
    assert knobs
    for name, default in knobs.items():
        for command in ("decode", "bench"):
            dests = {a.dest: a.default for a in commands[command]._actions}
            assert dests[name] == default, (command, name)


def test_parallelize_takes_the_fast_knobs_in_fast_options_only():
    vae = build("wan21")
    with pytest.raises(TypeError, match="FastOptions"):
        vaeshard.parallelize(vae, fast={"frames_per_step": 2})
    with pytest.raises(TypeError):
        vaeshard.parallelize(vae, frames_per_step=2)  # no knob is a keyword of its own
    assert not hasattr(vae, "_vaeshard")  # refused before anything changed
    vaeshard.parallelize(vae, "tile", fast=vaeshard.FastOptions(frames_per_step=3))
    assert vaeshard.api.config_of(vae).fast.frames_per_step == 3
