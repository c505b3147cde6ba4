"""Guards on the diffusers code vaeshard mirrors: every function a family declares it re-implements
(Family.mirrors) still has the source it was written from, in the installed diffusers. When diffusers
changes one, the test fails naming it and the vaeshard code to re-check; after re-checking (and
fixing the mirror where the computation changed), update the recorded hash."""

from __future__ import annotations

import pytest

from vaeshard.families import all_families
from vaeshard.families.base import source_hash

MIRRORS = sorted({m for family in all_families() for m in family.mirrors})


def test_every_family_with_its_own_forwards_declares_them():
    names = {family.name: {m.theirs.split(":")[1] for m in family.mirrors} for family in all_families()}
    assert {"AutoencoderKLWan._decode", "WanResidualBlock.forward", "WanCausalConv3d.forward"} <= names["wan"]
    assert {"AutoencoderKLQwenImage._decode", "QwenImageResidualBlock.forward"} <= names["qwenimage"]
    assert {"AutoencoderKL.tiled_decode", "AttnProcessor2_0.__call__"} <= names["autoencoder_kl"]


@pytest.mark.parametrize("mirror", MIRRORS, ids=[m.theirs.split(":")[1] for m in MIRRORS])
def test_mirrored_diffusers_function_is_unchanged(mirror):
    import diffusers

    now = source_hash(mirror.theirs)
    assert now == mirror.sha, (
        f"diffusers changed {mirror.theirs.split(':')[1]} (diffusers {diffusers.__version__}: source hash {now}, "
        f"recorded {mirror.sha}); re-check {mirror.ours} against it, then record the new hash in the family's mirrors"
    )


def test_the_hash_sees_a_change(tmp_path, monkeypatch):
    # a guard that could not fail would check nothing: a changed line changes the hash, indentation alone does not
    import importlib
    import linecache

    monkeypatch.syspath_prepend(str(tmp_path))
    probe = tmp_path / "vaeshard_drift_probe.py"
    probe.write_text("class A:\n    def f(self, x):\n        return x + 1\n")
    module = importlib.import_module("vaeshard_drift_probe")
    first = source_hash("vaeshard_drift_probe:A.f")
    probe.write_text("class A:\n    def f(self, x):\n        return x + 2\n")
    linecache.checkcache(str(probe))
    importlib.reload(module)
    assert source_hash("vaeshard_drift_probe:A.f") != first
    probe.write_text("def f(self, x):\n    return x + 1\n")  # the first text, dedented
    linecache.checkcache(str(probe))
    importlib.reload(module)
    assert source_hash("vaeshard_drift_probe:f") == first
