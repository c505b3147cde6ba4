"""`vaeshard bench --e2e`: the time a user waits, from a fresh process to the closed video file.

Three routes over the same local model folder and latent file, each in fresh processes, interleaved
rep by rep:
- cold vaeshard: `vaeshard decode LATENTS --model DIR --out X.mp4` as a user runs it (stamps from
  its `--timings` file split the wall time into load, first decode, and the rest of the write);
- plain diffusers, the route a user would write: `from_pretrained`, `vae.decode`, the pipeline's
  `VideoProcessor.postprocess_video` and `diffusers.utils.export_to_video`;
- warm vaeshard, in one process after a first request: `vae.decode` alone, the decode then the
  whole video encoded, and the decode streamed into the writer (encode overlapped), with each
  one's peak memory.
A route's time is from its launch to its closed file (`to_file_s`, what the targets count); the
process's exit after it is shown apart.
`python -m vaeshard.cli.e2e diffusers|warm ...` are the children; `run_e2e` the parent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

GIB = 1024**3
CHILD_TIMEOUT_S = 900  # one route's fresh process: far above a 720p decode's, so a stuck one ends the run


# --- the parent ------------------------------------------------------------------------------------


def prepare(model, shape, folder: Path, dtype: str) -> tuple[str, str]:
    """A named config's random-weight model saved as a local folder, and a seeded latent file: the
    e2e routes load both from disk as users do. Returns (model folder, latent file)."""
    import torch
    from safetensors.torch import save_file

    from .bench import make_latent, torch_dtype

    model_dir, latents = folder / "model", folder / "latents.safetensors"
    model.load(dtype=torch_dtype(dtype)).save_pretrained(model_dir)
    save_file({"latents": make_latent(shape).to(torch.float32)}, latents)
    return str(model_dir), str(latents)


def run_e2e(
    model_dir: str, latents: str, folder: Path, *, dtype: str, fps: int, reps: int, nproc: int, device: str, log
) -> dict:
    """Every route `reps` times (cold ones interleaved, each a fresh process), then the warm child."""
    exe = [sys.executable]
    rows: dict[str, list[dict]] = {"vaeshard": [], "diffusers": []}
    for rep in range(reps):
        for route in ("vaeshard", "diffusers"):
            out = folder / f"{route}.mp4"
            stamps = folder / f"{route}-{rep}.json"
            if route == "vaeshard":
                cmd = [*exe, "-m", "vaeshard", "decode", latents, "--model", model_dir, "--out", str(out)]
                cmd += ["--fps", str(fps), "--dtype", dtype, "--device", device, "--quiet", "--timings", str(stamps)]
                cmd += ["--nproc", str(nproc)] if nproc > 1 else []
            else:
                cmd = [*exe, "-m", "vaeshard.cli.e2e", "diffusers", latents, "--model", model_dir]
                cmd += ["--out", str(out), "--fps", str(fps), "--dtype", dtype, "--device", device]
                cmd += ["--timings", str(stamps)]
            row = _timed(cmd, stamps)
            row["bytes"] = out.stat().st_size
            rows[route].append(row)
            log(f"e2e {route} rep {rep + 1}/{reps}: {row['wall_s']:.2f} s")
    warm_json = folder / "warm.json"
    cmd = [*exe, "-m", "vaeshard.cli.e2e", "warm", latents, "--model", model_dir, "--out", str(folder / "warm.mp4")]
    cmd += ["--fps", str(fps), "--dtype", dtype, "--device", device, "--reps", str(reps), "--timings", str(warm_json)]
    _check_run(cmd)
    warm = json.loads(warm_json.read_text())
    log("e2e warm: " + ", ".join(f"{k} {v:.2f} s" for k, v in warm["median_s"].items()))
    return summarize(rows, warm)


def _timed(cmd: list[str], stamps: Path) -> dict:
    launched = time.time()
    _check_run(cmd)
    wall = time.time() - launched
    t = json.loads(stamps.read_text())
    return {
        "wall_s": wall,
        "load_s": t["loaded"] - launched,
        "decode_s": t["decoded"] - t["loaded"],
        "encode_s": t["written"] - t["decoded"],
        "to_file_s": t["written"] - launched,  # what the targets count: a fresh process to the closed file
        "exit_s": launched + wall - t["written"],
        **({"encoder": t["encoder"]} if "encoder" in t else {}),
    }


def _check_run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)} did not finish within {CHILD_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-4000:]}")


def summarize(rows: dict[str, list[dict]], warm: dict) -> dict:
    """Medians per route and phase, and the ratios the targets are stated in."""
    med = {
        route: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], float)}
        for route, rs in rows.items()
    }
    w = warm["median_s"]
    return {
        "rows": rows,
        "median": med,
        "warm": warm,
        "ratios": {
            "cold_over_warm_decode_then_encode": med["vaeshard"]["to_file_s"] / w["decode_then_encode"],
            "diffusers_over_vaeshard_cold": med["diffusers"]["to_file_s"] / med["vaeshard"]["to_file_s"],
            "warm_streamed_over_warm_decode": w["streamed"] / w["decode"],
            **(
                {"streamed_peak_over_decode_peak": warm["peak_gib"]["streamed"] / warm["peak_gib"]["decode"]}
                if warm["peak_gib"]
                else {}
            ),
        },
    }


def table(result: dict) -> str:
    lines = ["route              to file s  load s  decode s  encode s  exit s", "-" * 64]
    for route, m in result["median"].items():
        lines.append(
            f"{route + ' (cold)':<18} {m['to_file_s']:9.2f} {m['load_s']:7.2f} {m['decode_s']:9.2f} "
            f"{m['encode_s']:9.2f} {m['exit_s']:7.2f}"
        )
    w, peak = result["warm"]["median_s"], result["warm"]["peak_gib"]
    for name in ("decode", "decode_then_encode", "streamed"):
        lines.append(f"warm {name:<18} {w[name]:7.2f}" + (f"  peak {peak[name]:.2f} GiB" if peak else ""))
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return "\n".join(lines)


def command(args) -> int:
    """`vaeshard bench --e2e`: check the arguments, prepare the model folder and latent where a named
    config is given, run the routes, print the table (and write the JSON)."""
    import tempfile

    from . import io
    from .io import InputError
    from .placement import pick_device
    from .report import bench_log

    if args.nproc is not None and len(args.nproc) != 1:
        raise InputError("--e2e measures one rank count: give one --nproc")
    if args.config is not None:
        if args.shape is None or args.latents is not None:
            raise InputError("--e2e with --config needs --shape B,C,T,H,W (its latent is made and saved), no --latents")
        model = io.named_model(args.config)
    elif args.model is not None:
        if args.latents is None or args.shape is not None:
            raise InputError("--e2e with --model needs --latents FILE (and no --shape): the routes load both from disk")
        model = io.resolve_model(args.model, args.subfolder, offline=True)
        if model.path is None or not Path(model.path).is_dir():
            raise InputError("--e2e loads the model from a local folder: give --model a folder")
    else:
        raise InputError("--e2e needs --config NAME --shape B,C,T,H,W, or --model DIR --latents FILE")
    if model.latent_ndim() != 5:
        raise InputError("--e2e writes an MP4: it needs a video VAE")
    device = pick_device(args.device, 1)
    folder = Path(args.out_dir or tempfile.mkdtemp(prefix="vaeshard-e2e-"))
    folder.mkdir(parents=True, exist_ok=True)
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    if args.config is not None:
        io.check_latent_shape(args.shape, model, source=f"latent shape {tuple(args.shape)}")
        model_dir, latents = prepare(model, args.shape, folder, dtype)
    else:
        model_dir, latents = model.path, args.latents
        io.check_latents(io.load_latents(latents), model, source=f"latents in {latents!r}")
    nproc = args.nproc[0] if args.nproc else 1
    result = run_e2e(
        model_dir,
        latents,
        folder,
        dtype=dtype,
        fps=args.fps,
        reps=args.reps,
        nproc=nproc,
        device=device,
        log=bench_log,
    )
    print(table(result), flush=True)
    if args.json:
        from .bench import environment

        Path(args.json).write_text(json.dumps({"environment": environment(device), **result}, indent=1))
        print(f"wrote {args.json}")
    return 0


# --- the children ----------------------------------------------------------------------------------


def _diffusers_route(args) -> None:
    """The plain route, as a user writes it (one device)."""
    import diffusers
    import torch
    from diffusers.utils import export_to_video
    from diffusers.video_processor import VideoProcessor
    from safetensors.torch import load_file

    from .bench import torch_dtype

    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = torch_dtype(args.dtype)
    vae = getattr(diffusers, config["_class_name"]).from_pretrained(args.model, torch_dtype=dtype).to(args.device)
    z = load_file(args.latents)["latents"].to(args.device, dtype)
    _sync(args.device)
    stamps = {"loaded": time.time()}
    with torch.no_grad():
        video = vae.decode(z).sample
    _sync(args.device)
    stamps["decoded"] = time.time()
    frames = VideoProcessor(vae_scale_factor=8).postprocess_video(video, output_type="np")[0]
    try:
        export_to_video(frames, args.out, fps=args.fps)
        stamps["encoder"] = "export_to_video (imageio-ffmpeg)"
    except AttributeError:  # imageio without its ffmpeg: what export_to_video does without imageio
        from diffusers.utils.export_utils import _legacy_export_to_video

        _legacy_export_to_video(frames, args.out, fps=args.fps)
        stamps["encoder"] = "export_to_video's OpenCV backend (imageio-ffmpeg missing)"
    stamps["written"] = time.time()
    Path(args.timings).write_text(json.dumps(stamps))


def _warm_route(args) -> None:
    """One process, one model: a first request (not timed), then per rep `vae.decode` alone (the whole
    video held), the decode then the whole video written, and the decode streamed into the writer
    (one chunk held at a time), with peak memory."""
    import torch

    import vaeshard

    from . import io
    from .bench import torch_dtype
    from .writer import ChunkWriter, write_output, write_stream

    model = io.resolve_model(args.model, None, offline=True)
    vae = model.load(dtype=torch_dtype(args.dtype), device=args.device)
    z = io.load_latents(args.latents).to(args.device, vae.dtype)
    cuda = args.device == "cuda"
    vaeshard.parallelize(vae)

    def decode():
        vae.decode(z)

    def decode_then_encode():
        write_output(vae.decode(z).sample, args.out, "mp4", args.fps)

    def streamed():
        with ChunkWriter(args.out, "mp4", args.fps) as writer:
            write_stream(vae, z, writer)

    runs = {"decode": decode, "decode_then_encode": decode_then_encode, "streamed": streamed}
    streamed()  # the process's first request
    times: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, float] = {}
    for _ in range(args.reps):
        for name, fn in runs.items():
            _sync(args.device)
            if cuda:
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fn()
            _sync(args.device)
            times[name].append(time.perf_counter() - t0)
            if cuda:  # on the CPU a process's peak is not resettable per run: none reported
                peaks[name] = max(peaks.get(name, 0.0), (torch.cuda.max_memory_allocated() - base) / GIB)
    result = {"times_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()}, "peak_gib": peaks}
    Path(args.timings).write_text(json.dumps(result))


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vaeshard.cli.e2e")
    parser.add_argument("route", choices=("diffusers", "warm"))
    parser.add_argument("latents")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timings", required=True)
    args = parser.parse_args(argv)
    (_diffusers_route if args.route == "diffusers" else _warm_route)(args)


if __name__ == "__main__":
    main()
