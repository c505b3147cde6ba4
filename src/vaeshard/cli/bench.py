"""Measurements behind `vaeshard demo` and `vaeshard bench`, following BENCHMARKING.md.

Every run goes through the public API (`vaeshard.parallelize`, `vaeshard.plan`) on ranks started
by `vaeshard.launch`. Each (mode, ranks) point runs in fresh processes, so one point's peak memory
never includes another's. The reference is diffusers' own single-process decode of the same
weights and latent, measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields

from ..config import FAST_TIER_SETTINGS, MODES, VaeParallelConfig
from .io import ModelSource, named_model

DTYPES = ("bf16", "fp16", "fp32")
MIB = 1024**2
GIB = 1024**3

# BENCHMARKING.md subjects: name -> (named config, latent shape, FLOPs of one decode).
PRESETS = {
    "wan21-480p": ("wan21", (1, 16, 21, 60, 104), 275e12),
    "wan21-720p": ("wan21", (1, 16, 21, 90, 160), 639e12),
    "wan22-720p": ("wan22", (1, 48, 31, 44, 80), 2011e12),
}
H200_BF16_PEAK_TFLOPS = 790.0

# Exactness tolerances of DESIGN.md section 3 for a spatial-shard result vs the untiled decode.
TOLERANCES = {  # (device, dtype) -> (max |diff|, mean |diff| or None)
    ("cpu", "fp32"): (1e-5, None),
    ("cuda", "fp32"): (1e-4, None),
    ("cuda", "bf16"): (5e-2, 2e-3),
}


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_latent(shape, seed: int = 0):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- per-rank measuring ----------------------------------------------------------------------------


class PeakMemory:
    """Peak memory of this rank since `reset()`.

    CUDA: `max_memory_allocated` minus what was allocated at `mark_base()` (BENCHMARKING.md); beside
    it, `max_memory_reserved` minus what was reserved at `reset()` (`peak_reserved_bytes`): what the
    caching allocator held at most, which is what the device must have free.
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


def _timed_decode(ctx, vae, z, together: bool = True):
    """One decode (started together on every rank); returns (sample, seconds on this rank)."""
    if together:
        ctx.barrier()
    ctx.synchronize()
    t0 = time.perf_counter()
    out = vae.decode(z).sample
    ctx.synchronize()
    return out, time.perf_counter() - t0


def _timed_runs(ctx, vae, z, reps: int, memory: "PeakMemory", together: bool):
    """A warm-up, then `reps` timed decodes; returns (last sample, seconds of each on this rank).

    Peak memory counts from after the warm-up; with kept CUDA graphs (`keep_cuda_graphs`), what
    the warm-up left kept for the timed decodes counts too (allocated and reserved from before the
    warm-up). `together`: start each decode with a barrier, so every rank of a parallel decode
    starts at once.
    """
    memory.reset()
    kept = _keeps_graphs(vae)
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
        out, seconds = _timed_decode(ctx, vae, z, together)
        times.append(seconds)
    return out, times


def _diff_stats(out, ref) -> tuple[float, float]:
    d = (out.float() - ref.to(out.device).float()).abs()
    return float(d.max()), float(d.mean())


def _quiet_other_ranks(ctx) -> None:
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
    options: dict = field(default_factory=dict)  # more vaeshard.parallelize arguments (exact, frames_per_step, ...)


def _load_for(ctx, spec: BenchSpec):
    import torch

    if ctx.is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    vae = spec.model.load(dtype=torch_dtype(spec.dtype), device=ctx.device)
    z = make_latent(spec.shape, spec.seed).to(ctx.device, torch_dtype(spec.dtype))
    return vae, z


def _warm_up(vae, z):
    """A short clip of the same spatial size: the per-frame layers see the shapes the timed runs
    see. With kept CUDA graphs, the whole latent twice instead: the first request keeps its steady
    call's graph, the second captures its first two calls, and the timed decodes replay every call
    (a serving loop's first two requests of a size)."""
    if _keeps_graphs(vae):
        vae.decode(z)
        vae.decode(z)
        return
    vae.decode(z[:, :, : min(z.shape[2], 2)])


def _keeps_graphs(vae) -> bool:
    from ..api import config_of

    config = config_of(vae)
    return config is not None and config.keep_cuda_graphs and not config.exact and config.mode != "tile"


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
    return {"times": times, "peak_bytes": peak, "peak_reserved_bytes": reserved, "flops": flops, "out_shape": shape,
            "peak_resettable": memory.resettable}


def _mode_worker(ctx, spec: BenchSpec, mode: str) -> dict:
    import torch

    import vaeshard

    import logging

    vae, z = _load_for(ctx, spec)
    chosen = vaeshard.plan(vae, z.shape, ctx.world, mode)
    logging.getLogger("vaeshard").setLevel(logging.ERROR)  # a fallback shows in the table, not once per decode
    vaeshard.parallelize(vae, mode=mode, timeout=spec.group_timeout, **spec.options)
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
    options: dict = field(default_factory=dict)  # vaeshard.parallelize's other arguments in the timed runs
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
    result so far, so a run cut short still leaves what it measured. `options`: more keyword
    arguments of `vaeshard.parallelize` for the timed runs (exact, cudnn_benchmark, frames_per_step,
    max_layer_frames, cuda_graphs, keep_cuda_graphs), checked here before anything runs.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - {"exact", *_FAST_DEFAULTS})
    if unknown:
        raise ValueError(f"run_bench options take exact, {', '.join(_FAST_DEFAULTS)}; not {', '.join(unknown)}")
    VaeParallelConfig(**options)  # an invalid value fails here, not in every worker
    from . import launch

    log = log or (lambda msg: None)
    flops, flops_source = None, None
    if tflop is not None:
        flops, flops_source = tflop * 1e12, "--tflop"
    elif preset_flops is not None:
        flops, flops_source = preset_flops, "BENCHMARKING.md preset"
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
        result.memory_measure = "torch.cuda.max_memory_allocated after the timed runs minus memory_allocated before them"
    else:
        result.memory_measure = "peak resident set size of the rank's process (getrusage ru_maxrss)"
        if not world:
            result.cpu_threads_per_rank = {n: launch.cpu_threads_per_rank(n) for n in result.nprocs}
    with tempfile.TemporaryDirectory(prefix="vaeshard-bench-") as tmp:
        ref_path = os.path.join(tmp, "reference.pt") if reference else None
        spec = BenchSpec(model, tuple(shape), dtype, device, reps, seed, ref_path, count_flops, group_timeout, options)
        if reference:
            log("reference: diffusers decode, 1 process")
            values = launch.run(_reference_worker, world or 1, spec, device=device, timeout=timeout, group_timeout=group_timeout)
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
                values = launch.run(_mode_worker, nproc, spec, mode, device=device, timeout=timeout, group_timeout=group_timeout)
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

    from .. import __version__

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


# --- reporting -------------------------------------------------------------------------------------


def _memory_text(n: int | None, device: str) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f}" if device == "cuda" else f"{n / MIB:.0f}"


def _fmt(x, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([line.rstrip(), rule, *body])


def _tier_text(options: dict) -> str:
    exact = options.get("exact", False)
    text = f"vaeshard tier: {'exact (exact=True)' if exact else 'fast (default)'}; tile is always exact"
    if not exact:
        text += "; " + ", ".join(f"{k}={options.get(k, v)}" for k, v in _FAST_DEFAULTS.items())
    return text


# the fast tier's settings a bench run may pass on, with VaeParallelConfig's defaults
_FAST_DEFAULTS = {f.name: f.default for f in fields(VaeParallelConfig) if f.name in FAST_TIER_SETTINGS}


def bench_table(result: BenchResult) -> str:
    unit = "GiB" if result.device == "cuda" else "MiB"
    mem_kind = "allocated" if result.device == "cuda" else "RSS"
    headers = [
        "mode",
        "ranks",
        "strategy",
        "median s",
        "vs diffusers",
        "vs 1 rank",
        "util",
        f"peak {mem_kind} {unit}/rank",
        "max|diff|",
        "mean|diff|",
    ]
    reserved = result.device == "cuda"  # what the caching allocator held at most, beside what was allocated
    if reserved:
        headers.insert(8, f"reserved {unit}/rank")
    rows = []
    if result.reference is not None:
        rows.append(
            [
                "diffusers",
                "1",
                "untiled decode",
                f"{result.reference['seconds']:.3f}",
                "1.00x",
                "",
                _fmt(_util(result, result.reference["seconds"], 1), ".1%"),
                _memory_text(result.reference["peak_bytes"], result.device),
                "(reference)",
                "",
            ]
        )
        if reserved:
            rows[-1].insert(8, _memory_text(result.reference.get("peak_reserved_bytes"), result.device))
    for r in result.rows:
        rows.append(
            [
                r["mode"],
                str(r["nproc"]),
                r["strategy"] + (" (fallback)" if r["fallback"] else ""),
                f"{r['seconds']:.3f}",
                _fmt(r["speedup_vs_diffusers"], ".2f", "-") + ("x" if r["speedup_vs_diffusers"] else ""),
                _scaling_text(r),
                _fmt(r["utilisation"], ".1%"),
                "/".join(_memory_text(b, result.device) for b in r["peak_bytes_per_rank"]),
                _fmt(r["max_abs_diff"], ".2e", "-"),
                _fmt(r["mean_abs_diff"], ".2e", "-"),
            ]
        )
        if reserved:
            per_rank = r.get("peak_reserved_bytes_per_rank") or [None]
            rows[-1].insert(8, "/".join(_memory_text(b, result.device) for b in per_rank))
    head = [
        f"vaeshard bench: {result.subject}",
        f"latent {tuple(result.shape)}, {result.dtype} on {result.device}, median of {result.reps} "
        "timed decode(s) after one warm-up; time = slowest rank",
        _tier_text(result.options),
    ]
    if result.flops is not None:
        peak = f" at {result.peak_tflops:g} TFLOP/s per device" if result.peak_tflops else ""
        head.append(f"FLOPs per decode: {result.flops / 1e12:.1f} TFLOP ({result.flops_source}){peak}")
    notes = ["", "strategy reasons (vaeshard.plan):"]
    seen = set()
    for r in result.rows:
        key = (r["mode"], r["nproc"])
        if key not in seen:
            seen.add(key)
            notes.append(f"  {r['mode']} x{r['nproc']}: {r['reason']}")
    if any(r["peak_over_process_life"] for r in result.rows):
        notes.append("  (peak RSS is over each process's life: this system does not allow resetting it)")
    return "\n".join(head + ["", format_table(headers, rows)] + notes)


def _scaling_text(row: dict) -> str:
    if row.get("speedup_vs_1_rank") is None:
        return "-"
    return f"{row['speedup_vs_1_rank']:.2f}x ({row['scaling_efficiency']:.0%})"


def _util(result: BenchResult, seconds: float, nproc: int):
    if result.flops is None or not result.peak_tflops:
        return None
    return result.flops / seconds / (result.peak_tflops * 1e12 * nproc)


def write_json(result: BenchResult, path: str) -> None:
    payload = result.to_json()
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def plot(result: BenchResult, path: str) -> None:
    """Latency and per-rank peak memory against ranks, one line per mode, diffusers as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, scale = ("GiB", GIB) if result.device == "cuda" else ("MiB", MIB)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    nprocs = sorted({r["nproc"] for r in result.rows})
    for mode in dict.fromkeys(r["mode"] for r in result.rows):
        rows = sorted((r for r in result.rows if r["mode"] == mode), key=lambda r: r["nproc"])
        xs = [r["nproc"] for r in rows]
        ax_t.plot(xs, [r["seconds"] for r in rows], marker="o", label=mode)
        ax_m.plot(xs, [max(r["peak_bytes_per_rank"]) / scale for r in rows], marker="o", label=mode)
    if result.reference is not None:
        for ax, y in ((ax_t, result.reference["seconds"]), (ax_m, result.reference["peak_bytes"] / scale)):
            ax.axhline(y, color="grey", linestyle="--", linewidth=1, label="diffusers, 1 process")
    ax_t.set(title="decode latency (slowest rank, median)", xlabel="ranks", ylabel="seconds")
    ax_m.set(title="peak memory per rank (largest rank)", xlabel="ranks", ylabel=unit)
    for ax in (ax_t, ax_m):
        ax.set_xticks(nprocs)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.subject}\nlatent {tuple(result.shape)}, {result.dtype}, {result.device}", fontsize=9)
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


# --- demo ------------------------------------------------------------------------------------------

# Small enough for a 2-core CPU, big enough that the tile grid (32 px tiles, 24 px stride = 4 / 3
# latent rows) has 2 x 3 tiles and both axes split over the ranks; two latent frames exercise the
# causal frame cache. Decodes to 5 frames of 48 x 64.
DEMO_SHAPE = (1, 16, 2, 6, 8)
DEMO_TILE = (32, 24)  # tile size and stride in sample pixels


@dataclass(frozen=True)
class DemoSpec:
    shape: tuple[int, ...]
    dtype: str
    tile: tuple[int, int]
    group_timeout: float


def _set_tiles(vae, tile) -> None:
    size, stride = tile
    vae.tile_sample_min_height = vae.tile_sample_min_width = size
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride


def _demo_worker(ctx, spec: DemoSpec) -> dict:
    import torch

    import vaeshard

    _quiet_other_ranks(ctx)
    vae = named_model("wan21").load(dtype=torch_dtype(spec.dtype), device=ctx.device)
    default_tiles = (vae.tile_sample_min_height, vae.tile_sample_stride_height)
    z = make_latent(spec.shape, seed=1).to(ctx.device, torch_dtype(spec.dtype))
    memory = PeakMemory(ctx)
    rows = []
    with torch.no_grad():
        vae.decode(z[:, :, :1, :2, :2])  # first-call overheads out of the first timed mode
        for mode in MODES:
            _set_tiles(vae, spec.tile if mode == "tile" else default_tiles)
            chosen = vaeshard.plan(vae, z.shape, ctx.world, mode)
            vaeshard.parallelize(vae, mode=mode, timeout=spec.group_timeout)
            memory.reset()
            out, seconds = _timed_decode(ctx, vae, z)
            rows.append(
                {
                    "mode": mode,
                    "strategy": chosen.strategy,
                    "reason": chosen.reason,
                    "seconds": seconds,
                    "peak_bytes": memory.peak_bytes(),
                    "out": out.cpu() if ctx.is_main else None,
                }
            )
        vaeshard.unparallelize(vae)
    return {"rows": rows, "peak_resettable": memory.resettable}


def _demo_references(vae, z, memory):
    import torch

    with torch.no_grad():
        memory.reset()
        t0 = time.perf_counter()
        untiled = vae.decode(z).sample.cpu()
        untiled_s, untiled_mem = time.perf_counter() - t0, memory.peak_bytes()
        _set_tiles(vae, DEMO_TILE)
        memory.reset()
        t0 = time.perf_counter()
        tiled = vae.tiled_decode(z).sample.cpu()
        tiled_s, tiled_mem = time.perf_counter() - t0, memory.peak_bytes()
    return untiled, untiled_s, untiled_mem, tiled, tiled_s, tiled_mem


def run_demo(nproc: int = 2, device: str = "cpu", group_timeout: float = 300.0, timeout: float | None = 600.0, out=print) -> bool:
    """Decode one latent with every mode over `nproc` ranks and check each against diffusers; True if all hold."""
    import torch

    from . import launch

    dtype = "bf16" if device == "cuda" else "fp32"
    spec = DemoSpec(DEMO_SHAPE, dtype, DEMO_TILE, group_timeout)
    world = launch.torchrun_world() or nproc
    backend = "nccl" if device == "cuda" else "gloo"
    out(
        "vaeshard demo: Wan 2.1 VAE architecture (diffusers AutoencoderKLWan default config) with RANDOM weights "
        "(torch.manual_seed(0)), so the video is noise; the point is that every mode matches diffusers."
    )
    out(f"latent {DEMO_SHAPE} (seeded torch.randn), {dtype} on {device}, {world} ranks ({backend})")
    t_start = time.perf_counter()
    values = launch.run(_demo_worker, world, spec, device=device, timeout=timeout, group_timeout=group_timeout)
    if launch.torchrun_env() and int(os.environ["RANK"]) != 0:
        return True
    # The references: plain diffusers, one process (this one), same weights, latent, device and dtype,
    # and on CPU the ranks' thread count: a convolution's result depends on how its work is split.
    ref_device = "cuda:0" if device == "cuda" else "cpu"
    ctx = launch.inline_context(ref_device)
    memory = PeakMemory(ctx)
    vae = named_model("wan21").load(dtype=torch_dtype(dtype), device=ref_device)
    z = make_latent(DEMO_SHAPE, seed=1).to(ref_device, torch_dtype(dtype))
    threads = torch.get_num_threads()
    if device == "cpu" and not launch.torchrun_env():
        torch.set_num_threads(launch.cpu_threads_per_rank(world))
    try:
        references = _demo_references(vae, z, memory)
    finally:
        torch.set_num_threads(threads)
    untiled, untiled_s, untiled_mem, tiled, tiled_s, tiled_mem = references

    max_tol, mean_tol = TOLERANCES.get((device, dtype), (1e-5, None))
    table = [
        ["diffusers decode", "(reference)", "1", f"{untiled_s:.2f}", f"{untiled_mem / MIB:.0f}", "-", "-", ""],
        ["diffusers tiled_decode", "(reference)", "1", f"{tiled_s:.2f}", f"{tiled_mem / MIB:.0f}", "-", "-", ""],
    ]
    ok = untiled.float().std() > 0.01  # real values, never a comparison of zeros
    for i, row in enumerate(values[0]["rows"]):
        peaks = "/".join(f"{v['rows'][i]['peak_bytes'] / MIB:.0f}" for v in values)
        got = row["out"]
        if row["strategy"] == "tile":
            ref, against = tiled, "tiled_decode"
            passed = got.shape == ref.shape and torch.equal(got, ref)
            rule = "torch.equal"
        else:
            ref, against = untiled, "decode"
            diff = (got.float() - ref.float()).abs() if got.shape == ref.shape else None
            passed = diff is not None and diff.max() <= max_tol and (mean_tol is None or diff.mean() <= mean_tol)
            rule = f"<= {max_tol:g}" + (f", mean <= {mean_tol:g}" if mean_tol else "")
        max_diff = (got.float() - ref.float()).abs().max().item() if got.shape == ref.shape else float("nan")
        ok = ok and bool(passed)
        table.append(
            [
                row["mode"],
                row["strategy"],
                str(world),
                f"{max(v['rows'][i]['seconds'] for v in values):.2f}",
                peaks,
                f"{max_diff:.2e}",
                f"{against} ({rule})",
                "PASS" if passed else "FAIL",
            ]
        )
    mem = "peak CUDA MiB/rank" if device == "cuda" else "peak RSS MiB/rank"
    headers = ["mode", "strategy (vaeshard.plan)", "ranks", "seconds", mem, "max|diff|", "compared with", "check"]
    out("")
    out(format_table(headers, table))
    out("")
    for row in values[0]["rows"]:
        out(f"  {row['mode']}: {row['reason']}")
    if not values[0]["peak_resettable"]:
        out("  (peak RSS is over each process's life: this system does not allow resetting it)")
    out("")
    total = time.perf_counter() - t_start
    out(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} ({total:.1f} s)")
    return ok


__all__ = [
    "BenchResult",
    "DEMO_SHAPE",
    "PRESETS",
    "TOLERANCES",
    "bench_table",
    "environment",
    "format_table",
    "plot",
    "run_bench",
    "run_demo",
    "write_json",
]
