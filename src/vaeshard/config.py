"""User-facing configuration of a parallelized VAE, validated once at construction."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

MODES: tuple[str, ...] = ("tile", "auto", "spatial_shard_height", "spatial_shard_width")
OUTPUTS: tuple[str, ...] = ("all", "rank0")
SPATIAL_MODES: tuple[str, ...] = ("spatial_shard_height", "spatial_shard_width")
# The fast tier's settings (VaeParallelConfig fields, `fast.tier` arguments, `parallelize` keywords and
# the command line's option destinations all carry these names).
FAST_TIER_SETTINGS: tuple[str, ...] = ("cudnn_benchmark", "frames_per_step", "max_layer_frames", "triton_convs",
                                       "cuda_graphs", "keep_cuda_graphs")

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


@dataclass(frozen=True)
class VaeParallelConfig:
    """How a VAE's decode/encode is spread over a process group.

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
             from diffusers only by how the work is split); False (default) runs the fast tier
             (fast.py), within DESIGN.md's tolerances. `tile` is always exact.
    cudnn_benchmark: fast tier only: cuDNN times its algorithms for each new convolution shape and
             keeps the fastest (torch.backends.cudnn.benchmark, on for the request only). The first
             request of each size pays the timing once per process; False keeps cuDNN's heuristic.
    frames_per_step: fast tier, causal video VAEs (Wan, Qwen-Image): latent frames the decoder
             takes per call after the first, which it always takes alone (diffusers: 1). The causal
             feature caches make every split of the frames compute the same values; more frames per
             call launch fewer, larger kernels, copy the caches less often per frame and, sharded,
             make fewer halo exchanges per frame (faster), and hold that many frames' activations
             at once (more memory). "auto" (default): 2 on CUDA where the output frames hold at most
             2^18 pixels (sharded: the largest rank's; fast.AUTO_STEP_MAX_PIXELS), the host-paced
             regime where a rank's memory is small, and 1 otherwise (and always 1 with
             `max_layer_frames` set). See docs/strategies.md for measured figures. The exact tier
             and `tile` decode one frame per call, as diffusers; AutoencoderKL (no frames) ignores it.
    max_layer_frames: fast tier, causal video VAEs: None (default), or the most frames a residual
             block, upsampler or causal convolution takes at once, decoding or encoding (at least 2,
             the causal cache's length; the encoder's stride-2 time convolutions always run whole). A layer given more (Wan's decoder gives its highest-resolution
             layers 4 frames per latent frame) runs on parts of at most this many, each part's cache
             being the frames before it: the same values, the activations of fewer frames alive at
             once (less peak memory), more kernel launches in those layers (and, sharded, more halo
             exchanges where a causal convolution alone runs in parts, as the head's).
             None: where the largest rank's frames hold at least 2^18 pixels (fast.PARTS_FROM_PIXELS), the
             upsamplers, and the residual blocks whose convolutions box_conv's kernel runs (Wan 2.1's
             and Qwen-Image's on Hopper GPUs), take parts of 2 frames; each such block's part buffer
             then becomes its convolution's cache, not copied (Wan 2.1 720p on one H200: 1.183
             against 1.198 s and 5.81 against 6.47 GiB); other layers take all their frames.
             Sharded, a layer makes one halo exchange for all its parts (with this setting too), and
             takes default parts only from 3 x 2^17 pixels (fast.SHARDED_PARTS_FROM_PIXELS: where a
             rank's GPU work outpaces the parts' launches) and where it can make that one exchange.
             A number of 4 or more keeps Wan's layers whole at one latent frame per step.
    triton_convs: fast tier, CUDA: the 3x3x3 convolutions where vaeshard's own Triton kernel measured
             faster than cuDNN (Wan 2.1's and Qwen-Image's 96- and 192-channel layers at 720p, and
             sharded by width; see conv_kernel.py) run as that kernel (True, default); False runs
             cuDNN everywhere.
    cuda_graphs: fast tier, causal video VAEs on CUDA: the decoder calls of a request that share
             one shape (all but the first two and a shorter last one) are captured once as a CUDA
             graph and replayed (graphs.py): the same kernels and values, launched by the host
             once per call instead of a few hundred times, so a decode the host paces (small
             frames per rank) goes at the GPU's pace. "auto" (default): where the largest rank's
             output frame is at most graphs.AUTO_MAX_PIXELS pixels (every rank decides alike), as measured (a decode the GPU paces
             ran slower replayed); True: always; False: every call eagerly.
    keep_cuda_graphs: fast tier, with `cuda_graphs`: False (default): a request's graphs and their
             memory are freed when it ends. True: they are kept on the VAE, and the next request of
             the same shapes, settings, process group and weights (a move, a reload or an in-place
             update of the weights starts again) replays them instead of capturing, captures its
             first two decoder calls too, and the requests after it replay every call: no capture
             and almost no host time per request. The cost: the graphs' memory stays held between
             requests, out of reach of other work in the process (the caches and the working set
             of one decoder call; BENCHMARKS.md gives the figures). `vaeshard.release_cuda_graphs(vae)`
             gives it back; so do `unparallelize` and a new `parallelize` call.
    """

    size: int | None = None
    mode: str = "auto"
    output: str = "all"
    timeout: float | timedelta | None = None
    exact: bool = False
    cudnn_benchmark: bool = True
    frames_per_step: int | str = "auto"
    max_layer_frames: int | None = None
    triton_convs: bool = True
    cuda_graphs: bool | str = "auto"
    keep_cuda_graphs: bool = False

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
        if not (isinstance(self.cuda_graphs, bool) or self.cuda_graphs == "auto"):
            raise TypeError(f"cuda_graphs must be True, False or 'auto', got {self.cuda_graphs!r}")
        if not isinstance(self.keep_cuda_graphs, bool):
            raise TypeError(f"keep_cuda_graphs must be True or False, got {self.keep_cuda_graphs!r}")
        if self.keep_cuda_graphs and self.cuda_graphs is False:
            raise ValueError("keep_cuda_graphs=True keeps the CUDA graphs a request replays, and cuda_graphs=False "
                             "replays none: pass cuda_graphs=True or 'auto'")
        if not isinstance(self.cudnn_benchmark, bool):
            raise TypeError(f"cudnn_benchmark must be True or False, got {self.cudnn_benchmark!r}")
        if not isinstance(self.triton_convs, bool):
            raise TypeError(f"triton_convs must be True or False, got {self.triton_convs!r}")
        if self.frames_per_step != "auto" and (isinstance(self.frames_per_step, bool)
                                               or not isinstance(self.frames_per_step, int)):
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
        if self.timeout is not None:
            seconds = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else self.timeout
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {self.timeout!r}")

    @property
    def timeout_seconds(self) -> float | None:
        if self.timeout is None:
            return None
        return self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else float(self.timeout)
