"""The `vaeshard` command line, run as a user runs it (subprocesses, CPU, gloo), and its launcher.

Decodes use small seeded VAEs saved with `save_pretrained`; only `demo` builds the real Wan 2.1
config. Every result is compared with the library or diffusers in this process, same weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from argparse import SUPPRESS
from pathlib import Path

import numpy as np
import pytest
import torch

from vaeshard.config import MODES

from .. import background
from ..models import build, latent

SMALL_SHAPE = (1, 4, 3, 6, 8)  # decodes to 9 frames of 48 x 64 with the small Wan 2.1 config


def in_process(*args) -> int:
    """`vaeshard ARGS` run in this process (cli.main): a one-process command without the seconds a new
    interpreter takes to import torch and diffusers."""
    from vaeshard import cli

    return cli.main([str(a) for a in args])


def vaeshard_cli(*args, env=None, timeout=150, cwd=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "vaeshard", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A saved small Wan VAE, a pipeline-style folder holding a small Qwen-Image VAE under vae/,
    a Wan VAE with non-trivial latent statistics, and latents in every supported format."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("cli-assets")
    build("wan21").save_pretrained(root / "wan21")
    build("qwenimage").save_pretrained(root / "pipeline" / "vae")
    _wan_with_stats().save_pretrained(root / "wan21_stats")
    z = latent(SMALL_SHAPE)
    save_file({"latents": z}, root / "z.safetensors")
    torch.save({"latents": z}, root / "z.pt")
    np.save(root / "z.npy", z.numpy())
    save_file({"latents": latent((1, 4, 1, 6, 8), seed=2)}, root / "image.safetensors")
    (root / "config_only").mkdir()
    shutil.copy(root / "wan21" / "config.json", root / "config_only" / "config.json")
    (root / "unet").mkdir()
    (root / "unet" / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    (root / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    (root / "dc").mkdir()
    (root / "dc" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderTiny"}))
    (root / "dc" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    torch.save(latent((1, 5, 3, 6, 8)), root / "wrong_channels.pt")
    torch.save(latent((4, 3, 6, 8)), root / "four_d.pt")
    return root


def _wan_with_stats():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        latents_mean=[0.1, -0.2, 0.3, 0.05],
        latents_std=[1.5, 0.5, 2.0, 0.8],
    ).eval()


def _load_vae(folder):
    from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan

    cls_name = json.loads((Path(folder) / "config.json").read_text())["_class_name"]
    cls = {"AutoencoderKLWan": AutoencoderKLWan, "AutoencoderKLQwenImage": AutoencoderKLQwenImage}[cls_name]
    return cls.from_pretrained(folder).eval()


def _uint8(video_bcthw):
    from vaeshard.cli.io import to_uint8_frames

    return to_uint8_frames(video_bcthw)


@contextlib.contextmanager
def _threads_of_a_rank(nproc: int):
    """This process computes with the thread count of one of `nproc` CPU ranks: a convolution's
    result depends on how its work is split over threads, and bit-exact comparisons need the same split."""
    from vaeshard.cli.launch import cpu_threads_per_rank

    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads_per_rank(nproc))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp"))


# --- help and flags --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_help_lists_the_modes(capsys):
    def help_of(*args) -> str:
        with pytest.raises(SystemExit) as done:
            in_process(*args, "--help")
        assert done.value.code == 0
        return capsys.readouterr().out

    top = help_of()
    for command in ("demo", "decode", "bench", "serve"):
        assert command in top
    decode = help_of("decode")
    assert "{" + ",".join(MODES) + "}" in decode  # argparse's choices list, in MODES order
    assert "RANDOM weights" in decode  # --config
    for mode in MODES:
        assert mode in top


# Every flag of every command, with its choices and default: a change here is a change of the
# command line users script against, so it must be made on purpose (update this list with it).
CONFIGS = ("wan21", "wan22", "qwenimage", "sd15", "sdxl", "flux1", "flux2", "hunyuanvideo15", "qwenimage21", "ltx",
           "ltx2", "hunyuanvideo", "cogvideox", "mochi", "minimax_h3", "dc-ae-f32c32-sana-1.0",
           "kandinsky6_sr", "ltx2_diffusion_decoder")  # fmt: skip
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
TIER_FLAGS = [  # --exact and the FastOptions knobs, the same on decode, serve and bench
    ("--exact", None, False, False),
    ("--cudnn-benchmark", None, False, False),
    ("--cuda-graphs", None, "auto", False),
    ("--keep-cuda-graphs", None, False, False),
    ("--frames-per-step", None, "auto", False),
    ("--max-layer-frames", None, None, False),
    ("--no-triton-convs", None, True, False),
    ("--norm-into-conv", None, "auto", False),
]
EXPECTED_FLAGS = {
    "demo": [
        ("--device", ("cpu", "cuda"), None, False),
        ("--nproc", None, 2, False),
        ("--timeout", None, 300.0, False),
    ],
    "decode": [
        ("--model", None, None, False),  # (one of --model and --config is required)
        ("--config", CONFIGS, None, False),
        ("--subfolder", None, None, False),
        ("--offline", None, False, False),
        ("--dtype", ("bf16", "fp16", "fp32"), None, False),
        ("--device", ("cpu", "cuda"), None, False),
        ("--fps", None, 16, False),
        ("--x264-preset", X264_PRESETS, "veryfast", False),
        ("--preset", X264_PRESETS, SUPPRESS, False),  # (deprecated: --x264-preset)
        *TIER_FLAGS,
        ("--timeout", None, 600.0, False),
        ("latents", None, None, True),
        ("--key", None, "latents", False),
        ("--denormalize", None, False, False),
        ("--decode-timestep", None, None, False),
        ("--seed", None, 0, False),
        ("--nproc", None, None, False),
        ("--mode", ("tile", "auto", "spatial_shard_height", "spatial_shard_width"), "auto", False),
        ("--tile-size", None, None, False),
        ("--tile-stride", None, None, False),
        ("--out", None, None, True),
        ("--quiet", None, False, False),
        ("--timings", None, None, False),
    ],
    "serve": [
        ("--model", None, None, False),  # (one of --model and --config is required)
        ("--config", CONFIGS, None, False),
        ("--subfolder", None, None, False),
        ("--offline", None, False, False),
        ("--dtype", ("bf16", "fp16", "fp32"), None, False),
        ("--device", ("cpu", "cuda"), None, False),
        ("--fps", None, 16, False),
        ("--x264-preset", X264_PRESETS, "veryfast", False),
        ("--preset", X264_PRESETS, SUPPRESS, False),  # (deprecated: --x264-preset)
        *TIER_FLAGS,
        ("--timeout", None, 600.0, False),
        ("--nproc", None, None, False),
        ("--mode", MODES, "auto", False),
        ("--host", None, "127.0.0.1", False),
        ("--port", None, 8000, False),
        ("--api-key", None, None, False),
        ("--max-queue", None, 16, False),
        ("--max-body-mb", None, 64.0, False),
        ("--api-key-file", None, None, False),
        ("--max-connections", None, 128, False),
        ("--max-uploads", None, 4, False),
        ("--header-timeout", None, 10.0, False),
        ("--body-timeout", None, 60.0, False),
        ("--ready-file", None, None, False),
        ("--drain-timeout", None, 120.0, False),
        ("--max-request-timeout", None, 3600.0, False),
    ],
    "bench": [
        ("--model", None, None, False),
        ("--config", CONFIGS, None, False),
        ("--subfolder", None, None, False),
        ("--offline", None, False, False),
        ("--dtype", ("bf16", "fp16", "fp32"), None, False),
        ("--device", ("cpu", "cuda"), None, False),
        *TIER_FLAGS,
        ("--timeout", None, 600.0, False),
        ("--shape", None, None, False),
        ("--subject", ("wan21-480p", "wan21-720p", "wan22-720p"), None, False),
        ("--preset", ("wan21-480p", "wan21-720p", "wan22-720p"), SUPPRESS, False),  # (deprecated: --subject)
        ("--modes", None, ["tile", "auto", "spatial_shard_height", "spatial_shard_width"], False),
        ("--nproc", None, None, False),
        ("--reps", None, 3, False),
        ("--no-ref", None, False, False),
        ("--peak-tflops", None, None, False),
        ("--tflop", None, None, False),
        ("--json", None, None, False),
        ("--plot", None, None, False),
    ],
}


@pytest.mark.timeout(60)
def test_flags_and_choices_are_frozen():
    import argparse

    from vaeshard.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == ["demo", "decode", "serve", "bench"]
    for name, subparser in commands.choices.items():
        actual = [
            (
                a.option_strings[-1] if a.option_strings else a.dest,
                tuple(a.choices) if a.choices else None,
                a.default,
                a.required,
            )
            for a in subparser._actions
            if not isinstance(a, argparse._HelpAction)
        ]
        assert actual == EXPECTED_FLAGS[name], name
    assert tuple(next(row for row in EXPECTED_FLAGS["decode"] if row[0] == "--mode")[1]) == MODES


@pytest.mark.parametrize(
    "args, first",
    [
        (["decode", "z.pt", "--model", "m", "--out", "o.mp4", "--nproc", "0"], "argument --nproc: expected at least 1"),
        (["decode", "z.pt", "--out", "o.mp4"], "one of the arguments --model --config is required"),
        (["bench", "--shape", "1,2"], "argument --shape: expected B,C,T,H,W"),
        (["decodee"], "argument COMMAND: invalid choice: 'decodee'"),
    ],
)
def test_a_usage_mistake_prints_what_is_wrong_first(capsys, args, first):
    with pytest.raises(SystemExit) as done:
        in_process(*args)
    assert done.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    command = "vaeshard" if args[0] == "decodee" else f"vaeshard {args[0]}"
    assert lines[0].startswith(f"{command}: error: {first}"), lines
    assert lines[1:] == [f"(`{command} --help` lists the options)"], lines


# --- demo ------------------------------------------------------------------------------------------


DEMO_JOB = background.job(
    "demo", lambda folder: ([sys.executable, "-m", "vaeshard", "demo"], {"PYTHONUNBUFFERED": "1"})
)


@pytest.mark.timeout(180)
@pytest.mark.background(DEMO_JOB)
def test_demo_passes_every_mode():
    run = background.result(DEMO_JOB, timeout=170)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RANDOM weights" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.split() and line.split()[0] in MODES]
    assert [r.split()[0] for r in rows] == list(MODES)
    assert all(r.rstrip().endswith("PASS") for r in rows), run.stdout
    assert "all checks passed" in run.stdout


# --- decode ----------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_decode_writes_an_mp4(assets, tmp_path):
    import av

    out = tmp_path / "video.mp4"
    # two ranks write it as the frames come (the launcher starts them from this process)
    code = in_process("decode", assets / "z.safetensors", "--model", assets / "wan21", "--device", "cpu",
                      "--nproc", 2, "--fps", 8, "--out", out)  # fmt: skip
    assert code == 0
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 9
    assert frames[0].shape == (48, 64, 3)
    with torch.no_grad():
        expected = _uint8(_load_vae(assets / "wan21").decode(latent(SMALL_SHAPE)).sample)[0]
    error = abs(torch.from_numpy(frames[4]).float() - torch.from_numpy(expected[4]).float()).mean()
    assert error < 12, error  # lossy H.264, but the same picture
    assert _leftovers(tmp_path) == []


@pytest.mark.timeout(120)
def test_decode_tile_mode_writes_png_frames_equal_to_diffusers_tiled_decode(assets, tmp_path, capfd):
    from PIL import Image

    out = tmp_path / "frames"
    code = in_process(
        "decode", assets / "z.pt", "--model", assets / "wan21", "--device", "cpu", "--nproc", 2,
        "--mode", "tile", "--tile-size", 32, "--tile-stride", 24, "--out", out, "--quiet",
    )  # fmt: skip
    assert code == 0
    printed = capfd.readouterr().out
    assert printed.startswith(f"wrote {out}: ") and printed.count("\n") == 1  # --quiet: only what was written
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"{t:05d}.png" for t in range(9)]
    vae = build("wan21", tile_sample=(32, 24))
    with torch.no_grad(), _threads_of_a_rank(2):
        reference = vae.tiled_decode(latent(SMALL_SHAPE)).sample  # several tiles: 6 x 8 latent, 4-row tiles
    expected = _uint8(reference)[0]
    for t, name in enumerate(names):
        got = torch.from_numpy(np.array(Image.open(out / name).convert("RGB")))
        assert torch.equal(got, torch.from_numpy(expected[t])), name


@pytest.mark.timeout(120)
# both frame options passed on, and the default: each value's effect is tests/test_layers/test_fast.py's
@pytest.mark.parametrize("frames_per_step,max_layer_frames", [(2, 2), ("auto", None)])
def test_decode_tensor_is_identical_to_the_library_in_process(assets, tmp_path, frames_per_step, max_layer_frames):
    from PIL import Image
    from safetensors.torch import load_file

    import vaeshard

    # the default's output, PNG frames, is written chunk by chunk as the decoder steps (1 + 1 + 1 frames)
    frames = max_layer_frames is None
    out = tmp_path / ("frames" if frames else "video.safetensors")
    layers = [] if max_layer_frames is None else ["--max-layer-frames", max_layer_frames]
    code = in_process(
        "decode",
        assets / "z.npy",
        "--model",
        assets / "wan21",
        "--device",
        "cpu",
        "--out",
        out,
        "--quiet",
        "--frames-per-step",
        frames_per_step,
        "--timings",
        tmp_path / "timings.json",
        *layers,
    )
    assert code == 0
    vae = vaeshard.parallelize(
        _load_vae(assets / "wan21"),
        fast=vaeshard.FastOptions(frames_per_step=frames_per_step, max_layer_frames=max_layer_frames),
    )
    expected = vae.decode(latent(SMALL_SHAPE)).sample
    assert expected.std() > 0.01
    if frames:
        names = sorted(p.name for p in out.iterdir())
        assert names == [f"{t:05d}.png" for t in range(9)]
        for t, name in enumerate(names):
            got = torch.from_numpy(np.array(Image.open(out / name).convert("RGB")))
            assert torch.equal(got, torch.from_numpy(_uint8(expected)[0, t])), name
    else:
        assert torch.equal(load_file(out)["sample"], expected)
    stamps = json.loads((tmp_path / "timings.json").read_text())
    assert stamps["loaded"] < stamps["decoded"] <= stamps["written"] < time.time()


@pytest.mark.timeout(120)
def test_decode_denormalize_matches_the_wan_pipeline_formula(assets, tmp_path):
    out = tmp_path / "video.pt"
    code = in_process(
        "decode", assets / "z.safetensors", "--model", assets / "wan21_stats", "--device", "cpu",
        "--denormalize", "--out", out, "--quiet",
    )  # fmt: skip
    assert code == 0
    got = torch.load(out)
    vae = _load_vae(assets / "wan21_stats")
    z = latent(SMALL_SHAPE).to(vae.dtype)
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
    with torch.no_grad():
        expected = vae.decode(z / inv_std + mean).sample
        plain = vae.decode(z).sample
    assert (got - expected).abs().max() <= 1e-5  # the library's default fast tier, CPU fp32 tolerance
    assert (got - plain).abs().max() > 1e-2  # the statistics made a difference


@pytest.mark.timeout(120)
def test_decode_single_png_from_a_pipeline_folder(assets, tmp_path, capfd):
    from PIL import Image

    out = tmp_path / "image.png"
    # the pipeline folder has the VAE under vae/, found without --subfolder; auto shards over 2 ranks
    code = in_process(
        "decode", assets / "image.safetensors", "--model", assets / "pipeline", "--device", "cpu", "--nproc", 2,
        "--out", out,
    )  # fmt: skip
    assert code == 0
    assert "spatial_shard_width on 2 rank(s)" in capfd.readouterr().out
    image = Image.open(out)
    assert image.size == (64, 48) and image.mode == "RGB"
    with torch.no_grad():
        reference = _load_vae(assets / "pipeline" / "vae").decode(latent((1, 4, 1, 6, 8), seed=2)).sample
    got = torch.from_numpy(np.array(image)).float()
    assert (got - torch.from_numpy(_uint8(reference)[0, 0]).float()).abs().max() <= 1  # within 1e-5 before rounding


@pytest.mark.timeout(120)
def test_decode_config_decodes_with_the_random_weights_diffusers_builds(tmp_path, capfd):
    # no model folder: the Wan 2.1 VAE's real config, seeded random weights, as diffusers builds it
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file, save_file

    from ..parity import CPU_FP32_REAL_SIZES, assert_close

    z = latent((1, 16, 2, 4, 4))
    save_file({"latents": z}, tmp_path / "z.safetensors")
    out, timings = tmp_path / "video.safetensors", tmp_path / "timings.json"
    code = in_process("decode", tmp_path / "z.safetensors", "--config", "wan21", "--device", "cpu", "--out", out,
                      "--timings", timings)  # fmt: skip
    assert code == 0
    err = capfd.readouterr().err
    assert "wan21 config (AutoencoderKLWan), random weights (torch.manual_seed(0)): RANDOM weights" in err
    assert "latent frame" in err  # the progress bar's unit
    torch.manual_seed(0)
    vae = AutoencoderKLWan().eval()
    with torch.no_grad():
        want = vae.decode(z).sample
    assert_close(load_file(out)["sample"], want, CPU_FP32_REAL_SIZES, "decode --config wan21")
    stamps = json.loads(timings.read_text())
    assert stamps["started"] <= stamps["loaded"] < stamps["decoded"] <= stamps["written"] < time.time()


@pytest.mark.timeout(150)
def test_decode_under_torchrun_uses_its_ranks(assets, tmp_path):
    out = tmp_path / "video.safetensors"
    run = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "vaeshard", "decode", str(assets / "z.safetensors"),
            "--model", str(assets / "wan21"), "--device", "cpu", "--mode", "spatial_shard_height", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=140, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("wrote ") == 1  # rank 0 only
    assert "spatial_shard_height on 2 rank(s)" in run.stdout
    from safetensors.torch import load_file

    with torch.no_grad():
        reference = _load_vae(assets / "wan21").decode(latent(SMALL_SHAPE)).sample
    assert (load_file(out)["sample"] - reference).abs().max() <= 1e-5


ERROR_CASES = [
    # id, arguments (LATENTS first; {a} = assets folder), output name, expected words in the message
    ("missing-latents", ["{a}/nothing.safetensors", "--model", "{a}/wan21"], "o.mp4", "does not exist"),
    ("wrong-key", ["{a}/z.safetensors", "--key", "noise", "--model", "{a}/wan21"], "o.mp4", "no tensor named 'noise'"),
    ("wrong-key-pt", ["{a}/z.pt", "--key", "noise", "--model", "{a}/wan21"], "o.mp4", "without the key 'noise'"),
    ("wrong-channels", ["{a}/wrong_channels.pt", "--model", "{a}/wan21"], "o.mp4", "expects 4"),
    ("not-5d", ["{a}/four_d.pt", "--model", "{a}/wan21"], "o.mp4", "5-D"),
    ("unknown-folder", ["{a}/z.safetensors", "--model", "{a}/no_such_model"], "o.mp4", "does not exist"),
    ("folder-without-config", ["{a}/z.safetensors", "--model", "{a}"], "o.mp4", "no config.json"),
    ("folder-without-weights", ["{a}/z.safetensors", "--model", "{a}/config_only"], "o.mp4", "no weights"),
    ("not-a-vae", ["{a}/z.safetensors", "--model", "{a}/unet"], "o.mp4", "vaeshard decodes AutoencoderKLWan"),
    ("unsupported-vae", ["{a}/z.safetensors", "--model", "{a}/dc"], "o.mp4", "is an AutoencoderTiny: vaeshard"),
    ("config-wrong-channels", ["{a}/z.safetensors", "--config", "wan21"], "o.mp4", "expects 16"),
    (
        "tile-stride-without-size",
        ["{a}/z.safetensors", "--model", "{a}/wan21", "--tile-stride", "24"],
        "o.mp4",
        "go together",
    ),
    ("hub-id-offline", ["{a}/z.safetensors", "--model", "someone/some-vae"], "o.mp4", "cannot be reached"),
    (
        "more-ranks-than-gpus",
        ["{a}/z.safetensors", "--model", "{a}/wan21", "--device", "cuda", "--nproc", "64"],
        "o.mp4",
        "GPU",
    ),
    ("unsupported-output", ["{a}/z.safetensors", "--model", "{a}/wan21"], "o.gif", "unsupported suffix"),
    ("png-of-a-video", ["{a}/z.safetensors", "--model", "{a}/wan21"], "o.png", "9 frames"),
]


def test_messages_put_an_before_a_vowel_sound():
    from vaeshard.cli.io import with_article

    said = {n: with_article(n) for n in ("AutoencoderDC", "UNet2DConditionModel", "int", "dict", "ndarray", "SDXL")}
    assert list(said.values()) == [
        "an AutoencoderDC", "a UNet2DConditionModel", "an int", "a dict", "an ndarray", "an SDXL"
    ]  # fmt: skip


# checked in this process (the command's `main`): every case but the Hub one fails before any worker
# starts; the Hub case runs as a separate command, whose hub client reads HF_ENDPOINT when it starts
IN_PROCESS = {c[0] for c in ERROR_CASES} - {"hub-id-offline"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_decode_errors_are_one_line_exit_2_and_write_nothing(assets, tmp_path, case, capfd, monkeypatch):
    name, arguments, out_name, words = case
    out = tmp_path / out_name
    args = [a.replace("{a}", str(assets)) for a in arguments]
    # no network: the Hub endpoint refuses connections and the cache is empty
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf-home")}
    if name in IN_PROCESS:
        from vaeshard.cli import main

        for key, value in env.items():
            monkeypatch.setenv(key, value)
        capfd.readouterr()
        code = main(["decode", *args, "--out", str(out)])
        captured = capfd.readouterr()
        returncode, stdout, stderr = code, captured.out, captured.err
    else:
        run = vaeshard_cli("decode", *args, "--out", out, env=env, timeout=50)
        returncode, stdout, stderr = run.returncode, run.stdout, run.stderr
    assert returncode == 2, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("vaeshard: error: ") and words in lines[0], lines[0]
    assert "Traceback" not in stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "hf-home"] == []


# --- bench -----------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_bench_writes_json_and_plot(assets, tmp_path):
    from PIL import Image

    report, figure = tmp_path / "bench.json", tmp_path / "bench.png"
    run = vaeshard_cli(
        "bench", "--model", assets / "wan21", "--shape", "1,4,2,6,8", "--device", "cpu", "--nproc", "1,2",
        "--modes", "auto", "--reps", 2, "--peak-tflops", 1, "--json", report, "--plot", figure, timeout=170,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "vs diffusers" in run.stdout and "spatial_shard_width" in run.stdout  # the table
    data = json.loads(report.read_text())
    for point in (data["reference"], *data["rows"]):  # the fastest and slowest timed decode beside each median
        low, high = min(point["seconds_reps"]), max(point["seconds_reps"])
        assert len(point["seconds_reps"]) == 2 and low <= point["seconds"] <= high
        assert re.search(rf"{point['seconds']:.3f} +{low:.3f}-{high:.3f} ", run.stdout), run.stdout
        assert f"{point['seconds']:.3f} s (min {low:.3f}, max {high:.3f})" in run.stderr
    assert [(r["mode"], r["nproc"]) for r in data["rows"]] == [("auto", 1), ("auto", 2)]
    assert data["reference"]["seconds"] > 0 and data["reference"]["out_shape"] == [1, 3, 5, 48, 64]
    assert data["flops"] > 0 and data["flops_source"] == "FlopCounterMode"
    for row in data["rows"]:
        assert row["seconds"] > 0 and len(row["peak_bytes_per_rank"]) == row["nproc"]
        assert row["speedup_vs_diffusers"] > 0 and 0 < row["utilisation"]
        assert row["max_abs_diff"] <= 1e-5 and row["reason"]
    assert data["rows"][0]["strategy"] == "direct"
    one, two = (r["seconds"] for r in data["rows"])
    assert data["rows"][0]["speedup_vs_1_rank"] == 1.0 and data["rows"][0]["scaling_efficiency"] == 1.0
    assert data["rows"][1]["speedup_vs_1_rank"] == pytest.approx(one / two)
    assert data["rows"][1]["scaling_efficiency"] == pytest.approx(one / two / 2)
    assert "vs 1 rank" in run.stdout
    auto2 = data["rows"][1]
    assert auto2["strategy"] == "spatial_shard_width" and auto2["max_abs_diff"] > 0  # sharded, real values compared
    env = data["environment"]
    for key in ("torch", "diffusers", "cuda", "cudnn", "gpu_count", "gpu_name", "date", "command"):
        assert key in env
    assert env["command"][1:3] == ["bench", "--model"]
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size[0] > 600


@pytest.mark.parametrize("flag", ["--subject", "--preset"])
def test_bench_subject_on_cpu_warns_that_it_takes_hours(monkeypatch, capfd, flag):
    from vaeshard.cli import bench

    def interrupted(*args, **kwargs):  # (the user stops it: nothing is decoded here)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", interrupted)
    assert in_process("bench", flag, "wan21-720p", "--device", "cpu") == 130
    lines = capfd.readouterr().err.splitlines()
    if flag == "--preset":  # the old spelling still works for one release, and says what replaces it
        deprecated = lines.pop(0)
        assert deprecated == (
            "vaeshard bench: warning: --preset is deprecated and will be removed in vaeshard 0.4: use --subject"
        ), deprecated
    warning = lines[0]
    assert warning.startswith("[bench] warning: --subject wan21-720p on CPU takes hours"), warning
    assert warning.endswith("for a quick CPU run: --config wan21 --shape 1,16,3,12,16"), warning


@pytest.mark.parametrize("command", ["decode", "serve"])
def test_the_x264_preset_flag_and_its_deprecated_spelling(capsys, command):
    from vaeshard.cli import build_parser

    parser = build_parser()
    head = [command, *(["z.pt", "--out", "o.mp4"] if command == "decode" else []), "--config", "wan21"]
    assert parser.parse_args(head).x264_preset == "veryfast"
    assert parser.parse_args([*head, "--x264-preset", "slow"]).x264_preset == "slow"
    assert capsys.readouterr().err == ""
    assert parser.parse_args([*head, "--preset", "slower"]).x264_preset == "slower"
    assert capsys.readouterr().err == (
        f"vaeshard {command}: warning: --preset is deprecated and will be removed in vaeshard 0.4: use --x264-preset\n"
    )
    with pytest.raises(SystemExit):  # the old spelling checks its value as the new one does
        parser.parse_args([*head, "--preset", "fastest"])
    assert "argument --preset: invalid choice: 'fastest'" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_bench_refuses_a_shape_the_vae_cannot_decode(assets, capfd):
    code = in_process("bench", "--model", assets / "wan21", "--shape", "1,16,2,6,8", "--device", "cpu")
    err = capfd.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [err.strip()]
    assert "expects 4" in err


# --- launcher --------------------------------------------------------------------------------------


def _rank_fails_while_peer_waits(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        raise RuntimeError("rank 1 broke")
    dist.barrier()  # rank 0 would wait here until the group timeout
    return "unreachable"


def _rank_dies(ctx):
    ctx.barrier()  # the group is whole: rank 1 then only sleeps, and rank 0's exit is the one failure
    if ctx.rank == 0:
        os._exit(3)
    time.sleep(600)


def _hangs(ctx):
    time.sleep(600)


class _ReportedLate(RuntimeError):
    """An error whose report reaches the launcher after a peer's (as a real one's may: the queue's
    feeder threads race): while the launcher describes it, its rank's connections close, so the peer
    fails, and its message is ready only once the peer is reporting (`reported`)."""

    def __init__(self, reported):
        super().__init__()
        self.reported = reported

    def __str__(self):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()  # rank 1's barrier fails now, after this failure
        self.reported.wait(60)
        return "rank 0 broke"


def _rank_breaks_and_its_peer_reports_first(ctx, reported):
    import torch.distributed as dist

    ctx.barrier()
    if ctx.rank == 0:
        raise _ReportedLate(reported)
    try:
        dist.barrier()
    finally:
        reported.set()  # (as rank 1's own failure is being reported)


def _echo(ctx, value):
    return {"rank": ctx.rank, "world": ctx.world, "value": value, "tensor": torch.full((2,), float(ctx.rank))}


@pytest.mark.timeout(90)
def test_launch_returns_values_in_rank_order():
    from vaeshard.cli import launch

    values = launch.run(_echo, 2, "x", timeout=80)
    assert [v["rank"] for v in values] == [0, 1] and all(v["world"] == 2 and v["value"] == "x" for v in values)
    assert torch.equal(values[1]["tensor"], torch.ones(2))


def _writes_and_reads(ctx, name):
    print(f"rank {ctx.rank} writes here", flush=True)
    return os.environ.get(name)


@pytest.mark.timeout(120)
def test_ranks_write_to_the_callers_output_and_see_its_environment(capfd, monkeypatch):
    """Ranks are forked from the launcher's forkserver, which imported torch and diffusers once: each
    writes where the caller's output goes at the launch (here this test's capture, opened after the
    forkserver started), and a variable the caller set after the forkserver started reaches them (they
    are spawned then). CUDA ranks are forked where a forked probe can start CUDA (this CPU build of
    torch: never a bad fork), else spawned; the variable the forkserver sets for itself (torch's
    NVML-based device count) is the launcher's again in a rank."""
    from vaeshard.cli import launch, processes

    launch.prestart()  # the forkserver runs (started here, or by an earlier launch of this process)
    assert processes.rank_context().get_start_method() == "forkserver"
    monkeypatch.setattr(processes, "_cuda_forks", None)  # asked anew of a probe
    assert processes.rank_context(device="cuda").get_start_method() == "forkserver"
    server = processes._cuda_forks[0]
    monkeypatch.setattr(processes, "_cuda_forks", (server, False))  # a forkserver whose forks cannot start CUDA
    assert processes.rank_context(device="cuda").get_start_method() == "spawn"
    assert launch.run(_writes_and_reads, 2, "VAESHARD_TEST_MARK", timeout=80) == [None, None]
    assert launch.run(_writes_and_reads, 1, "PYTORCH_NVML_BASED_CUDA_CHECK", timeout=80) == [None]
    out = capfd.readouterr().out
    assert "rank 0 writes here" in out and "rank 1 writes here" in out, out
    monkeypatch.setenv("VAESHARD_TEST_MARK", "set later")
    assert processes.rank_context().get_start_method() == "spawn"
    assert launch.run(_writes_and_reads, 1, "VAESHARD_TEST_MARK", timeout=80) == ["set later"]
    assert "rank 0 writes here" in capfd.readouterr().out


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "fn, words", [(_rank_fails_while_peer_waits, "rank 1 broke"), (_rank_dies, "exited with code 3")]
)
def test_launch_stops_every_rank_when_one_fails(fn, words):
    from vaeshard.cli import launch

    t0 = time.monotonic()
    with pytest.raises(launch.WorkerFailed) as info:
        launch.run(fn, 2, timeout=80, group_timeout=300)
    assert words in str(info.value)
    assert time.monotonic() - t0 < 40  # far below the group timeout: the waiting rank was killed


@pytest.mark.timeout(90)
def test_launch_names_the_rank_that_failed_first():
    """Rank 0 fails and closes its connections; rank 1's collective then fails and its report reaches
    the launcher first. The launcher names rank 0's failure, the cause, not rank 1's lost connection."""
    import multiprocessing

    from vaeshard.cli import launch

    reported = multiprocessing.get_context("spawn").Event()
    with pytest.raises(launch.WorkerFailed) as info:
        launch.run(_rank_breaks_and_its_peer_reports_first, 2, reported, timeout=80, group_timeout=60)
    assert "rank 0 failed" in str(info.value) and "rank 0 broke" in str(info.value), str(info.value)


@pytest.mark.timeout(90)
def test_launch_kills_everything_at_the_deadline():
    import multiprocessing

    from vaeshard.cli import launch

    before = set(multiprocessing.active_children())  # e.g. rank pools other tests keep alive
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchTimeout):
        launch.run(_hangs, 2, timeout=4)
    assert time.monotonic() - t0 < 36
    assert set(multiprocessing.active_children()) - before == set()


def test_decode_passes_the_timestep_and_seed_of_a_noisy_ltx_decoder(tmp_path, capfd):
    # LTX-Video's timestep-conditioned decoder with noise, on two ranks: the file equals diffusers'
    # decode for that timestep and seed; without --decode-timestep the command says what to pass
    from safetensors.torch import load_file, save_file

    from ..models import BUILDERS

    vae = BUILDERS["ltx"]()
    vae.save_pretrained(tmp_path / "ltx")
    z = latent((1, 4, 2, 5, 7))
    save_file({"latents": z}, tmp_path / "z.safetensors")
    out = tmp_path / "video.safetensors"
    common = ["decode", tmp_path / "z.safetensors", "--model", tmp_path / "ltx", "--device", "cpu", "--quiet"]
    run = vaeshard_cli(*common, "--out", out, "--decode-timestep", "0.05", "--seed", "7", "--nproc", "2")
    assert run.returncode == 0, run.stderr
    torch.manual_seed(7)
    with torch.no_grad():
        want = vae.decode(z, torch.tensor([0.05])).sample
    got = load_file(out)["sample"]
    assert got.shape == want.shape and (got - want).abs().max().item() <= 1e-5
    assert in_process(*common, "--out", tmp_path / "other.safetensors") == 2
    assert "--decode-timestep" in capfd.readouterr().err
    assert not (tmp_path / "other.safetensors").exists()


@pytest.mark.timeout(120)
def test_decode_writes_minimax_h3_frames_in_its_imagenet_pixel_convention(tmp_path, monkeypatch):
    # MiniMax-H3 decodes ImageNet-normalised RGB over a [0, 1] base (diffusers' class text: a pipeline
    # applies sample * std + mean, then clamps to [0, 1]); its PNG frames are that, not [-1, 1] samples.
    # `--config minimax_h3` builds the tiny test config here (the real one has 2.4B parameters).
    from PIL import Image
    from safetensors.torch import save_file

    import vaeshard
    from vaeshard.families import tiny_configs

    tiny = tiny_configs()["minimax_h3"]
    monkeypatch.setattr(vaeshard, "named_configs", lambda: {"minimax_h3": tiny})
    z = latent((1, 4, 2, 4, 6))
    save_file({"latents": z}, tmp_path / "z.safetensors")
    out = tmp_path / "frames"
    code = in_process(
        "decode", tmp_path / "z.safetensors", "--config", "minimax_h3", "--device", "cpu", "--exact",
        "--out", out, "--quiet",
    )  # fmt: skip
    assert code == 0
    torch.manual_seed(0)  # as the command builds a named config
    vae = getattr(__import__("diffusers"), tiny[0])(**tiny[1]).eval()
    with torch.no_grad():
        sample = vae.decode(z).sample[0].numpy()  # (C, T, H, W), tiled as the VAE is configured
    mean = np.array([0.485, 0.456, 0.406]).reshape(3, 1, 1, 1)
    std = np.array([0.229, 0.224, 0.225]).reshape(3, 1, 1, 1)
    want = np.round(np.clip(sample * std + mean, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 3, 0)
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == want.shape[0]
    for t, name in enumerate(names):
        got = np.array(Image.open(out / name).convert("RGB")).astype(int)
        assert np.abs(got - want[t].astype(int)).max() <= 1, name  # fp64 here, fp32 in the writer: one step at most
    plain = np.round(np.clip(sample / 2 + 0.5, 0, 1) * 255).astype(int).transpose(1, 2, 3, 0)
    assert np.abs(plain - want.astype(int)).max() > 8  # the two conventions differ visibly on this latent


def test_decode_of_a_minimax_h3_folder_without_accelerate_says_what_to_install(tmp_path, monkeypatch, capfd):
    # diffusers loads a class that keeps modules in fp32 only through accelerate; without it the command
    # says so (its own error named low_cpu_mem_usage, which the user never set)
    import importlib.util

    from safetensors.torch import save_file

    build("minimax_h3").save_pretrained(tmp_path / "h3")
    save_file({"latents": latent((1, 4, 2, 4, 6))}, tmp_path / "z.safetensors")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else find_spec(name, *a)
    )
    code = in_process(
        "decode", tmp_path / "z.safetensors", "--model", tmp_path / "h3", "--device", "cpu", "--out", tmp_path / "o.pt"
    )
    assert code == 2
    err = capfd.readouterr().err
    assert "pip install accelerate" in err and "AutoencoderKLMiniMaxH3" in err, err
    assert not (tmp_path / "o.pt").exists()
