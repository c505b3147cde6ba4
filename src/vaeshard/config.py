"""vaeshard's settings, each defined once with its documentation, and validated where it is made.

`FastOptions` holds the fast tier's tuning knobs (`parallelize(..., fast=FastOptions(...))`; the
command line's options are made from its fields). `ParallelConfig` is what `parallelize` keeps on a
VAE. The measured thresholds the knobs' "auto" values decide by live in `tuning.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from datetime import timedelta

from . import tuning

MODES: tuple[str, ...] = ("tile", "auto", "spatial_shard_height", "spatial_shard_width")
OUTPUTS: tuple[str, ...] = ("all", "rank0")
SPATIAL_MODES: tuple[str, ...] = ("spatial_shard_height", "spatial_shard_width")
STATE_ATTR = "_vaeshard"  # where `parallelize` keeps its state on a VAE (api._State)

# How long a request's agreement waits for every rank of the group to call decode (or encode) when
# `parallelize` was given no `timeout`: far longer than ranks that reach a decode from the same
# pipeline ever skew (they arrive within milliseconds, or the seconds a rank spends writing the last
# output), far shorter than gloo's 30 minutes or NCCL's 10. VAESHARD_AGREEMENT_TIMEOUT (seconds)
# replaces it for a process.
DEFAULT_AGREEMENT_TIMEOUT_S = 120.0
AGREEMENT_TIMEOUT_ENV = "VAESHARD_AGREEMENT_TIMEOUT"


def agreement_timeout(timeout: float | None) -> tuple[float, str]:
    """(seconds, where they come from) for a request's agreement: `timeout` (parallelize's), else the
    environment's VAESHARD_AGREEMENT_TIMEOUT, else DEFAULT_AGREEMENT_TIMEOUT_S."""
    if timeout is not None:
        return timeout, "parallelize(timeout=...)"
    text = os.environ.get(AGREEMENT_TIMEOUT_ENV)
    if text is None:
        return DEFAULT_AGREEMENT_TIMEOUT_S, f"the default; set parallelize(timeout=...) or {AGREEMENT_TIMEOUT_ENV}"
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{AGREEMENT_TIMEOUT_ENV}={text!r} is not a positive number of seconds")
    return seconds, f"{AGREEMENT_TIMEOUT_ENV}"


# --- the fast tier's knobs ------------------------------------------------------------------------


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise ValueError(f"expected at least {least}, got {value}")
    return value


def _auto_or_steps(text: str):
    return "auto" if text.strip().lower() == "auto" else _whole(text, 1)


def _auto_on_off(text: str):
    value = {"auto": "auto", "on": True, "off": False}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"expected auto, on or off, got {text!r}")
    return value


def _knob(default, doc: str, flag: str, *, parse=None, metavar: str | None = None):
    """A FastOptions field: `doc` is its one line (the README's options table, the command line's
    help); `flag` its command-line option (a bool whose default is True takes --no-...); `parse` reads
    the option's text (ValueError says what is wrong)."""
    return field(default=default, metadata={"doc": doc, "flag": flag, "parse": parse, "metavar": metavar})


@dataclass(frozen=True)
class FastOptions:
    """The fast tier's tuning knobs: `vaeshard.parallelize(vae, fast=vaeshard.FastOptions(...))`.

    The defaults are what vaeshard measured fastest (docs/tuning.md); a knob's "auto" is decided per
    request, from numbers every rank shares, and `vaeshard.plan` says what it decided and why. None
    of these changes what `exact=True` or `tile` compute, which never use the fast tier.
    """

    cudnn_benchmark: bool = _knob(
        tuning.CUDNN_BENCHMARK,
        "cuDNN times its algorithms for each new convolution shape, once per process, and keeps the fastest "
        "(off: its heuristics choose, with no search on a process's first request)",
        "--cudnn-benchmark",
    )
    cuda_graphs: bool | str = _knob(
        "auto",
        "replay a video decode's steady decoder calls as one CUDA graph; auto: where each rank's frames "
        "are small enough for the host to pace the decode",
        "--cuda-graphs",
        parse=_auto_on_off,
        metavar="{auto,on,off}",
    )
    keep_cuda_graphs: bool = _knob(
        False,
        "keep a request's CUDA graphs, and their memory, for the next request of the same shapes, which then "
        "replays every call; vaeshard.release(vae) frees them",
        "--keep-cuda-graphs",
    )

    frames_per_step: int | str = _knob(
        "auto",
        "latent frames per decoder call after the first (causal video VAEs): more is faster and holds "
        "more memory; auto: 2 on CUDA where each rank's frames are small, else 1",
        "--frames-per-step",
        parse=_auto_or_steps,
        metavar="{auto,N}",
    )
    max_layer_frames: int | None = _knob(
        None,
        "the most frames a decoder layer takes at once (at least 2): less memory, more launches; None: parts "
        "of 2 frames only in the layers of the largest frames, where that is free",
        "--max-layer-frames",
        parse=lambda text: _whole(text, 2),
        metavar="N",
    )
    triton_convs: bool = _knob(
        True,
        "run the 3x3x3 convolutions where vaeshard's own Triton kernels measured faster than cuDNN (CUDA)",
        "--no-triton-convs",
    )
    norm_into_conv: bool | str = _knob(
        "auto",
        "a norm and the SiLU after it write straight into the next convolution's padded input (families that "
        "declare such pairs); auto: where measured faster (tuning.NORM_INTO_CONV_BUFFER_FAMILIES)",
        "--norm-into-conv",
        parse=_auto_on_off,
        metavar="{auto,on,off}",
    )

    def __post_init__(self) -> None:
        for name in ("cudnn_benchmark", "triton_convs", "keep_cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not (isinstance(self.cuda_graphs, bool) or self.cuda_graphs == "auto"):
            raise TypeError(f"cuda_graphs must be True, False or 'auto', got {self.cuda_graphs!r}")
        if not (isinstance(self.norm_into_conv, bool) or self.norm_into_conv == "auto"):
            raise TypeError(f"norm_into_conv must be True, False or 'auto', got {self.norm_into_conv!r}")
        if self.keep_cuda_graphs and self.cuda_graphs is False:
            raise ValueError(
                "keep_cuda_graphs=True keeps the CUDA graphs a request replays, and cuda_graphs=False "
                "replays none: pass cuda_graphs=True or 'auto'"
            )
        if self.frames_per_step != "auto" and (
            isinstance(self.frames_per_step, bool) or not isinstance(self.frames_per_step, int)
        ):
            raise TypeError(f"frames_per_step must be an int or 'auto', got {self.frames_per_step!r}")
        if self.frames_per_step != "auto" and self.frames_per_step < 1:
            raise ValueError(f"frames_per_step must be at least 1, got {self.frames_per_step}")
        if self.max_layer_frames is not None:
            if isinstance(self.max_layer_frames, bool) or not isinstance(self.max_layer_frames, int):
                raise TypeError(f"max_layer_frames must be an int or None, got {type(self.max_layer_frames).__name__}")
            if self.max_layer_frames < 2:
                raise ValueError(
                    f"max_layer_frames must be at least 2 (a causal convolution's cache spans two frames), "
                    f"got {self.max_layer_frames}"
                )

    @classmethod
    def knobs(cls):
        """(name, default, one-line doc, command-line flag, parse, metavar) of each knob, in order."""
        return [
            (f.name, f.default, f.metadata["doc"], f.metadata["flag"], f.metadata["parse"], f.metadata["metavar"])
            for f in fields(cls)
        ]


@dataclass(frozen=True)
class ParallelConfig:
    """What `parallelize` keeps on a VAE: how its decode/encode is spread over a process group.

    size:    number of group ranks that do decode work (None = the whole group). A size smaller than
             the group is a *partial group*: spatial sharding needs every rank, so it runs `tile`.
    mode:    one of MODES; `auto` picks per request (see `vaeshard.plan`).
    output:  `all` gives every rank the full result; `rank0` gives it to group rank 0 only and an
             empty tensor to the others.
    timeout: seconds a request's agreement waits for every rank to call decode (or encode), and on a
             gloo (CPU) group every collective of the request; None: the agreement waits
             DEFAULT_AGREEMENT_TIMEOUT_S (VAESHARD_AGREEMENT_TIMEOUT) and gloo's collectives the
             group's own timeout. A rank that fails, dies or never arrives makes the others raise
             CommTimeout within this bound. NCCL's collectives are bounded by the group's own timeout
             (init_process_group(timeout=...)), which NCCL's watchdog enforces without stalling the
             GPU queue.
    exact:   True runs every layer as diffusers computes it (direct and spatial results then differ
             from diffusers only by how the work is split); False (default) runs the fast tier with
             the knobs of `fast`. `tile` is always exact.
    """

    size: int | None = None
    mode: str = "auto"
    output: str = "all"
    timeout: float | timedelta | None = None
    exact: bool = False
    fast: FastOptions = field(default_factory=FastOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}: valid modes are {', '.join(MODES)}")
        if not isinstance(self.output, str) or self.output not in OUTPUTS:
            raise ValueError(f"unknown output {self.output!r}: valid values are {', '.join(OUTPUTS)}")
        if self.size is not None:
            if isinstance(self.size, bool) or not isinstance(self.size, int):
                raise TypeError(f"size must be an int or None, got {type(self.size).__name__}")
            if self.size < 1:
                raise ValueError(f"size must be at least 1, got {self.size}")
        if not isinstance(self.exact, bool):
            raise TypeError(f"exact must be True or False, got {self.exact!r}")
        if not isinstance(self.fast, FastOptions):
            raise TypeError(f"fast must be a vaeshard.FastOptions, got {type(self.fast).__name__}")
        if self.timeout is not None:
            seconds = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else self.timeout
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {self.timeout!r}")

    @property
    def timeout_seconds(self) -> float | None:
        if self.timeout is None:
            return None
        return self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else float(self.timeout)
