"""The family registry: refusal of unsupported classes, declarations every family keeps, the shape
facts each family reads off a config (against the built model's decode), and the support table in
docs/families.md, which must be exactly what the registry generates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vaeshard
from vaeshard import families
from vaeshard.runtime import swap

from ..family_parity import RealConfigsOnMeta
from ..models import build, latent

DOCS = Path(__file__).resolve().parents[2] / "docs"

# One tiny config per registered class (its family's first test config for it): a new family declares
# its test configs and gets these checks.
FAMILY_MODELS: dict[str, str] = {}
for _name, (_cls_name, _) in families.tiny_configs().items():
    FAMILY_MODELS.setdefault(_cls_name, _name)
TINY = sorted(FAMILY_MODELS.values())  # (the "_layout" configs: their real configs' check below)


def _tiny_autoencoder():
    from diffusers import AutoencoderTiny

    return AutoencoderTiny(
        encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8),
        num_encoder_blocks=(1, 1),
        num_decoder_blocks=(1, 1),
        latent_channels=4,
    )


class AutoencoderKLHunyuanImage(torch.nn.Module):
    """Stands in for a VAE class vaeshard has never heard of."""


@pytest.mark.parametrize(
    "make", [_tiny_autoencoder, AutoencoderKLHunyuanImage], ids=["AutoencoderTiny", "hypothetical"]
)
def test_unsupported_class_is_refused_naming_it_and_the_supported_ones(make):
    vae = make()
    name = type(vae).__name__
    for call in (lambda: vaeshard.parallelize(vae), lambda: vaeshard.plan(vae, (1, 4, 8, 8), 2)):
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert f"does not support {name}" in message
        for supported in families.supported_classes():
            assert supported in message
        assert "docs/adding-a-family.md" in message
    assert "decode" not in vae.__dict__ and not hasattr(vae, "_vaeshard")  # refused before installing anything


def test_every_registered_class_has_a_test_model():
    assert set(FAMILY_MODELS) == set(families.supported_classes())


@pytest.mark.parametrize("cls_name", sorted(FAMILY_MODELS))
def test_family_declarations_are_complete(cls_name):
    vae = build(FAMILY_MODELS[cls_name])
    assert type(vae).__name__ == cls_name
    family = families.family_for(vae)
    assert cls_name in family.classes
    assert family.latent_ndim in (4, 5)
    assert family.latent_channels(vae) > 0
    hooks = {
        "tile_decode": ["decode_tile_ops"],
        "tile_encode": ["encode_tile_ops", "encode_prepare"],
        "spatial_decode": ["untiled_decode", "install_layers", "uninstall_layers"],
        "spatial_encode": ["untiled_encode", "install_layers", "uninstall_layers"],
    }
    for capability, names in hooks.items():
        if getattr(family, capability):
            for hook in names:
                assert callable(getattr(family, hook)), f"{family.name} declares {capability} without {hook}"
    assert callable(family.release)


@pytest.mark.parametrize("cls_name", sorted(FAMILY_MODELS))
def test_tile_ops_are_planned_from_shapes_alone(cls_name):
    # plan() probes decode_tile_ops with a meta tensor: a family must build its grid without data
    vae = build(FAMILY_MODELS[cls_name])
    family = families.family_for(vae)
    if not family.tile_decode:  # (no tiled path in diffusers: a tile request is refused, its test says)
        return
    lead = (1, family.latent_channels(vae)) + ((2,) if family.latent_ndim == 5 else ())
    assert family.decode_tile_ops(vae, torch.empty(lead + (1, 1), device="meta")) is None
    ops = family.decode_tile_ops(vae, torch.empty(lead + (64, 64), device="meta"))
    assert ops is not None and len(ops.grid.tiles) > 1


@pytest.mark.parametrize("cls_name", sorted(FAMILY_MODELS))
def test_install_and_uninstall_keep_parameters_and_classes(cls_name):
    vae = build(FAMILY_MODELS[cls_name])
    family = families.family_for(vae)
    classes = {n: type(m) for n, m in vae.named_modules()}
    state = {k: v.clone() for k, v in vae.state_dict().items()}
    family.install_layers(vae)
    family.install_layers(vae)  # idempotent
    assert any(swap.is_swapped(m) for m in vae.modules())
    assert list(vae.state_dict()) == list(state)
    vae.load_state_dict(state, strict=True)
    family.uninstall_layers(vae)
    assert {n: type(m) for n, m in vae.named_modules()} == classes


def test_docs_support_table_is_generated_from_the_registry():
    table = families.support_table()
    for cls_name in families.supported_classes():
        assert f"`{cls_name}`" in table
    doc = (DOCS / "families.md").read_text()
    assert table in doc, "docs/families.md is stale: paste vaeshard.families.support_table() into it"
    assert doc.count("| diffusers class |") == 1


def _decode(vae, z):
    # LTX's decoders take the timestep their tiny configs are conditioned on
    inputs = {"temb": torch.tensor([0.05])} if getattr(vae.config, "timestep_conditioning", False) else {}
    with torch.no_grad():
        return vae.decode(z, **inputs).sample


@pytest.mark.parametrize("name", TINY)
def test_shape_facts_of_a_tiny_config_are_its_decode(name):
    """The facts read off the config alone are what diffusers' decode of the built model gives."""
    cls_name, config = families.tiny_configs()[name]
    facts = vaeshard.shape_facts(cls_name, config)
    vae = build(name)
    family = families.family_for(vae)
    assert (facts.latent_ndim, facts.latent_channels) == (family.latent_ndim, family.latent_channels(vae))
    assert facts.spatial_factor == family.spatial_ratio(vae)
    # two frames; CogVideoX an odd count too (it decodes them differently); Qwen-Image 2.1: one frame
    counts = [None] if facts.latent_ndim == 4 else [1] if facts.temporal_factor == 1 else [2]
    for frames in counts + ([3] if facts.paired_frames else []):
        lead = (1, facts.latent_channels) + (() if frames is None else (frames,))
        out = _decode(vae, latent(lead + (2, 3)))
        expected = (1, facts.sample_channels) + (() if frames is None else (facts.frames_out(frames),))
        assert tuple(out.shape) == expected + (2 * facts.spatial_factor, 3 * facts.spatial_factor), (name, frames)


class TestEveryRealConfig(RealConfigsOnMeta):
    """Every family's real configs on the meta device (tests/family_parity.py)."""

    CONFIGS = list(families.named_configs())
