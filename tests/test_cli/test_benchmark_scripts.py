"""The benchmark tools (benchmarks/README.md): every entry point and each of its commands shows its
--help against the current library, those that run without a GPU run at a tiny size on CPU, and
benchmarks/gpu_parity.py judges the exactness contract's bf16 rule as BENCHMARKS.md states it (on
synthetic figures, and in a CPU run of tiny configs). The GPU measurements run elsewhere."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .. import background

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))
SHELL_SCRIPTS = sorted(p.name for p in BENCH.glob("*.sh"))
OPTIONAL = ("triton", "matplotlib")  # packages some scripts need that a minimal install may lack

# Every entry point and its commands ("" the default, or a script without commands); the README lists them
ENTRY_POINTS = {
    "comm_model.py": [""],
    "compile_engine.py": [""],
    "conv_kernel.py": [""],
    "e2e.py": ["", "first-request"],
    "gpu_parity.py": ["", "stream"],
    "interleaved_ab.py": ["", "bits"],
    "kernel_costs.py": ["", "norm", "sass", "launch"],
    "memory_model.py": [""],
    "minimax_ab.py": [""],
    "profile_decode.py": ["", "video", "host"],
    "ranks.py": ["", "share", "faults", "kept-graphs", "halo", "agreement"],
    "serve_gpu.py": [""],
}


def _load(name: str):
    """A benchmark script as a module, by path (its main is not run)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name[:-3]}", BENCH / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def parity():
    return _load("gpu_parity.py")


def test_the_entry_points_are_the_scripts_and_the_readme_names_each():
    assert set(SCRIPTS) == set(ENTRY_POINTS), "add a new script to ENTRY_POINTS (and benchmarks/README.md)"
    assert SHELL_SCRIPTS == ["gpu_runs.sh"]
    readme = (BENCH / "README.md").read_text()
    for name in [*SCRIPTS, *SHELL_SCRIPTS]:
        assert f"`{name}" in readme, name
        for command in filter(None, ENTRY_POINTS.get(name, [])):
            assert f"`{command}`" in readme, (name, command)


# Scripts run as `python3 benchmarks/NAME.py ARGS` runs them: as __main__, with their folder first on
# sys.path. One child interpreter runs them all (through runpy), one after another: a process per run
# would spend most of its time importing torch again. A run that starts a process group sets the
# variables torchrun would (one rank), and only for itself.
_DRIVER = r"""
import contextlib, io, json, os, runpy, sys
folder, results = sys.argv[1], {}
for key, path, args, env in json.loads(sys.argv[2]):
    out, code, saved = io.StringIO(), None, dict(os.environ)
    os.environ.update(env)
    sys.argv = [path, *args]
    sys.path.insert(0, folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else str(exc.code)
    except ModuleNotFoundError as exc:
        code = f"ModuleNotFoundError {exc.name}: {exc}"
    except BaseException as exc:  # a failing import, argument parser or run: reported, not raised
        code = f"{type(exc).__name__}: {exc}"
    finally:
        sys.path.remove(folder)
        os.environ.clear()
        os.environ.update(saved)
    results[key] = [code, out.getvalue()[-20000:]]
print(json.dumps(results))
"""


def _skipped_for(code) -> str | None:
    if isinstance(code, str) and code.startswith("ModuleNotFoundError") and code.split()[1].split(".")[0] in OPTIONAL:
        return code
    return None


MINIMAX_VARIANTS = "diffusers,vaeshard,vaeshard-tile"
_ONE_RANK = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


def _driven_job(folder: str):
    """The background job (tests/background.py) of `driven`: every --help, then the commands that need no
    GPU at a tiny size on CPU, in one interpreter; (argv, environment)."""
    import socket

    helps = [
        (f"{name} {command}".strip(), str(BENCH / name), [*filter(None, [command]), "--help"], {})
        for name, commands in ENTRY_POINTS.items()
        for command in commands
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    rank = {**_ONE_RANK, "MASTER_PORT": port}
    out = Path(folder)
    tiny = ["--small", "--device", "cpu", "--config", "wan21", "--shape", "1,4,3,4,6"]
    runs = [
        ("host", "profile_decode.py", ["host", "--frames", "2", "--reps", "1"], rank),
        ("halo", "ranks.py", ["halo", "--cpu", "--scale", "40", "--iters", "3"], rank),
        ("agreement", "ranks.py", ["agreement", "--rounds", "20"], rank),
        ("stream", "gpu_parity.py", ["stream", *tiny, "--out", str(out / "stream.jsonl")], {}),
        (
            "bits",
            "interleaved_ab.py",
            ["bits", *tiny, "--modes", "tile", "--concurrent", "2", "--json", str(out / "bits.jsonl")],
            {},
        ),
        ("sass", "kernel_costs.py", ["sass", "--channels", "96"], {}),
        ("families memory", "memory_model.py", ["--config", "cogvideox", "--shape", "1,16,3,8,12", "--top", "1"], {}),
        (
            "minimax ab",
            "minimax_ab.py",
            ["--small", "--reps", "1", "--variants", "diffusers,vaeshard,vaeshard-tile"],
            {},
        ),
    ]
    # rank shares of tiny configs: an image VAE's spatial shards and tiles, MiniMax-H3's tiles (its own
    # tiling is on), LTX-Video's shards (a timestep-conditioned decoder) and a count its latent cannot cover
    share = ["share", "--small", "--device", "cpu", "--reps", "1"]
    for key, config, latent, ranks, more in (
        ("flux1", "flux1", "1,16,8,12", "1,2,4", ["--mode", "spatial,tile"]),
        ("minimax", "minimax_h3", "1,4,7,8,12", "1,2", []),
        ("ltx", "ltx", "1,4,2,4,6", "1,2,8", []),
    ):
        args = [*share, "--config", config, "--latent", latent, "--ranks", ranks, *more]
        runs.append((f"share {key}", "ranks.py", [*args, "--json", str(out / f"share-{key}.json")], {}))
    runs = [(f"run {key}", str(BENCH / name), args, env) for key, name, args, env in runs]
    return [sys.executable, "-c", _DRIVER, str(BENCH), json.dumps([*helps, *runs])], {}


DRIVEN_JOB = background.job("benchmark-scripts", _driven_job)


@pytest.fixture(scope="module")
def driven():
    """The results of `_driven_job`: ({--help key: [code, output]}, its output folder, {run key: ...})."""
    done = background.result(DRIVEN_JOB, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    return (
        {k: v for k, v in results.items() if not k.startswith("run ")},
        Path(background.folder(DRIVEN_JOB)),
        {k[4:]: v for k, v in results.items() if k.startswith("run ")},
    )


HELPS = [f"{name} {command}".strip() for name, commands in ENTRY_POINTS.items() for command in commands]


@pytest.mark.timeout(300)
@pytest.mark.background(DRIVEN_JOB)
@pytest.mark.parametrize("key", HELPS)
def test_every_entry_point_and_command_shows_its_help(driven, key):
    code, output = driven[0][key]
    if reason := _skipped_for(code):
        pytest.skip(f"{key}: {reason}")
    assert code == 0, f"{code}\n{output}"
    assert "usage:" in output and "--help" in output, output


def test_the_shell_stages_parse_and_an_unknown_stage_is_refused(tmp_path):
    done = subprocess.run(["bash", "-n", str(BENCH / "gpu_runs.sh")], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        ["bash", str(BENCH / "gpu_runs.sh"), "nothing", str(tmp_path)], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 2 and "unknown stage nothing" in done.stderr, done.stderr
    # every stage the script's usage names is one its dispatch (the last case statement) takes
    text = (BENCH / "gpu_runs.sh").read_text()
    dispatch = text.rsplit('case "$STAGE" in', 1)[1]
    stages = ("scaling", "headline", "wan22", "kept", "parity", "families", "ab", "shares", "minimax", "stream")
    for stage in (*stages, "versions"):
        assert f"gpu_runs.sh {stage} OUT" in text and stage in dispatch, stage


def _stage(stage: str, subjects: str, **env) -> str:
    """The background job of `gpu_runs.sh STAGE FOLDER SUBJECTS` on this machine, `env` added to the
    environment (FOLDER: the job's own)."""
    return background.job(
        f"gpu-runs-{stage}", lambda folder: (["bash", str(BENCH / "gpu_runs.sh"), stage, folder, subjects], env)
    )


# Each subject's limit bounds a hang, not the work: the jobs run at the lowest priority from the suite's
# start, so their wall time includes the suite's own (two loaded cores starved one past 200 s).
AB_JOB = _stage("ab", "flux1=1,16,8,8@1@1200", DTYPE="float32")
SHARES_JOB = _stage("shares", "flux1=1,16,8,12@1:2@1200", REPS="1", EXTRA="--device cpu --small")


WINDOWS_JOB = background.job(
    "benchmark-windows",
    lambda folder: (
        [sys.executable, str(BENCH / "kernel_costs.py"), "windows", "--device", "cpu", "--frames", "3", "--crop",
         "12,14", "--reps", "1", "--json", os.path.join(folder, "windows.json")],
        {},
    ),
)  # fmt: skip


@pytest.mark.background(WINDOWS_JOB)
def test_the_windows_command_checks_itself_on_the_cpu():
    """`kernel_costs.py windows` at a cropped size on the CPU: every stage's windows in blocks against
    diffusers' own FlexAttention mask (eager), within the fp32 tolerance."""
    done = background.result(WINDOWS_JOB, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((Path(background.folder(WINDOWS_JOB)) / "windows.json").read_text())["rows"]
    assert [r["stage"] for r in rows] == [f"stage {i}" for i in range(1, 6)], rows
    assert all(r["flex_s"] and r["max_abs_diff"] < 1e-5 for r in rows), rows


@pytest.mark.background(AB_JOB)
def test_the_ab_stage_compares_in_one_process():
    """`gpu_runs.sh ab` on the CPU at a tiny size: diffusers' decode and vaeshard's in one process per
    subject, a JSON with both variants' figures, and the table's rows printed last. In fp32: a CPU
    without AVX-512 runs bf16 convolutions hundreds of times slower."""
    done = background.result(AB_JOB, timeout=240)
    out = Path(background.folder(AB_JOB))
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((out / "flux1-1x16x8x8.json").read_text())["rows"][0]
    assert set(row["variants"]) == {"channels-first", "vaeshard-into"}, row
    assert all(v["seconds"] > 0 for v in row["variants"].values())
    assert "flux1 | [1, 16, 8, 8] | vaeshard-into" in done.stdout, done.stdout


@pytest.mark.background(SHARES_JOB)
def test_the_shares_stage_times_each_rank_count():
    """`gpu_runs.sh shares` on the CPU with a tiny config: one rank's share per rank count, a JSON row
    for each, and ranks.py's summary printed last."""
    done = background.result(SHARES_JOB, timeout=240)
    out = Path(background.folder(SHARES_JOB))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((out / "flux1-1x16x8x12.json").read_text())["rows"]
    assert [r["ranks"] for r in rows] == [1, 2] and all(r["median_s"] > 0 for r in rows), rows
    assert done.stdout.splitlines()[-1].startswith("summary flux1 (1, 16, 8, 12) auto: 1 rank:"), done.stdout


@pytest.mark.timeout(300)
@pytest.mark.background(DRIVEN_JOB)
def test_the_cpu_commands_run_at_a_tiny_size(driven):
    _, out, results = driven
    for key in ("host", "halo", "agreement", "stream", "bits"):
        assert results[key][0] in (0, None), (key, results[key])
    assert "1 rank(s)" in results["host"][1] and "ms per latent frame" in results["host"][1]
    assert "full-res" in results["halo"][1] and "latent-level" in results["halo"][1]
    assert "store: median" in results["agreement"][1] and "all-gather: median" in results["agreement"][1]
    # the streamed decode's chunks equal the whole decode, in both tiers, and the writer's frames match
    rows = [json.loads(line) for line in (out / "stream.jsonl").read_text().splitlines()]
    assert [r["check"] for r in rows] == ["stream == decode", "cpu writer == CPU quantisation", "stream == decode"]
    assert all(r["ok"] for r in rows), rows
    # one decode alone, then two processes at once: the same bits (no race on the CPU)
    *decodes, summary = [json.loads(line) for line in (out / "bits.jsonl").read_text().splitlines()]
    assert len(decodes) == 3 and all(b["mode"] == "tile" and len(b["sha256"]) == 64 for b in decodes), decodes
    assert len({b["sha256"] for b in decodes}) == 1 and summary["differ_from_alone"] == 0, summary
    # diffusers' decode and vaeshard's of a real config on the meta device: CogVideoX's one-frame
    # convolutions keep no cache, so vaeshard's peak is the lower one
    code, output = results["families memory"]
    assert code in (0, None), output
    peaks = {who: float(p) for who, p in re.findall(r", (diffusers|vaeshard): peak ([0-9.]+) GiB", output)}
    assert set(peaks) == {"diffusers", "vaeshard"} and peaks["vaeshard"] < peaks["diffusers"], output
    # MiniMax-H3's A/B: the exact tiles bit for bit with diffusers' tiled decode, the default tier close
    code, output = results["minimax ab"]
    assert code in (0, None), output
    rows = dict(
        re.findall(r"\) (diffusers|vaeshard|vaeshard-tile) \| .* \| ([0-9.e+-]+) \| (?:True|False)$", output, re.M)
    )
    assert "True" in output.splitlines()[-1] and float(rows["vaeshard"]) <= 1e-5, output
    code, output = results["sass"]
    if reason := _skipped_for(code):
        pytest.skip(f"kernel_costs.py sass: {reason}")
    assert code in (0, None), output
    assert "rms_norm" in output and "bias + residual" in output, output


@pytest.mark.timeout(300)
@pytest.mark.background(DRIVEN_JOB)
def test_rank_shares_of_every_kind_run_on_cpu_at_a_tiny_size(driven):
    """ranks.py share on tiny configs: one row per rank count and share, each timed where its strategy
    shards or tiles that many ranks, and the count that cannot be sharded said so with its reason."""
    _, out, results = driven
    for key in ("flux1", "minimax", "ltx"):
        code, output = results[f"share {key}"]
        assert code in (0, None), (key, output)
        assert "summary" in output, output
    flux = json.loads((out / "share-flux1.json").read_text())
    assert flux["class"] == "AutoencoderKL" and flux["latent"] == [1, 16, 8, 12] and flux["small"]
    rows = {(r["share"], r["ranks"]): r for r in flux["rows"]}
    assert set(rows) == {(share, n) for share in ("spatial", "tile") for n in (1, 2, 4)}
    assert all(r["median_s"] > 0 and r["peak_gib"] is None for r in rows.values())
    assert [rows["spatial", n]["strategy"] for n in (1, 2, 4)] == ["direct", *["spatial_shard_width"] * 2]
    assert [rows["spatial", n]["axis"] for n in (1, 2, 4)] == [None, "width", "width"]
    assert [rows["tile", n]["tiles"] for n in (1, 2, 4)] == [[4, 4], [2, 4], [1, 4]]
    assert all(rows["tile", n]["strategy"] == "tile" for n in (1, 2, 4))
    # MiniMax-H3 tiles its own decode: auto's share is its tiles'
    minimax = json.loads((out / "share-minimax.json").read_text())["rows"]
    assert [(r["mode"], r["share"], r["ranks"]) for r in minimax] == [("auto", "tile", 1), ("auto", "tile", 2)]
    assert all(r["median_s"] > 0 for r in minimax) and minimax[1]["tiles"][0] < minimax[0]["tiles"][0]
    ltx = json.loads((out / "share-ltx.json").read_text())["rows"]
    assert [r["ranks"] for r in ltx] == [1, 2, 8]
    assert ltx[1]["axis"] == "width" and ltx[1]["median_s"] > 0 and ltx[1]["rank"] == 0
    assert ltx[2]["median_s"] is None and "8 ranks" in ltx[2]["reason"], ltx[2]


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
    # auto's tiles decoded as batches in the fast tier (MiniMax-H3): the fast tier's tolerance
    assert parity.rule_for("tile", False, "bf16", batched=True) == "bf16"
    assert parity.rule_for("tile", False, "fp32", batched=True) == "fp32"
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
            assert r["rule"] == parity.rule_for(r["strategy"], r["exact"], r["dtype"], r["batched"])
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


@pytest.mark.timeout(90)
def test_a_cpu_run_of_a_tiled_by_default_and_a_noise_drawing_family(parity, tmp_path):
    """MiniMax-H3, whose tiling is on by default, in both tiling states: `tile` and `auto` against
    diffusers' tiled decode with it on, `auto` and the spatial modes against its untiled decode with it
    off. LTX-2.5's diffusion decoder: no tile rows (vaeshard refuses `tile`), and the exact tier
    bit-identical, which it is only where both sides draw the same stage-5 noise."""
    out = tmp_path / "parity.jsonl"
    rc = parity.main(
        [
            "--device", "cpu", "--small", "--models", "minimax_h3,ltx2_diffusion_decoder", "--dtypes", "fp32",
            "--modes", "auto,tile,spatial_shard_width", "--out", str(out),
        ]
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rc == 0 and all(r["ok"] for r in rows), rows
    minimax = [(r["mode"], r["reference"]) for r in rows if r["model"] == "minimax_h3"]
    assert minimax == [
        ("auto fast [tiling on]", "tiled"),
        ("auto exact [tiling on]", "tiled"),
        ("tile exact [tiling on]", "tiled"),
        ("auto fast [tiling off]", "untiled"),
        ("auto exact [tiling off]", "untiled"),
        ("spatial_shard_width fast [tiling off]", "untiled"),
        ("spatial_shard_width exact [tiling off]", "untiled"),
    ]
    decoder = [r for r in rows if r["model"] == "ltx2_diffusion_decoder"]
    modes = [f"{mode} {tier}" for mode in ("auto", "spatial_shard_width") for tier in ("fast", "exact")]
    assert [r["mode"] for r in decoder] == modes
    assert all(r["bit_identical"] for r in decoder if r["exact"]), decoder


def test_the_references_of_the_new_classes_differ_where_they_should(parity):
    """The two references MiniMax-H3's rows are judged against are different decodes (its residual
    scales seeded: at diffusers' zeros the decoder's attention would not count), its tiling stays on;
    DC-AE's tile size reaches the latent size its decode tiles by; a noise-drawing decode's inputs
    draw the same noise every time."""
    import diffusers
    import torch

    torch.manual_seed(0)
    cls, config = parity.SMALL_CONFIGS["minimax_h3"]
    vae = parity.seed_zeros(getattr(diffusers, cls)(**config).eval())
    parity.set_tiles(vae, *parity.SMALL_TILES)
    z = torch.randn(*parity.SMALL_SHAPES["minimax_h3"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tiled, untiled = parity.diffusers_decode(vae, z, True), parity.diffusers_decode(vae, z, False)
    assert vae.use_tiling and vae.tile_sample_min_overlap_height == 16
    assert tiled.shape == untiled.shape and (tiled - untiled).abs().max() > 1e-2
    cls, config = parity.SMALL_CONFIGS["dc-ae-f32c32-sana-1.0"]
    dcae = getattr(diffusers, cls)(**config)
    parity.set_tiles(dcae, 256, 192)
    assert (dcae.tile_latent_min_height, dcae.tile_sample_stride_width, dcae.use_tiling) == (64, 192, False)
    cls, config = parity.SMALL_CONFIGS["ltx2_diffusion_decoder"]
    decoder = getattr(diffusers, cls)(**config).eval()
    z = torch.randn(1, 4, 2, 4, 6)
    noise = {"draws": True, "generator": True, "device": torch.device("cpu")}
    with torch.no_grad():
        first, second = (parity.diffusers_decode(decoder, z, False, noise) for _ in range(2))
        torch.manual_seed(3)
        unseeded = decoder.decode(z).sample  # the global RNG's noise of another seed
    assert torch.equal(first, second) and not torch.equal(first, unseeded)


# --- e2e: a fresh process to the closed file ------------------------------------------------------


def _e2e_job(folder: str):
    """`e2e.py` on a saved small Wan VAE and a latent of 9 frames of 48 x 64, on the CPU; the model is
    built in the job's own process (building seeds the global RNG, which the tests running meanwhile use)."""
    args = [
        "--model", f"{folder}/wan21", "--latents", f"{folder}/z.safetensors", "--device", "cpu", "--reps", "1",
        "--out-dir", f"{folder}/runs", "--json", f"{folder}/e2e.json",
    ]  # fmt: skip
    script = f"""
import sys
from safetensors.torch import save_file
from tests.models import build, latent
build("wan21").save_pretrained({folder!r} + "/wan21")
save_file({{"latents": latent((1, 4, 3, 6, 8))}}, {folder!r} + "/z.safetensors")
sys.path.insert(0, {str(BENCH)!r})
import e2e
sys.exit(e2e.main({args!r}))
"""
    return [sys.executable, "-c", script], {}


E2E_JOB = background.job("benchmark-e2e", _e2e_job)


@pytest.mark.timeout(240)
@pytest.mark.background(E2E_JOB)
def test_e2e_times_each_route_from_a_fresh_process_to_the_closed_file():
    import av
    import numpy as np

    done = background.result(E2E_JOB, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    root = Path(background.folder(E2E_JOB))
    report, folder = root / "e2e.json", root / "runs"
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
