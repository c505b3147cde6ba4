"""`vaeshard`'s argument parser: one builder per command, the flags several commands share defined once,
as argparse parent parsers (the model to load, where it runs, the video written, the fast tier, the
timeout)."""

from __future__ import annotations

import argparse

import vaeshard
from vaeshard import MODES

from . import httplimits
from .args import (
    DeprecatedAlias,
    Parser,
    int_list,
    mode_list,
    positive_float,
    positive_int,
    shape,
    tier_arguments,
)
from .bench import DTYPES, PRESETS
from .io import NAMED_CONFIGS
from .serve import DEFAULT_DRAIN_S, DEFAULT_MAX_REQUEST_S, EXIT_DRAIN_CUT
from .writer import MP4_PRESET, MP4_PRESETS

DEFAULT_TIMEOUT_S = 600.0


def build_parser() -> argparse.ArgumentParser:
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
    tier, timeout = tier_arguments(), _timeout()
    _add_demo(sub)
    _add_decode(sub, [_source(required=True), _placement(), _video(), tier, timeout])
    _add_serve(sub, [_source(required=True), _placement(), _video(), tier, timeout])
    _add_bench(sub, [_source(required=False), _placement(), tier, timeout])
    return parser


# --- what several commands share -------------------------------------------------------------------


def _source(required: bool) -> argparse.ArgumentParser:
    """The VAE: a model folder or Hub id, or a named config with random weights."""
    # no argument group of its own: a parent's exclusive pair inside one lands outside it in the child
    parent = argparse.ArgumentParser(add_help=False)
    what = parent.add_mutually_exclusive_group(required=required)
    what.add_argument(
        "--model", default=None, metavar="MODEL", help="local diffusers folder (VAE or pipeline with vae/) or Hub id"
    )
    what.add_argument(
        "--config",
        choices=tuple(NAMED_CONFIGS),
        default=None,
        help="a real VAE's config with RANDOM weights (torch.manual_seed(0)), to try vaeshard without a model: "
        "the output is noise",
    )
    parent.add_argument(
        "--subfolder", default=None, help="subfolder of MODEL holding the VAE (default: vae/ when present)"
    )
    parent.add_argument("--offline", action="store_true", help="use only models already on disk or in the local cache")
    return parent


def _placement() -> argparse.ArgumentParser:
    """The decode's dtype and device (the rank count is each command's own: one number, or a list to measure)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("ranks")
    group.add_argument("--dtype", choices=DTYPES, default=None, help="default: bf16 on cuda, fp32 on cpu")
    group.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu")
    return parent


def _video() -> argparse.ArgumentParser:
    """How an MP4 is encoded."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("video")
    group.add_argument(
        "--fps", type=positive_int, default=16, help="frame rate of an MP4 (default 16; a request may name its own)"
    )
    group.add_argument(
        "--x264-preset",
        choices=MP4_PRESETS,
        default=MP4_PRESET,
        help=f"x264 preset of an MP4: slower gives a smaller file at the same quality (default {MP4_PRESET})",
    )
    group.add_argument(
        "--preset", action=DeprecatedAlias, dest="x264_preset", replacement="--x264-preset", choices=MP4_PRESETS
    )
    return parent


def _timeout() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a request waits for every rank to arrive, and for each collective on CPU (default 600)",
    )
    return parent


# --- the commands ----------------------------------------------------------------------------------


def _add_demo(sub) -> None:
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
    demo.add_argument("--nproc", type=positive_int, default=2, help="ranks to start (default 2)")
    demo.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds before the run is stopped (default 300)"
    )


def _add_decode(sub, parents) -> None:
    dec = sub.add_parser(
        "decode",
        parents=parents,
        help="decode a latent file to a video, frames or a tensor",
        description="Decode LATENTS (.safetensors, .pt or .npy; layout B,C,T,H,W for video VAEs, B,C,H,W for "
        "image VAEs) with a diffusers VAE over --nproc ranks and write OUT: .mp4 (H.264), .png (one frame or "
        "image), a folder of PNG frames, or the raw tensor as .safetensors (key 'sample') / .pt.",
    )
    dec.add_argument("latents", metavar="LATENTS", help="latent file: .safetensors, .pt/.pth or .npy")
    dec.add_argument(
        "--key", default="latents", help="tensor name in a .safetensors or dict .pt file (default: latents)"
    )
    dec.add_argument(
        "--denormalize",
        action="store_true",
        help="undo the pipeline's latent normalisation first: latents_mean/latents_std (Wan, Qwen-Image) "
        "or scaling_factor/shift_factor (Stable Diffusion, FLUX), as the diffusers pipelines do",
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
    dec.add_argument(
        "--nproc", type=positive_int, default=None, help="ranks to start (default 1; under torchrun: its world size)"
    )
    dec.add_argument("--mode", choices=MODES, default="auto", help="how the decode is spread (default: auto)")
    dec.add_argument(
        "--tile-size", type=positive_int, default=None, metavar="PX", help="tile size in sample pixels (tile mode)"
    )
    dec.add_argument(
        "--tile-stride", type=positive_int, default=None, metavar="PX", help="tile stride in sample pixels (tile mode)"
    )
    dec.add_argument("--out", required=True, metavar="OUT", help="output: .mp4, .png, folder, .safetensors or .pt")
    dec.add_argument("--quiet", action="store_true", help="no progress bar; only the line naming what was written")
    dec.add_argument(
        "--timings",
        default=None,
        metavar="JSON",
        help="write when the command started, the model and latents were ready, the decode was done and the "
        "output closed (Unix times)",
    )


def _add_serve(sub, parents) -> None:
    srv = sub.add_parser(
        "serve",
        parents=parents,
        help="serve decode and encode requests over HTTP, every rank of the group doing each one",
        description="Load MODEL on --nproc ranks (or torchrun's) and answer POST /v1/decode and /v1/encode "
        "(safetensors in; MP4, a zip of PNG frames or safetensors out), GET /health and GET /metrics, "
        "from group rank 0. One request runs at a time, in arrival order. See docs/serving.md.",
    )
    srv.add_argument(
        "--nproc", type=positive_int, default=None, help="ranks to start (default 1; under torchrun: its world size)"
    )
    srv.add_argument(
        "--mode", choices=MODES, default="auto", help="a request's mode unless it names one (default: auto)"
    )
    front = srv.add_argument_group("HTTP")
    front.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    front.add_argument("--port", type=positive_int, default=8000, help="port to bind (default 8000)")
    front.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer KEY); visible in ps: prefer $VAESHARD_API_KEY or --api-key-file",
    )
    front.add_argument(
        "--max-queue",
        type=positive_int,
        default=16,
        help="requests that may wait for the group; more get 429 (default 16)",
    )
    front.add_argument(
        "--max-body-mb",
        type=positive_float,
        default=httplimits.DEFAULT_BODY_MB,
        help=f"largest request body in MiB; more get 413 (default {httplimits.DEFAULT_BODY_MB:g})",
    )
    httplimits.add_arguments(front)
    front.add_argument(
        "--ready-file", default=None, metavar="JSON", help="write the address here once the server listens"
    )
    front.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=DEFAULT_DRAIN_S,
        help="after SIGTERM, seconds the request in flight may take to finish; past them it gets 503 and the "
        f"exit code is {EXIT_DRAIN_CUT} (default {DEFAULT_DRAIN_S:g})",
    )
    front.add_argument(
        "--max-request-timeout",
        type=positive_float,
        default=DEFAULT_MAX_REQUEST_S,
        help="a request's deadline from its arrival, and the most it may ask for with X-Request-Timeout or "
        f"?timeout= (default {DEFAULT_MAX_REQUEST_S:g})",
    )


def _add_bench(sub, parents) -> None:
    ben = sub.add_parser(
        "bench",
        parents=parents,
        help="measure latency, memory and exactness of every mode against diffusers",
        description="Time vaeshard's decode for each mode and rank count against diffusers' single-process "
        "untiled decode of the same weights and latent, by the protocol of BENCHMARKS.md.",
    )
    size = ben.add_mutually_exclusive_group()
    size.add_argument(
        "--shape", type=shape, default=None, metavar="B,C,T,H,W", help="latent shape (B,C,H,W for image VAEs)"
    )
    size.add_argument(
        "--subject", choices=tuple(PRESETS), default=None, help="a BENCHMARKS.md subject (sets config and shape)"
    )
    size.add_argument(
        "--preset", action=DeprecatedAlias, dest="subject", replacement="--subject", choices=tuple(PRESETS)
    )
    ben.add_argument(
        "--modes",
        type=mode_list,
        default=list(MODES),
        metavar="M1,M2",
        help=f"modes to measure (default: {','.join(MODES)})",
    )
    ben.add_argument(
        "--nproc",
        type=int_list,
        default=None,
        metavar="N1,N2",
        help="rank counts to measure (default: 1,2; under torchrun: its world size)",
    )
    ben.add_argument(
        "--reps", type=positive_int, default=3, help="timed decodes per point after one warm-up (default 3)"
    )
    ben.add_argument("--no-ref", action="store_true", help="skip diffusers' reference decode (no ratios, no diffs)")
    ben.add_argument(
        "--peak-tflops",
        type=positive_float,
        default=None,
        help="device peak for utilisation (default: 790 on cuda, none on cpu)",
    )
    ben.add_argument(
        "--tflop",
        type=positive_float,
        default=None,
        help="FLOPs of one decode in TFLOP (default: the subject's, else counted)",
    )
    ben.add_argument("--json", default=None, metavar="PATH", help="write every figure and the environment as JSON")
    ben.add_argument("--plot", default=None, metavar="PNG", help="draw latency and per-rank memory against ranks")
