"""A Triton version the kernels do not support (kernels/triton_support.py SUPPORTED): no kernel runs,
the fast tier runs PyTorch's layers with diffusers' result, and `plan().explain()` says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import vaeshard
from vaeshard.kernels import triton_support

from ..models import build

SHAPE = (1, 4, 2, 6, 8)


@pytest.mark.parametrize("version", ["3.8.0", "4.0.1", "3.5.1", "3.7.0+git1234abcd-not.a.version", "main"])
def test_an_unsupported_version_turns_the_kernels_off_and_the_plan_says_why(monkeypatch, version):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # where the kernels would otherwise take CPU tensors
    monkeypatch.setattr(triton_support, "VERSION", version)
    why = triton_support.unavailable()
    if version.startswith("3.7.0"):  # a local build of a supported release
        assert why is None
        return
    assert why is not None and version in why and "3.6.x and 3.7.x" in why
    assert not triton_support.runs_on(torch.zeros(1))
    text = vaeshard.plan(build("wan21"), SHAPE).explain()
    line = next(line.strip() for line in text.splitlines() if line.strip().startswith("kernels:"))
    assert line == f"kernels: PyTorch's layers throughout ({why})", text


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1"])
def test_a_supported_version_adds_no_reason(monkeypatch, version):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_support, "VERSION", version)
    assert triton_support.unavailable() is None
    assert "kernels:" not in vaeshard.plan(build("wan21"), SHAPE).explain()


def test_missing_triton_is_named_only_where_the_kernels_would_run(monkeypatch):
    monkeypatch.setattr(triton_support, "VERSION", None)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "kernels:" not in vaeshard.plan(build("wan21"), SHAPE).explain()  # CPU never runs them
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "(Triton is not installed)" in vaeshard.plan(build("wan21"), SHAPE).explain()


@pytest.mark.timeout(120)
def test_a_process_with_an_unsupported_triton_decodes_as_diffusers(tmp_path):
    # Triton reports 3.8.0 before vaeshard is imported: no kernel module defines a kernel (they could
    # fail to compile), and a fast-tier decode, interpreter on, equals diffusers' decode
    script = textwrap.dedent(
        f"""
        import triton
        triton.__version__ = "3.8.0"
        import torch
        import vaeshard
        from vaeshard.kernels import box_gluon, norm, triton_support
        from tests.models import build, latent
        from tests.parity import CPU_FP32, assert_close

        assert triton_support.triton is None and triton_support.tl is None and box_gluon.gluon is None
        assert not hasattr(norm, "_voxel_block")
        vae = build("wan21")
        z = latent({SHAPE})
        with torch.no_grad():
            want = vae.decode(z).sample
            vaeshard.parallelize(vae)
            assert "Triton 3.8.0 is installed" in vaeshard.plan(vae, z.shape).explain()
            got = vae.decode(z).sample
        assert_close(got, want, CPU_FP32, "fast tier without kernels")
        print("ok")
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=110, cwd=root)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_the_test_extra_takes_the_supported_versions():
    pyproject = open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")).read()
    (spec,) = re.findall(r'"triton(>=[^";]+)', pyproject)
    (low_major, low_minor), (high_major, high_minor) = min(triton_support.SUPPORTED), max(triton_support.SUPPORTED)
    assert spec == f">={low_major}.{low_minor},<{high_major}.{high_minor + 1}"
