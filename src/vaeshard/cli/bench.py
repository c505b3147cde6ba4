"""The measurements behind `vaeshard bench`, by the protocol of BENCHMARKS.md.

Every run goes through the public API (`vaeshard.parallelize`, `vaeshard.plan`) on ranks started
by cli/launch.py. Each (mode, ranks) point runs in fresh processes, so one point's peak memory
never includes another's. The reference is diffusers' own single-process decode of the same
weights and latent, measured in the same run. cli/report.py shows the results.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from vaeshard import MODES, FastOptions

from .io import ModelSource

DTYPES = ("bf16", "fp16", "fp32")
MIB = 1024**2
GIB = 1024**3

# BENCHMARKS.md's subjects: name -> (named config, latent shape, FLOPs of one decode).
PRESETS = {
    "wan21-480p": ("wan21", (1, 16, 21, 60, 104), 275e12),
    "wan21-720p": ("wan21", (1, 16, 21, 90, 160), 639e12),
    "wan22-720p": ("wan22", (1, 48, 31, 44, 80), 2011e12),
}
H200_BF16_PEAK_TFLOPS = 790.0

# The demo's exactness check of a spatial-shard result against diffusers' untiled decode in the
# same dtype (README, "Exactness"): max |diff|. In bf16 that is one part of the bf16 rule (within
# 5e-2 of diffusers' bf16 output); its other parts compare with an fp32 decode (benchmarks/gpu_parity.py).
TOLERANCES = {("cpu", "fp32"): 1e-5, ("cuda", "fp32"): 1e-4, ("cuda", "bf16"): 5e-2}


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_latent(shape, seed: int = 0):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- per-rank measuring ----------------------------------------------------------------------------


class PeakMemory:
    """Peak memory of this rank since `reset()`.

    CUDA: `max_memory_allocated` minus what was allocated at `mark_base()` (BENCHMARKS.md,
    "Protocol"); beside it, `max_memory_reserved` minus what was reserved at `reset()`
    (`peak_reserved_bytes`): what the caching allocator held at most, which is what the device must
    have free.
    CPU: the process's peak resident set (getrusage max RSS); `reset()` lowers the high-water mark
    to the current RSS where Linux allows it (/proc/self/clear_refs), otherwise the peak is over
    the process's life so far (`resettable` says which).
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.base = 0
        self.reserved_base = 0
        self.resettable = True

    def reset(self) -> None:
        import torch

        if self.ctx.is_cuda:
            torch.cuda.synchronize(self.ctx.device)
            torch.cuda.reset_peak_memory_stats(self.ctx.device)
            self.reserved_base = torch.cuda.memory_reserved(self.ctx.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False

    def reset_peak(self) -> None:
        """Only the high-water marks, not the reserved base (CUDA; the CPU's cannot be reset apart)."""
        import torch

        if self.ctx.is_cuda:
            torch.cuda.synchronize(self.ctx.device)
            torch.cuda.reset_peak_memory_stats(self.ctx.device)
            return
        self.reset()

    def mark_base(self) -> None:
        import torch

        if self.ctx.is_cuda:
            torch.cuda.synchronize(self.ctx.device)
            self.base = torch.cuda.memory_allocated(self.ctx.device)

    def peak_bytes(self) -> int:
        import torch

        if self.ctx.is_cuda:
            torch.cuda.synchronize(self.ctx.device)
            return int(torch.cuda.max_memory_allocated(self.ctx.device) - self.base)
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB

    def peak_reserved_bytes(self) -> int | None:
        import torch

        if not self.ctx.is_cuda:
            return None
        torch.cuda.synchronize(self.ctx.device)
        return int(torch.cuda.max_memory_reserved(self.ctx.device) - self.reserved_base)


def timed_decode(ctx, vae, z, together: bool = True):
    """One decode (started together on every rank); returns (sample, seconds on this rank)."""
    if together:
        ctx.barrier()
    ctx.synchronize()
    t0 = time.perf_counter()
    out = vae.decode(z).sample
    ctx.synchronize()
    return out, time.perf_counter() - t0


def _timed_runs(ctx, vae, z, reps: int, memory: PeakMemory, together: bool):
    """A warm-up, then `reps` timed decodes; returns (last sample, seconds of each on this rank).

    Peak memory counts from after the warm-up; with kept CUDA graphs (`keep_cuda_graphs`), what
    the warm-up left kept for the timed decodes counts too (allocated and reserved from before the
    warm-up). `together`: start each decode with a barrier, so every rank of a parallel decode
    starts at once.
    """
    memory.reset()
    kept = _keeps_graphs(vae, z)
    if kept:
        memory.mark_base()
    _warm_up(vae, z)
    if kept:
        memory.reset_peak()
    else:
        memory.mark_base()
    out, times = None, []
    for _ in range(reps):
        del out
        out, seconds = timed_decode(ctx, vae, z, together)
        times.append(seconds)
    return out, times


def _diff_stats(out, ref) -> tuple[float, float]:
    d = (out.float() - ref.to(out.device).float()).abs()
    return float(d.max()), float(d.mean())


def quiet_other_ranks(ctx) -> None:
    import logging
    import warnings

    if not ctx.is_main:
        logging.getLogger("vaeshard").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")


# --- bench -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchSpec:
    model: ModelSource
    shape: tuple[int, ...]
    dtype: str
    device: str
    reps: int
    seed: int
    ref_path: str | None  # where the reference run leaves its output for the other runs to compare
    count_flops: bool = False
    group_timeout: float = 600.0
    options: dict = field(default_factory=dict)  # vaeshard.parallelize's exact and fast


def _load_for(ctx, spec: BenchSpec):
    import torch

    if ctx.is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    vae = spec.model.load(dtype=torch_dtype(spec.dtype), device=ctx.device)
    z = make_latent(spec.shape, spec.seed).to(ctx.device, torch_dtype(spec.dtype))
    # the global RNG alike in every process (a fresh one's is seeded at random): a decoder that draws
    # noise from it (LTX-2.5's diffusion decoder, LTX-Video's noise injection) draws the same noise in
    # diffusers' reference decode and on every rank, whose request agreement requires it
    torch.manual_seed(spec.seed)
    return vae, z


def _warm_up(vae, z):
    """A short clip of the same spatial size: the per-frame layers see the shapes the timed runs
    see. With kept CUDA graphs, the whole latent twice instead: the first request keeps its steady
    call's graph, the second captures its first two calls, and the timed decodes replay every call
    (a serving loop's first two requests of a size)."""
    if _keeps_graphs(vae, z):
        vae.decode(z)
        vae.decode(z)
        return
    vae.decode(z[:, :, : _warm_up_frames(vae, z.shape[2])] if z.dim() == 5 else z)


def _warm_up_frames(vae, frames: int) -> int:
    """Latent frames of the warm-up clip: 2, or where a clip that short decodes to no frame (MiniMax-H3
    decodes whole clips: at least one clip less its token_drop), the fewest that decode to one."""
    import vaeshard

    facts = vaeshard.shape_facts(type(vae).__name__, dict(vae.config))
    short = min(frames, 2)
    while short < frames and facts.frames_out(short) == 0:
        short += 1
    return short


def _keeps_graphs(vae, z) -> bool:
    """Whether decoding `z` is asked to keep its CUDA graphs for the next request (a parallelized VAE
    with FastOptions(keep_cuda_graphs=True) in the fast tier)."""
    import vaeshard

    fast = vaeshard.plan(vae, z.shape).fast
    return fast is not None and fast.keep_cuda_graphs


def _reference_worker(ctx, spec: BenchSpec) -> dict | None:
    """diffusers' own untiled decode in one process (rank 0 only under torchrun)."""
    if not ctx.is_main:
        return None
    import torch

    vae, z = _load_for(ctx, spec)
    memory = PeakMemory(ctx)
    with torch.no_grad():
        # one process: no barrier (under torchrun the other ranks are not decoding)
        out, times = _timed_runs(ctx, vae, z, spec.reps, memory, together=False)
        peak = memory.peak_bytes()
        reserved = memory.peak_reserved_bytes()
        if spec.ref_path:
            torch.save(out.cpu(), spec.ref_path)
        shape = tuple(out.shape)
        del out
        flops = None
        if spec.count_flops:
            from torch.utils.flop_counter import FlopCounterMode

            with FlopCounterMode(display=False) as counter:
                vae.decode(z)
            flops = float(counter.get_total_flops())
    return {
        "times": times,
        "peak_bytes": peak,
        "peak_reserved_bytes": reserved,
        "flops": flops,
        "out_shape": shape,
        "peak_resettable": memory.resettable,
    }


def _mode_worker(ctx, spec: BenchSpec, mode: str) -> dict:
    import logging

    import torch

    import vaeshard

    vae, z = _load_for(ctx, spec)
    chosen = vaeshard.plan(vae, z.shape, ctx.world, mode)
    logging.getLogger("vaeshard").setLevel(logging.ERROR)  # a fallback shows in the table, not once per decode
    vaeshard.parallelize(vae, mode, timeout=spec.group_timeout, **spec.options)
    memory = PeakMemory(ctx)
    with torch.no_grad():
        out, times = _timed_runs(ctx, vae, z, spec.reps, memory, together=True)
        peak = memory.peak_bytes()
        reserved = memory.peak_reserved_bytes()
        diff = None
        if ctx.is_main and spec.ref_path and os.path.exists(spec.ref_path):
            diff = _diff_stats(out, torch.load(spec.ref_path, map_location=ctx.device))
    return {
        "rank": ctx.rank,
        "times": times,
        "peak_bytes": peak,
        "peak_reserved_bytes": reserved,
        "strategy": chosen.strategy,
        "reason": chosen.reason,
        "fallback": chosen.fallback,
        "diff": diff,
        "peak_resettable": memory.resettable,
    }


@dataclass
class BenchResult:
    subject: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    reps: int
    flops: float | None
    flops_source: str | None
    peak_tflops: float | None
    reference: dict | None
    modes: list[str] = field(default_factory=list)
    nprocs: list[int] = field(default_factory=list)
    output: str = "all"  # vaeshard.parallelize's output placement in the timed runs
    options: dict = field(default_factory=dict)  # vaeshard.parallelize's exact and fast in the timed runs
    memory_measure: str = ""
    cpu_threads_per_rank: dict = field(default_factory=dict)  # ranks -> torch threads of each rank (CPU)
    rows: list[dict] = field(default_factory=list)
    environment: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def run_bench(
    model: ModelSource,
    shape,
    *,
    modes=MODES,
    nprocs=(1, 2),
    dtype: str = "fp32",
    device: str = "cpu",
    reps: int = 3,
    reference: bool = True,
    tflop: float | None = None,
    preset_flops: float | None = None,
    peak_tflops: float | None = None,
    seed: int = 0,
    group_timeout: float = 600.0,
    timeout: float | None = None,
    options: dict | None = None,
    log=None,
    on_point=None,
) -> BenchResult:
    """Measure every (mode, ranks) point and, unless `reference` is False, diffusers' own decode.

    `on_point(result)`, when given, is called after the reference and after each point with the
    result so far, so a run cut short still leaves what it measured. `options`: `vaeshard.parallelize`'s
    `exact` and `fast` (a FastOptions) for the timed runs, checked here before anything runs.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - {"exact", "fast"})
    if unknown:
        raise ValueError(f"run_bench options take exact and fast (a vaeshard.FastOptions); not {', '.join(unknown)}")
    if not isinstance(options.setdefault("fast", FastOptions()), FastOptions):
        raise TypeError(f"run_bench's fast option is a vaeshard.FastOptions, got {type(options['fast']).__name__}")
    options.setdefault("exact", False)
    from . import launch

    log = log or (lambda msg: None)
    flops, flops_source = None, None
    if tflop is not None:
        flops, flops_source = tflop * 1e12, "--tflop"
    elif preset_flops is not None:
        flops, flops_source = preset_flops, "BENCHMARKS.md subject"
    count_flops = flops is None and peak_tflops is not None and reference

    result = BenchResult(
        subject=model.description,
        shape=tuple(shape),
        dtype=dtype,
        device=device,
        reps=reps,
        flops=flops,
        flops_source=flops_source,
        peak_tflops=peak_tflops,
        reference=None,
        options=options,
        environment=environment(device),
    )
    world = launch.torchrun_world()
    result.modes, result.nprocs = list(modes), [world] if world else list(nprocs)
    if device == "cuda":
        result.memory_measure = (
            "torch.cuda.max_memory_allocated after the timed runs minus memory_allocated before them"
        )
    else:
        result.memory_measure = "peak resident set size of the rank's process (getrusage ru_maxrss)"
        if not world:
            result.cpu_threads_per_rank = {n: launch.cpu_threads_per_rank(n) for n in result.nprocs}
    with tempfile.TemporaryDirectory(prefix="vaeshard-bench-") as tmp:
        ref_path = os.path.join(tmp, "reference.pt") if reference else None
        spec = BenchSpec(model, tuple(shape), dtype, device, reps, seed, ref_path, count_flops, group_timeout, options)
        if reference:
            log("reference: diffusers decode, 1 process")
            values = launch.run(
                _reference_worker, world or 1, spec, device=device, timeout=timeout, group_timeout=group_timeout
            )
            ref = values[0]
            result.reference = {
                "seconds": statistics.median(ref["times"]),
                "seconds_reps": ref["times"],
                "peak_bytes": ref["peak_bytes"],
                "peak_reserved_bytes": ref["peak_reserved_bytes"],  # CUDA only (else None)
                "out_shape": list(ref["out_shape"]),
                "peak_over_process_life": not ref["peak_resettable"],
            }
            if ref["flops"] is not None:
                result.flops, result.flops_source = ref["flops"], "FlopCounterMode"
            if on_point is not None:
                on_point(result)
        for nproc in result.nprocs:
            for mode in modes:
                log(f"{mode}: {nproc} rank(s)")
                values = launch.run(
                    _mode_worker, nproc, spec, mode, device=device, timeout=timeout, group_timeout=group_timeout
                )
                result.rows.append(_summarise(values, mode, nproc, result))
                _add_scaling(result.rows)
                if on_point is not None:
                    on_point(result)
    return result


def _add_scaling(rows: list[dict]) -> None:
    """Speed-up of each point over the same mode on one rank, and that speed-up per rank."""
    one = {r["mode"]: r["seconds"] for r in rows if r["nproc"] == 1}
    for r in rows:
        base = one.get(r["mode"])
        r["speedup_vs_1_rank"] = base / r["seconds"] if base else None
        r["scaling_efficiency"] = base / r["seconds"] / r["nproc"] if base else None


def _summarise(values: list[dict], mode: str, nproc: int, result: BenchResult) -> dict:
    reps = len(values[0]["times"])
    per_rep = [max(v["times"][i] for v in values) for i in range(reps)]  # the slowest rank sets the pace
    seconds = statistics.median(per_rep)
    main = values[0]
    row = {
        "mode": mode,
        "nproc": nproc,
        "strategy": main["strategy"],
        "reason": main["reason"],
        "fallback": main["fallback"],
        "seconds": seconds,
        "seconds_reps": per_rep,
        "seconds_per_rank": [v["times"] for v in values],
        "peak_bytes_per_rank": [v["peak_bytes"] for v in values],
        "peak_reserved_bytes_per_rank": [v["peak_reserved_bytes"] for v in values],  # CUDA only (else None)
        "peak_over_process_life": not all(v["peak_resettable"] for v in values),
        "speedup_vs_diffusers": None,
        "utilisation": None,
        "max_abs_diff": None,
        "mean_abs_diff": None,
    }
    if result.reference is not None:
        row["speedup_vs_diffusers"] = result.reference["seconds"] / seconds
    if result.flops is not None and result.peak_tflops:
        row["utilisation"] = result.flops / seconds / (result.peak_tflops * 1e12 * nproc)
    if main["diff"] is not None:
        row["max_abs_diff"], row["mean_abs_diff"] = main["diff"]
    return row


def environment(device: str) -> dict:
    import diffusers
    import torch

    from vaeshard import __version__

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "diffusers": diffusers.__version__,
        "vaeshard": __version__,
        "device": device,
        "cpu_count": os.cpu_count(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "tf32": False if device == "cuda" else None,  # the workers switch TF32 off for fp32 runs
    }
    return env


__all__ = ["BenchResult", "PRESETS", "TOLERANCES", "environment", "run_bench"]
