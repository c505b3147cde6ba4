"""The shard plans and their one walker (families/base.py apply_plan): a refusal names every module it
cannot shard and swaps nothing; every registered family's plan covers its real configs; the report
counts what the plan gave each module."""

import pytest
import torch

from tests.models import build
from vaeshard.cli.io import NAMED_CONFIGS
from vaeshard.families import family_for
from vaeshard.runtime.swap import is_swapped


def _on_meta(name: str):
    import diffusers

    cls, config = NAMED_CONFIGS[name]
    with torch.device("meta"):
        return getattr(diffusers, cls)(**config)


def test_a_refusal_names_every_module_it_cannot_shard_and_swaps_nothing():
    vae = build("autoencoder_kl")
    vae.decoder.conv_act = torch.nn.Upsample(scale_factor=1.0)
    vae.decoder.mid_block.resnets[0].nonlinearity = torch.nn.AvgPool2d(3, stride=1, padding=1)
    classes = {name: type(m) for name, m in vae.named_modules()}
    with pytest.raises(ValueError) as refused:
        family_for(vae).install_layers(vae)
    message = str(refused.value)
    assert "decoder.conv_act (Upsample)" in message
    assert "decoder.mid_block.resnets.0.nonlinearity (AvgPool2d)" in message
    assert "2 of its layers" in message and "use mode='tile'" in message
    assert {name: type(m) for name, m in vae.named_modules()} == classes  # nothing swapped


def test_a_refused_rule_gives_its_reason():
    from diffusers.models.downsampling import Downsample2D

    vae = build("autoencoder_kl")
    vae.decoder.conv_act = Downsample2D(4, use_conv=True)  # declared refused in the decoder
    with pytest.raises(ValueError, match=r"decoder\.conv_act \(Downsample2D\) is a downsampler \(no halo rows"):
        family_for(vae).install_layers(vae)
    assert not any(is_swapped(m) for m in vae.modules())


@pytest.mark.parametrize("name", sorted(NAMED_CONFIGS))
def test_every_family_plan_covers_its_real_config(name):
    vae = _on_meta(name)
    family = family_for(vae)
    before = {n: type(m) for n, m in vae.named_modules()}
    report = family.shard_report(vae)  # raises naming any module the plan does not cover
    assert report is not None, f"family {family.name} declares no shard_plan"
    assert {n: type(m) for n, m in vae.named_modules()} == before  # a report swaps nothing
    assert report.counts.get("refused", 0) == 0 and report.swapped
    assert family.install_layers(vae) == report
    swapped = {n for n, m in vae.named_modules() if is_swapped(m)}
    assert swapped == {s.path for s in report.swapped}
    family.uninstall_layers(vae)
    assert {n: type(m) for n, m in vae.named_modules()} == before


def test_the_report_counts_each_treatment():
    vae = _on_meta("sd15")
    report = family_for(vae).install_layers(vae)
    decoder = list(vae.decoder.modules())
    padded = [m for m in decoder if isinstance(m, torch.nn.Conv2d) and any(m.padding)]
    norms = [m for m in decoder if isinstance(m, torch.nn.GroupNorm)]
    assert report.counts["halo"] == len(padded) == 33
    assert report.counts["global_norm"] == len(norms) == 30
    assert report.counts["whole_map"] == 1  # the mid block's attention
    assert sum(report.counts.values()) == len(decoder)  # every decoder module has a treatment
    silus = [m for m in decoder if isinstance(m, torch.nn.SiLU)]  # local, swapped to pass a producer's output on
    assert len(report.swapped) == 33 + 30 + 1 + len(silus) == 79
    mixins = {"ProducedConv2d", "GlobalGroupNormIntoConv", "WholeImageAttention", "SiLUAfterProducer"}
    assert {s.mixin for s in report.swapped} == mixins
    assert report.summary() == "33 halo, 30 global_norm, 1 whole_map, 70 local; 79 swapped"
