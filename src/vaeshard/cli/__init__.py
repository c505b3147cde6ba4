"""`vaeshard` command line: demo, decode, bench, serve.

Thin: arguments are checked here (before any process starts, so a mistake costs no model load),
the work goes through the public API (`import vaeshard`) on ranks started by cli/launch.py, and the
measuring lives in cli/bench.py. A mistake in what was asked for prints one line,
`vaeshard: error: ...`, and exits with 2; a failure while running exits with 1; SIGTERM or SIGINT
stops every rank and exits with 128 plus the signal (143, 130).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import vaeshard
from vaeshard import MODES, FastOptions

from .args import Parser
from .args import int_list as _int_list
from .args import mode_list as _mode_list
from .args import positive_float as _positive_float
from .args import positive_int as _positive_int
from .args import shape as _shape
from .io import InputError
from .serve import DEFAULT_DRAIN_S, DEFAULT_MAX_REQUEST_S, EXIT_DRAIN_CUT
from .writer import MP4_PRESET, MP4_PRESETS

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_TIMEOUT_S = 600.0


# --- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from .bench import DTYPES, PRESETS
    from .io import NAMED_CONFIGS

    parser = Parser(
        prog="vaeshard",
        description=(
            f"Spread the decode of diffusers VAEs ({', '.join(vaeshard.supported_classes())}) over processes. "
            f"Modes: {', '.join(MODES)}."
        ),
        epilog="Each command's options: vaeshard COMMAND --help. Run under torchrun to use its ranks instead of "
        "processes vaeshard starts itself.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="decode a small latent with a random-weight Wan 2.1 VAE in every mode and check each against diffusers",
        description="Offline self-check: a Wan 2.1-architecture VAE with random weights decodes one small latent "
        f"in one process with plain diffusers and then over several ranks in every mode ({', '.join(MODES)}); "
        "prints a table and exits 0 only if every result matches diffusers.",
    )
    demo.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cuda when enough GPUs are visible, else cpu"
    )
    demo.add_argument("--nproc", type=_positive_int, default=2, help="ranks to start (default 2)")
    demo.add_argument(
        "--timeout", type=_positive_float, default=300.0, help="seconds before the run is stopped (default 300)"
    )

    dec = sub.add_parser(
        "decode",
        help="decode a latent file to a video, frames or a tensor",
        description="Decode LATENTS (.safetensors, .pt or .npy; layout B,C,T,H,W for video VAEs, B,C,H,W for "
        "image VAEs) with a diffusers VAE over --nproc ranks and write OUT: .mp4 (H.264), .png (one frame or "
        "image), a folder of PNG frames, or the raw tensor as .safetensors (key 'sample') / .pt.",
    )
    dec.add_argument("latents", metavar="LATENTS", help="latent file: .safetensors, .pt/.pth or .npy")
    what = dec.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--model", default=None, metavar="MODEL", help="local diffusers folder (VAE or pipeline with vae/) or Hub id"
    )
    what.add_argument(
        "--config",
        choices=tuple(NAMED_CONFIGS),
        default=None,
        help="a real VAE's config with RANDOM weights (torch.manual_seed(0)), to try decode without a model: "
        "the output is noise",
    )
    dec.add_argument(
        "--subfolder", default=None, help="subfolder of MODEL holding the VAE (default: vae/ when present)"
    )
    dec.add_argument(
        "--key", default="latents", help="tensor name in a .safetensors or dict .pt file (default: latents)"
    )
    dec.add_argument(
        "--denormalize",
        action="store_true",
        help="undo the pipeline's latent normalisation first: latents_mean/latents_std (Wan, Qwen-Image) "
        "or scaling_factor/shift_factor (AutoencoderKL), as the diffusers pipelines do",
    )
    dec.add_argument(
        "--decode-timestep",
        type=float,
        default=None,
        help="the decoder's timestep for a timestep-conditioned VAE (LTX-Video 0.9.1 and later: the "
        "pipeline's decode_timestep); refused for VAEs that take none",
    )
    dec.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the global RNG's seed on every rank, for decoders that draw noise (LTX-Video) (default 0)",
    )
    dec.add_argument("--dtype", choices=DTYPES, default=None, help="default: bf16 on cuda, fp32 on cpu")
    dec.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu")
    dec.add_argument(
        "--nproc", type=_positive_int, default=None, help="ranks to start (default 1; under torchrun: its world size)"
    )
    dec.add_argument("--mode", choices=MODES, default="auto", help="how the decode is spread (default: auto)")
    dec.add_argument(
        "--tile-size", type=_positive_int, default=None, metavar="PX", help="tile size in sample pixels (tile mode)"
    )
    dec.add_argument(
        "--tile-stride", type=_positive_int, default=None, metavar="PX", help="tile stride in sample pixels (tile mode)"
    )
    dec.add_argument("--out", required=True, metavar="OUT", help="output: .mp4, .png, folder, .safetensors or .pt")
    dec.add_argument("--fps", type=_positive_int, default=16, help="frame rate of an .mp4 (default 16)")
    dec.add_argument(
        "--preset",
        choices=MP4_PRESETS,
        default=MP4_PRESET,
        help=f"x264 preset of an .mp4: slower gives a smaller file at the same quality (default {MP4_PRESET})",
    )
    dec.add_argument("--offline", action="store_true", help="use only models already on disk or in the local cache")
    _add_tier_arguments(dec)
    dec.add_argument("--quiet", action="store_true", help="no progress bar; only the line naming what was written")
    dec.add_argument(
        "--timings",
        default=None,
        metavar="JSON",
        help="write when the command started, the model and latents were ready, the decode was done and the "
        "output closed (Unix times)",
    )
    dec.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a request waits for every rank to arrive, and for each collective on CPU (default 600)",
    )

    from . import httplimits

    srv = sub.add_parser(
        "serve",
        help="serve decode and encode requests over HTTP, every rank of the group doing each one",
        description="Load MODEL on --nproc ranks (or torchrun's) and answer POST /v1/decode and /v1/encode "
        "(safetensors in; MP4, a zip of PNG frames or safetensors out), GET /health and GET /metrics, "
        "from group rank 0. One request runs at a time, in arrival order. See docs/serving.md.",
    )
    what = srv.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--model", default=None, metavar="MODEL", help="local diffusers folder (VAE or pipeline) or Hub id"
    )
    what.add_argument(
        "--config", choices=tuple(NAMED_CONFIGS), default=None, help="real VAE config with random weights (benchmarks)"
    )
    srv.add_argument(
        "--subfolder", default=None, help="subfolder of MODEL holding the VAE (default: vae/ when present)"
    )
    srv.add_argument("--offline", action="store_true", help="use only models already on disk or in the local cache")
    srv.add_argument("--dtype", choices=DTYPES, default=None, help="default: bf16 on cuda, fp32 on cpu")
    srv.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu")
    srv.add_argument(
        "--nproc", type=_positive_int, default=None, help="ranks to start (default 1; under torchrun: its world size)"
    )
    srv.add_argument(
        "--mode", choices=MODES, default="auto", help="a request's mode unless it names one (default: auto)"
    )
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=_positive_int, default=8000, help="port to bind (default 8000)")
    srv.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer KEY); visible in ps: prefer $VAESHARD_API_KEY or --api-key-file",
    )
    srv.add_argument(
        "--max-queue",
        type=_positive_int,
        default=16,
        help="requests that may wait for the group; more get 429 (default 16)",
    )
    srv.add_argument(
        "--max-body-mb",
        type=_positive_float,
        default=httplimits.DEFAULT_BODY_MB,
        help=f"largest request body in MiB; more get 413 (default {httplimits.DEFAULT_BODY_MB:g})",
    )
    httplimits.add_arguments(srv)
    srv.add_argument(
        "--fps", type=_positive_int, default=16, help="frame rate of an MP4 unless a request names one (default 16)"
    )
    srv.add_argument(
        "--preset", choices=MP4_PRESETS, default=MP4_PRESET, help=f"x264 preset of MP4s (default {MP4_PRESET})"
    )
    srv.add_argument(
        "--ready-file", default=None, metavar="JSON", help="write the address here once the server listens"
    )
    _add_tier_arguments(srv)
    srv.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a request waits for every rank, and for each collective on CPU (default 600)",
    )
    srv.add_argument(
        "--drain-timeout",
        type=_positive_float,
        default=DEFAULT_DRAIN_S,
        help="after SIGTERM, seconds the request in flight may take to finish; past them it gets 503 and the "
        f"exit code is {EXIT_DRAIN_CUT} (default {DEFAULT_DRAIN_S:g})",
    )
    srv.add_argument(
        "--max-request-timeout",
        type=_positive_float,
        default=DEFAULT_MAX_REQUEST_S,
        help="a request's deadline from its arrival, and the most it may ask for with X-Request-Timeout or "
        f"?timeout= (default {DEFAULT_MAX_REQUEST_S:g})",
    )

    ben = sub.add_parser(
        "bench",
        help="measure latency, memory and exactness of every mode against diffusers",
        description="Time vaeshard's decode for each mode and rank count against diffusers' single-process "
        "untiled decode of the same weights and latent, by the protocol of BENCHMARKS.md.",
    )
    what = ben.add_mutually_exclusive_group()
    what.add_argument(
        "--config", choices=tuple(NAMED_CONFIGS), default=None, help="real VAE config with random weights"
    )
    what.add_argument("--model", default=None, metavar="MODEL", help="local diffusers folder or Hub id")
    ben.add_argument(
        "--subfolder", default=None, help="subfolder of MODEL holding the VAE (default: vae/ when present)"
    )
    ben.add_argument("--offline", action="store_true", help="use only models already on disk or in the local cache")
    size = ben.add_mutually_exclusive_group()
    size.add_argument(
        "--shape", type=_shape, default=None, metavar="B,C,T,H,W", help="latent shape (B,C,H,W for image VAEs)"
    )
    size.add_argument(
        "--preset", choices=tuple(PRESETS), default=None, help="a BENCHMARKS.md subject (sets config and shape)"
    )
    ben.add_argument(
        "--modes",
        type=_mode_list,
        default=list(MODES),
        metavar="M1,M2",
        help=f"modes to measure (default: {','.join(MODES)})",
    )
    ben.add_argument(
        "--nproc",
        type=_int_list,
        default=None,
        metavar="N1,N2",
        help="rank counts to measure (default: 1,2; under torchrun: its world size)",
    )
    ben.add_argument("--dtype", choices=DTYPES, default=None, help="default: bf16 on cuda, fp32 on cpu")
    ben.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu")
    ben.add_argument(
        "--reps", type=_positive_int, default=3, help="timed decodes per point after one warm-up (default 3)"
    )
    ben.add_argument("--no-ref", action="store_true", help="skip diffusers' reference decode (no ratios, no diffs)")
    ben.add_argument(
        "--peak-tflops",
        type=_positive_float,
        default=None,
        help="device peak for utilisation (default: 790 on cuda, none on cpu)",
    )
    ben.add_argument(
        "--tflop",
        type=_positive_float,
        default=None,
        help="FLOPs of one decode in TFLOP (default: the preset's, else counted)",
    )
    ben.add_argument("--json", default=None, metavar="PATH", help="write every figure and the environment as JSON")
    ben.add_argument("--plot", default=None, metavar="PNG", help="draw latency and per-rank memory against ranks")
    _add_tier_arguments(ben)
    ben.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a request waits for every rank to arrive, and for each collective on CPU (default 600)",
    )
    return parser


# --- entry point -----------------------------------------------------------------------------------


def entry() -> None:
    """The `vaeshard` command and `python -m vaeshard`: `main`, then exit with its status.

    Under torchrun the process exits without the interpreter's teardown once its output is flushed:
    the gloo backend's threads can outlive the destroyed process group, and tearing them down with
    the interpreter sometimes aborts a rank after its work succeeded (torchrun then reports the run
    failed). Every file the command writes is complete before `main` returns.
    """
    from .launch import torchrun_env

    code = main()
    if torchrun_env():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    from .launch import close_group

    args = build_parser().parse_args(argv)
    try:
        code = {"demo": _demo, "decode": _decode, "bench": _bench, "serve": _serve}[args.command](args)
        close_group()  # under torchrun: every rank is past its last collective
        return code
    except ValueError as exc:  # InputError, or the library refusing a request (bad input)
        return _error(str(exc), EXIT_USAGE)
    except KeyboardInterrupt as exc:  # Ctrl-C, or launch.Interrupted: SIGTERM or SIGINT, ranks stopped
        signum = getattr(exc, "signum", 2)
        return _error(str(exc) or "interrupted", 128 + signum)  # the shell's convention: 130 SIGINT, 143 SIGTERM
    except Exception as exc:
        from .launch import LaunchError, WorkerFailed

        if isinstance(exc, WorkerFailed):
            if exc.user_error:
                return _error(exc.message, EXIT_USAGE)
            if exc.detail:
                sys.stderr.write(exc.detail if exc.detail.endswith("\n") else exc.detail + "\n")
            return _error(
                f"rank {exc.rank} failed: {exc.exc_type + ': ' if exc.exc_type else ''}{exc.message}", EXIT_FAILED
            )
        if isinstance(exc, LaunchError):
            return _error(str(exc), EXIT_FAILED)
        raise


def _error(message: str, code: int) -> int:
    if _is_main_rank():
        first = " ".join(message.split("\n")).strip()
        print(f"vaeshard: error: {first}", file=sys.stderr)
    return code


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _pick_device(requested: str | None, nproc: int) -> str:
    """cpu or cuda; cuda needs one visible GPU per rank (per local rank under torchrun)."""
    from .launch import torchrun_env

    if requested == "cpu":
        return "cpu"
    gpus = _cuda_count()
    need = int(os.environ["LOCAL_RANK"]) + 1 if torchrun_env() else nproc
    if requested is None:
        return "cuda" if gpus >= need else "cpu"
    if gpus < need:
        visible = f"{gpus} GPU is visible" if gpus == 1 else f"{gpus} GPUs are visible"
        fix = f"use --nproc {gpus} or fewer, or --device cpu" if gpus else "use --device cpu"
        raise InputError(f"--device cuda with {nproc} rank(s) needs {need} GPU(s), one per rank, but {visible}: {fix}")
    return "cuda"


def _process_count(requested: int | None, default: int = 1) -> int:
    from .launch import torchrun_world

    world = torchrun_world()
    if world is not None:
        if requested is not None and requested != world:
            raise InputError(
                f"--nproc {requested} conflicts with torchrun's {world} ranks: leave out --nproc under torchrun"
            )
        return world
    return default if requested is None else requested


# --- demo ------------------------------------------------------------------------------------------


def _demo(args) -> int:
    from .demo import run_demo
    from .launch import torchrun_world

    nproc = torchrun_world() or args.nproc
    device = _pick_device(args.device, nproc)
    ok = run_demo(nproc=nproc, device=device, group_timeout=args.timeout, timeout=args.timeout, out=_main_print)
    return EXIT_OK if ok else EXIT_FAILED


def _main_print(*parts) -> None:
    if _is_main_rank():
        print(*parts, flush=True)


# --- decode ----------------------------------------------------------------------------------------


def _add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """--exact and one option per FastOptions knob (its flag and one-line doc), the same on `decode`
    and `bench`; `_tier_options` reads them back."""
    parser.add_argument(
        "--exact", action="store_true", help="every layer exactly as diffusers computes it (default: the fast tier)"
    )
    for name, default, doc, flag, parse, metavar in FastOptions.knobs():
        if parse is None:  # a switch: --no-X turns a default True off, --X a default False on
            parser.add_argument(
                flag,
                dest=name,
                action="store_false" if default else "store_true",
                help=f"fast tier: {'turn off ' + name + ' (' + doc + ')' if default else doc}",
            )
        else:
            parser.add_argument(
                flag,
                dest=name,
                type=_argument(parse),
                default=default,
                metavar=metavar,
                help=f"fast tier: {doc} (default: {default})",
            )


def _argument(parse):
    """An argparse type from a FastOptions parser (its ValueError becomes argparse's message)."""

    def typed(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def _tier_options(args) -> dict:
    """`parallelize`'s `exact` and `fast` from the options `_add_tier_arguments` made."""
    return {"exact": args.exact, "fast": FastOptions(**{name: getattr(args, name) for name, *_ in FastOptions.knobs()})}


def _check_timestep(timestep: float | None, model) -> None:
    """--decode-timestep where the VAE's decoder is timestep-conditioned, and only there."""
    from .io import InputError

    conditioned = bool(model.config.get("timestep_conditioning", False))
    if conditioned and timestep is None:
        raise InputError(
            f"{model.description} has a timestep-conditioned decoder: pass --decode-timestep T "
            "(the pipeline's decode_timestep)"
        )
    if timestep is not None and not conditioned:
        raise InputError(f"--decode-timestep: {model.description} takes no decoder timestep; drop the flag")


def _decode(args) -> int:
    import time

    from . import decode, io

    started = time.time()
    nproc = _process_count(args.nproc)
    device = _pick_device(args.device, nproc)
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    out_kind = io.output_kind(args.out)
    z = io.load_latents(args.latents, args.key)
    if args.config is not None:
        model = io.named_model(args.config)
    else:
        model = io.resolve_model(args.model, args.subfolder, args.offline)
    io.check_latents(z, model, source=f"latents in {args.latents!r}")
    if args.denormalize:
        io.check_denormalize(model.config, z.shape[1])
    _check_timestep(args.decode_timestep, model)
    _check_tiles(args.tile_size, args.tile_stride, model)
    frames = model.frames_out(z.shape[2]) if z.dim() == 5 else 1
    io.check_output(args.out, out_kind, z.shape[0], frames, model.sample_channels())
    if args.config is not None and _is_main_rank():  # (after the checks: a mistake stays one line)
        print(f"vaeshard: {model.description}: RANDOM weights, so the output is noise", file=sys.stderr)
    job = decode.DecodeJob(
        latents=args.latents,
        key=args.key,
        model=model,
        dtype=dtype,
        mode=args.mode,
        tile=(args.tile_size, args.tile_stride),
        denormalize=args.denormalize,
        timestep=args.decode_timestep,
        seed=args.seed,
        out=args.out,
        out_kind=out_kind,
        fps=args.fps,
        preset=args.preset,
        progress=not args.quiet,
        timeout=args.timeout,
        options=_tier_options(args),
    )
    summary = decode.run(job, nproc, device, args.timeout)
    if args.timings:
        Path(args.timings).write_text(json.dumps({"started": started, **summary["stamps"]}))
    what = f"{summary['frames']} frame(s)" if z.dim() == 5 else f"{summary['batch']} image(s)"
    _main_print(
        f"wrote {args.out}: {what} {summary['width']}x{summary['height']}"
        + (
            ""
            if args.quiet
            else f", {summary['strategy']} on {nproc} rank(s), decode {summary['seconds']:.2f} s, "
            f"written {summary['total_seconds']:.2f} s after the decode began"
        )
    )
    return EXIT_OK


def _check_tiles(size: int | None, stride: int | None, model) -> None:
    if size is None and stride is None:
        return
    if size is None or stride is None:
        raise InputError(
            "--tile-size and --tile-stride go together: give both (e.g. --tile-size 256 --tile-stride 192)"
        )
    ratio = model.spatial_ratio()
    if size % ratio or stride % ratio:
        raise InputError(
            f"--tile-size {size} and --tile-stride {stride} must be multiples of this VAE's spatial factor {ratio}"
        )
    if stride > size:
        raise InputError(f"--tile-stride {stride} is larger than --tile-size {size}: tiles must overlap or touch")


# --- serve -----------------------------------------------------------------------------------------


def _serve(args) -> int:
    from . import serve

    return serve.command(args)


# --- bench -----------------------------------------------------------------------------------------


def _bench(args) -> int:
    from . import bench, io, launch, report

    world = launch.torchrun_world()
    nprocs = [world] if world else (args.nproc or [1, 2])
    if world and args.nproc not in (None, [world]):
        raise InputError(
            f"--nproc {','.join(map(str, args.nproc))} conflicts with torchrun's {world} ranks: leave out --nproc"
        )
    device = _pick_device(args.device, max(nprocs))
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    preset_flops = None
    if args.preset is not None:
        if args.model is not None:
            raise InputError("--preset sets the model config: use --config with --preset, or --shape with --model")
        config, shape, preset_flops = bench.PRESETS[args.preset]
        if args.config is not None and args.config != config:
            raise InputError(f"--preset {args.preset} is a {config} subject, not {args.config}: drop --config")
        model = io.named_model(config)
    else:
        if args.config is None and args.model is None:
            raise InputError(
                "say what to measure: --config NAME or --model PATH, with --shape B,C,T,H,W, or --preset NAME"
            )
        if args.shape is None:
            raise InputError("--shape B,C,T,H,W is needed with --config or --model (or use --preset)")
        shape = args.shape
        model = (
            io.named_model(args.config) if args.config else io.resolve_model(args.model, args.subfolder, args.offline)
        )
    io.check_latent_shape(shape, model, source=f"latent shape {tuple(shape)}")
    if args.preset is not None and device == "cpu":
        small = ",".join(map(str, (1, shape[1], 3, 12, 16)))
        _bench_log(
            f"warning: --preset {args.preset} on CPU takes hours (a latent of {tuple(shape)} per decode, several "
            f"decodes per point); for a quick CPU run: --config {config} --shape {small}"
        )
    for path in (args.json, args.plot):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"cannot write {path!r}: its folder does not exist")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib (pip install matplotlib): install it, or leave out --plot")
    peak = (
        args.peak_tflops
        if args.peak_tflops is not None
        else (bench.H200_BF16_PEAK_TFLOPS if device == "cuda" else None)
    )
    result = bench.run_bench(
        model,
        shape,
        modes=args.modes,
        nprocs=nprocs,
        dtype=dtype,
        device=device,
        reps=args.reps,
        reference=not args.no_ref,
        tflop=args.tflop,
        preset_flops=preset_flops,
        peak_tflops=peak,
        group_timeout=args.timeout,
        options=_tier_options(args),
        timeout=None,
        log=_bench_log,
        on_point=functools.partial(_bench_point, args.json),
    )
    if not _is_main_rank():
        return EXIT_OK
    print(report.bench_table(result), flush=True)
    if args.json:
        report.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(result, args.plot)
        print(f"wrote {args.plot}")
    return EXIT_OK


def _bench_point(json_path, result) -> None:
    """After each measured point: one line on stderr, and the JSON so far (a cut-short run keeps it)."""
    from . import report

    if not _is_main_rank():
        return
    if result.rows:
        r = result.rows[-1]
        _bench_log(f"{r['mode']} x{r['nproc']}: {_timed_text(r)} ({r['strategy']})")
    elif result.reference is not None:
        _bench_log(f"diffusers x1: {_timed_text(result.reference)}")
    if json_path:
        report.write_json(result, json_path)


def _timed_text(point: dict) -> str:
    reps = point.get("seconds_reps") or [point["seconds"]]
    return f"{point['seconds']:.3f} s (min {min(reps):.3f}, max {max(reps):.3f})"


def _bench_log(message: str) -> None:
    if _is_main_rank():
        print(f"[bench] {message}", file=sys.stderr, flush=True)
