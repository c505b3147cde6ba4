"""The benchmark scripts: each one imports and shows its --help against the current library, and
benchmarks/gpu_parity.py judges the exactness contract's bf16 rule as BENCHMARKS.md states it (on
synthetic figures, and in a CPU run of tiny configs). The scripts' GPU measurements run elsewhere."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))
SHELL_SCRIPTS = sorted(p.name for p in BENCH.glob("*.sh"))
OPTIONAL = ("triton", "matplotlib")  # packages some scripts need that a minimal install may lack


def _load(name: str):
    """A benchmark script as a module, by path (its main is not run)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name[:-3]}", BENCH / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def parity():
    return _load("gpu_parity.py")


def test_the_scripts_are_found():
    assert {"gpu_parity.py", "memory_model.py", "rank_alone.py"} <= set(SCRIPTS)
    assert {"gpu_scaling.sh", "two_gpus.sh"} <= set(SHELL_SCRIPTS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_imports(name):
    try:
        module = _load(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise
    assert callable(module.main)


# Every script's --help, run as `python3 benchmarks/NAME.py --help` runs it: as __main__, with its folder
# first on sys.path. One child interpreter runs them all (through runpy): a process per script would
# spend most of its time importing torch again.
_HELP_DRIVER = r"""
import contextlib, io, json, runpy, sys
folder, results = sys.argv[1], {}
for path in sys.argv[2:]:
    out, code = io.StringIO(), None
    sys.argv = [path, "--help"]
    sys.path.insert(0, folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else str(exc.code)
    except ModuleNotFoundError as exc:
        code = f"ModuleNotFoundError {exc.name}: {exc}"
    except BaseException as exc:  # a failing import or argument parser: reported, not raised
        code = f"{type(exc).__name__}: {exc}"
    finally:
        sys.path.remove(folder)
    results[path] = [code, out.getvalue()[-3000:]]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps():
    paths = [str(BENCH / name) for name in SCRIPTS if "argparse" in (BENCH / name).read_text()]
    done = subprocess.run(
        [sys.executable, "-c", _HELP_DRIVER, str(BENCH), *paths], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {Path(path).name: result for path, result in json.loads(done.stdout.splitlines()[-1]).items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_help_runs(helps, name):
    if name not in helps:
        pytest.skip(f"{name} has no argparse command line")
    code, output = helps[name]
    if isinstance(code, str) and code.startswith("ModuleNotFoundError") and code.split()[1].split(".")[0] in OPTIONAL:
        pytest.skip(f"{name}: {code}")
    assert code == 0, f"{code}\n{output}"
    assert "usage:" in output and "--help" in output, output


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_every_shell_script_parses(name):
    done = subprocess.run(["bash", "-n", str(BENCH / name)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr


# --- gpu_parity's judging -----------------------------------------------------------------------------


def _bf16_row(**changes):
    """A bf16 row within every limit: vaeshard as far from the fp32 reference as diffusers' bf16 decode
    (mean), a little nearer (max), 4.3e-2 from diffusers' bf16 output."""
    row = {
        "bit_identical": False,
        "max_diff": 4.3e-2,
        "mean_diff": 5.8e-3,
        "fp32_max": 4.2e-2,
        "fp32_mean": 5.8e-3,
        "diffusers_fp32_max": 4.96e-2,
        "diffusers_fp32_mean": 5.8e-3,
        "graphs": "=",
    }
    row.update(changes)
    return row


def test_the_bf16_rule_passes_a_row_within_its_limits(parity):
    assert parity.judge("bf16", _bf16_row()) == (True, [])
    # at the limits themselves
    at_limits = _bf16_row(fp32_mean=1.10 * 5.8e-3 * (1 - 1e-9), fp32_max=1.25 * 4.96e-2 * (1 - 1e-9), max_diff=5e-2)
    assert parity.judge("bf16", at_limits) == (True, [])


@pytest.mark.parametrize(
    "changes,failing",
    [
        ({"fp32_mean": 1.11 * 5.8e-3}, "mean |diff| from fp32"),  # 1.11x diffusers' mean distance
        ({"fp32_max": 1.26 * 4.96e-2}, "max |diff| from fp32"),  # 1.26x diffusers' max distance
        ({"max_diff": 5.01e-2}, "to diffusers' bf16"),  # beyond 5e-2 of diffusers' bf16 output
    ],
)
def test_the_bf16_rule_fails_each_limit_alone(parity, changes, failing):
    ok, failed = parity.judge("bf16", _bf16_row(**changes))
    assert not ok
    assert len(failed) == 1 and failing in failed[0], failed


def test_the_bf16_rule_fails_every_limit_it_breaks_and_never_passes_nan(parity):
    ok, failed = parity.judge("bf16", _bf16_row(fp32_mean=1.2 * 5.8e-3, fp32_max=1.3 * 4.96e-2, max_diff=0.06))
    assert not ok and len(failed) == 3
    for field in ("fp32_mean", "fp32_max", "max_diff"):
        assert not parity.judge("bf16", _bf16_row(**{field: math.nan}))[0], field
    # diffusers exactly at the reference while vaeshard is not: infinitely as far
    assert not parity.judge("bf16", _bf16_row(diffusers_fp32_mean=0.0))[0]


def test_the_fp32_and_bit_identity_rules(parity):
    assert parity.judge("fp32", {"bit_identical": False, "max_diff": 1e-4}) == (True, [])
    ok, failed = parity.judge("fp32", {"bit_identical": False, "max_diff": 1.01e-4})
    assert not ok and len(failed) == 1 and "max |diff|" in failed[0], failed
    assert parity.judge("bit-identical", {"bit_identical": True, "max_diff": 0.0}) == (True, [])
    ok, failed = parity.judge("bit-identical", {"bit_identical": False, "max_diff": 1e-7})
    assert not ok and "not bit-identical" in failed[0]
    # a CUDA graph replay that differs from the eager decode fails any row
    assert not parity.judge("bit-identical", {"bit_identical": True, "max_diff": 0.0, "graphs": "!"})[0]
    with pytest.raises(ValueError, match="unknown rule"):
        parity.judge("fp16", {})


def test_which_rule_a_row_is_judged_by(parity):
    for exact in (False, True):
        for dtype in ("fp32", "bf16"):
            assert parity.rule_for("tile", exact, dtype) == "bit-identical"
    assert parity.rule_for("direct", True, "bf16") == "bit-identical"
    assert parity.rule_for("direct", False, "bf16") == "bf16"
    assert parity.rule_for("direct", False, "fp32") == "fp32"
    assert parity.rule_for("spatial_shard_height", True, "fp32") == "fp32"
    assert parity.rule_for("spatial_shard_width", True, "bf16") == "bf16"


def test_the_limits_are_the_test_suites(parity):
    tolerances = pytest.importorskip("tests.parity")
    for name in ("BF16_MEAN_RATIO", "BF16_MAX_RATIO"):
        if hasattr(tolerances, name):
            assert getattr(parity, name) == getattr(tolerances, name), name
    if hasattr(tolerances, "BF16_MAX"):
        assert parity.BF16_MAX_TO_DIFFUSERS == tolerances.BF16_MAX
    if hasattr(tolerances, "CUDA_FP32"):
        assert parity.FP32_MAX == tolerances.CUDA_FP32


def test_distances_and_ratios_from_tensors(parity):
    import torch

    reference = torch.zeros(1, 3, 2, 4, 4)
    diffusers = reference + 0.01
    diffusers[0, 0, 0, 0, 0] = 0.04  # max 0.04 from the reference
    same = parity.distances(diffusers.clone(), diffusers, reference)
    assert same["bit_identical"] and same["max_diff"] == 0.0
    assert same["ratio_max"] == same["ratio_mean"] == 1.0
    off = parity.distances(diffusers + 0.01, diffusers, reference)
    assert not off["bit_identical"]
    assert off["max_diff"] == pytest.approx(0.01) and off["fp32_max"] == pytest.approx(0.05)
    assert off["ratio_max"] == pytest.approx(0.05 / 0.04)
    assert off["ratio_mean"] == pytest.approx(off["fp32_mean"] / same["diffusers_fp32_mean"])
    assert parity.ratio(0.0, 0.0) == 1.0 and parity.ratio(1.0, 0.0) == math.inf
    row = {
        "model": "wan21",
        "dtype": "bf16",
        "mode": "auto fast",
        "strategy": "direct",
        "ok": True,
        **off,
        "ratio_mean": None,
        "graphs": "-",
        "same_plan_as": "auto exact",
    }
    line = parity.format_row(row)
    assert line.startswith("wan21  bf16  auto fast") and "(same plan as auto exact)" in line


@pytest.mark.timeout(90)
def test_a_cpu_run_of_tiny_configs(parity, tmp_path):
    """The whole script on CPU (no process group) with a tiny Wan 2.1: every row written, judged by
    its rule, the exact tier bit-identical, the fp32 fast tier within 1e-4, and a row with the plan of
    an earlier one reported with that row's figures."""
    out = tmp_path / "parity.jsonl"
    rc = parity.main(
        [
            "--device",
            "cpu",
            "--small",
            "--models",
            "wan21",
            "--dtypes",
            "fp32,bf16",
            "--modes",
            "auto,tile",
            "--shapes",
            "wan21=1,4,1,2,2",
            "--out",
            str(out),
        ]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["dtype"], r["mode"]) for r in rows] == [
        ("fp32", "auto fast"),
        ("fp32", "auto exact"),
        ("fp32", "tile exact"),
        ("bf16", "diffusers-untiled"),
        ("bf16", "auto fast"),
        ("bf16", "auto exact"),
        ("bf16", "tile exact"),
    ]
    assert rc == (0 if all(r["ok"] for r in rows) else 1)
    for r in rows:
        if r["strategy"] != "(reference)":
            assert r["rule"] == parity.rule_for(r["strategy"], r["exact"], r["dtype"])
            assert r["ok"] == parity.judge(r["rule"], r)[0], r
        if r["exact"]:
            assert r["bit_identical"], r
        if r["dtype"] == "bf16":
            assert r["diffusers_fp32_max"] > 0 and r["diffusers_fp32_mean"] > 0, r  # the bf16 noise floor
    fast32 = rows[0]
    assert fast32["rule"] == "fp32" and fast32["ok"] and fast32["ratio_max"] is None
    for r in rows:
        if r.get("same_plan_as"):
            earlier = next(e for e in rows if e["dtype"] == r["dtype"] and e["mode"] == r["same_plan_as"])
            for k in ("max_diff", "fp32_mean", "ok"):
                assert r[k] == earlier[k], (r, earlier)


# --- e2e: a fresh process to the closed file ------------------------------------------------------


@pytest.mark.timeout(240)
def test_e2e_times_each_route_from_a_fresh_process_to_the_closed_file(tmp_path):
    import av
    import numpy as np
    from safetensors.torch import save_file

    from ..models import build, latent

    build("wan21").save_pretrained(tmp_path / "wan21")
    save_file({"latents": latent((1, 4, 3, 6, 8))}, tmp_path / "z.safetensors")  # 9 frames of 48 x 64
    report, folder = tmp_path / "e2e.json", tmp_path / "runs"
    code = _load("e2e.py").main(
        [
            "--model", str(tmp_path / "wan21"), "--latents", str(tmp_path / "z.safetensors"),
            "--device", "cpu", "--reps", "1", "--out-dir", str(folder), "--json", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    data = json.loads(report.read_text())
    pictures = {}
    for route in ("vaeshard", "diffusers"):
        (row,) = data["rows"][route]
        phases = row["load_s"] + row["decode_s"] + row["encode_s"]
        assert all(row[k] > 0 for k in ("load_s", "decode_s", "encode_s")), row
        assert phases == pytest.approx(row["to_file_s"]) and row["to_file_s"] < row["wall_s"], row
        with av.open(str(folder / f"{route}.mp4")) as container:
            pictures[route] = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(pictures[route]) == 9 and pictures[route][0].shape == (48, 64, 3), route
    # the two routes wrote the same video (each lossy in its own encoder)
    error = np.abs(pictures["vaeshard"][4].astype(float) - pictures["diffusers"][4].astype(float)).mean()
    assert error < 12, error
    warm = data["warm"]["median_s"]
    assert set(warm) == {"decode", "decode_then_encode", "streamed"} and min(warm.values()) > 0
    ratios = data["ratios"]
    assert ratios["diffusers_over_vaeshard_cold"] == pytest.approx(
        data["median"]["diffusers"]["to_file_s"] / data["median"]["vaeshard"]["to_file_s"]
    )
    assert data["environment"]["device"] == "cpu"
