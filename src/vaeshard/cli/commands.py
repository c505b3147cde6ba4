"""What each `vaeshard` command does with its checked arguments: demo, decode, serve, bench.

Arguments are checked here, before any process starts, so a mistake costs no model load; the work goes
through the public API (`import vaeshard`) on ranks started by cli/launch.py.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from .args import tier_options
from .io import InputError
from .placement import is_main_rank, main_print, pick_device, process_count

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def run(args) -> int:
    """The command `args` names; its exit status."""
    return {"demo": demo, "decode": decode, "bench": bench, "serve": serve}[args.command](args)


# --- demo ------------------------------------------------------------------------------------------


def demo(args) -> int:
    from . import launch
    from .demo import run_demo

    nproc = launch.torchrun_world() or args.nproc
    device = pick_device(args.device, nproc)
    launch.prestart()
    ok = run_demo(nproc=nproc, device=device, group_timeout=args.timeout, timeout=args.timeout, out=main_print)
    return EXIT_OK if ok else EXIT_FAILED


# --- decode ----------------------------------------------------------------------------------------


def decode(args) -> int:
    from . import decode, io, launch

    started = time.time()
    nproc = process_count(args.nproc)
    device = pick_device(args.device, nproc)
    if nproc > 1:
        launch.prestart()
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
    if args.config is not None and is_main_rank():  # (after the checks: a mistake stays one line)
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
        preset=args.x264_preset,
        progress=not args.quiet,
        timeout=args.timeout,
        options=tier_options(args),
    )
    summary = decode.run(job, nproc, device, args.timeout)
    if args.timings:
        Path(args.timings).write_text(json.dumps({"started": started, **summary["stamps"]}))
    what = f"{summary['frames']} frame(s)" if z.dim() == 5 else f"{summary['batch']} image(s)"
    main_print(
        f"wrote {args.out}: {what} {summary['width']}x{summary['height']}"
        + (
            ""
            if args.quiet
            else f", {summary['strategy']} on {nproc} rank(s), decode {summary['seconds']:.2f} s, "
            f"written {summary['total_seconds']:.2f} s after the decode began"
        )
    )
    return EXIT_OK


def _check_timestep(timestep: float | None, model) -> None:
    """--decode-timestep where the VAE's decoder is timestep-conditioned, and only there."""
    conditioned = bool(model.config.get("timestep_conditioning", False))
    if conditioned and timestep is None:
        raise InputError(
            f"{model.description} has a timestep-conditioned decoder: pass --decode-timestep T "
            "(the pipeline's decode_timestep)"
        )
    if timestep is not None and not conditioned:
        raise InputError(f"--decode-timestep: {model.description} takes no decoder timestep; drop the flag")


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


def serve(args) -> int:
    """`vaeshard serve`: check what was asked, then serve on this process or on the ranks it starts."""
    from . import http, httplimits, io, launch, serve

    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(
            f"vaeshard serve needs {', '.join(missing)}: in vaeshard's checkout, pip install -e '.[serve]'"
        )
    api_key = httplimits.api_key(args)  # first: a refused key stops the command before anything loads
    nproc = process_count(args.nproc)
    device = pick_device(args.device, nproc)
    if nproc > 1:
        launch.prestart()
    model = io.named_model(args.config) if args.config else io.resolve_model(args.model, args.subfolder, args.offline)
    job = serve.ServeJob(
        model=model,
        dtype=args.dtype or ("bf16" if device == "cuda" else "fp32"),
        mode=args.mode,
        options=tier_options(args),
        timeout=args.timeout,
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_queue=args.max_queue,
        max_body=int(args.max_body_mb * 2**20),
        fps=args.fps,
        preset=args.x264_preset,
        ready_file=args.ready_file,
        limits=httplimits.limits(args),
        drain_timeout=args.drain_timeout,
        max_request_timeout=args.max_request_timeout,
    )
    if nproc == 1 and not launch.torchrun_env():
        ctx = launch.inline_context(f"{device}:0" if device == "cuda" else "cpu")
        return _serve_exit_code(serve.serve_worker(ctx, job, http.run), job)

    values = launch.run(
        serve.serve_worker,
        nproc,
        job,
        http.run,
        device=device,
        group_timeout=args.timeout,
        failure_grace=serve.FAILED_LINGER_S + 10.0,
        signals="rank0",  # a SIGTERM drains: rank 0 answers what is in flight, then stops the group
    )
    return _serve_exit_code(values[0], job)


def _serve_exit_code(rank0: dict, job) -> int:
    from . import serve

    if not rank0.get("drain_cut"):
        return EXIT_OK
    if is_main_rank():
        print(
            f"vaeshard: error: stopped with a request unfinished: the drain outlasted --drain-timeout "
            f"{job.drain_timeout:g} s (it was answered 503)",
            file=sys.stderr,
        )
    return serve.EXIT_DRAIN_CUT


# --- bench -----------------------------------------------------------------------------------------


def bench(args) -> int:
    from . import bench, launch, report

    nprocs = _bench_ranks(args.nproc)
    device = pick_device(args.device, max(nprocs))
    launch.prestart()  # every point runs on ranks of its own
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    model, shape, subject_flops = _bench_subject(args, device)
    _check_bench_outputs(args)
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
        preset_flops=subject_flops,
        peak_tflops=peak,
        group_timeout=args.timeout,
        options=tier_options(args),
        timeout=None,
        log=report.bench_log,
        on_point=functools.partial(report.bench_point, args.json),
    )
    if not is_main_rank():
        return EXIT_OK
    print(report.bench_table(result), flush=True)
    if args.json:
        report.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(result, args.plot)
        print(f"wrote {args.plot}")
    return EXIT_OK


def _bench_ranks(requested: list[int] | None) -> list[int]:
    from . import launch

    world = launch.torchrun_world()
    if world and requested not in (None, [world]):
        raise InputError(
            f"--nproc {','.join(map(str, requested))} conflicts with torchrun's {world} ranks: leave out --nproc"
        )
    return [world] if world else (requested or [1, 2])


def _bench_subject(args, device: str):
    """The model, the latent shape and the subject's FLOPs (None: counted) that `bench` measures."""
    from . import bench, io, report

    subject_flops = None
    if args.subject is not None:
        if args.model is not None:
            raise InputError("--subject sets the model config: use --config with --subject, or --shape with --model")
        config, shape, subject_flops = bench.PRESETS[args.subject]
        if args.config is not None and args.config != config:
            raise InputError(f"--subject {args.subject} is a {config} subject, not {args.config}: drop --config")
        model = io.named_model(config)
    else:
        if args.config is None and args.model is None:
            raise InputError(
                "say what to measure: --config NAME or --model PATH, with --shape B,C,T,H,W, or --subject NAME"
            )
        if args.shape is None:
            raise InputError("--shape B,C,T,H,W is needed with --config or --model (or use --subject)")
        shape = args.shape
        model = (
            io.named_model(args.config) if args.config else io.resolve_model(args.model, args.subfolder, args.offline)
        )
    io.check_latent_shape(shape, model, source=f"latent shape {tuple(shape)}")
    if args.subject is not None and device == "cpu":
        small = ",".join(map(str, (1, shape[1], 3, 12, 16)))
        report.bench_log(
            f"warning: --subject {args.subject} on CPU takes hours (a latent of {tuple(shape)} per decode, several "
            f"decodes per point); for a quick CPU run: --config {config} --shape {small}"
        )
    return model, shape, subject_flops


def _check_bench_outputs(args) -> None:
    for path in (args.json, args.plot):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"cannot write {path!r}: its folder does not exist")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib (pip install matplotlib): install it, or leave out --plot")
