"""How `vaeshard bench` shows what it measured: the table, the JSON record, the plot and its log lines."""

from __future__ import annotations

import json
import os
import sys

from vaeshard import FastOptions

from .bench import GIB, MIB, BenchResult
from .placement import is_main_rank


def bench_log(message: str) -> None:
    if is_main_rank():
        print(f"[bench] {message}", file=sys.stderr, flush=True)


def bench_point(json_path, result) -> None:
    """After each measured point: one line on stderr, and the JSON so far (a cut-short run keeps it)."""
    if not is_main_rank():
        return
    if result.rows:
        r = result.rows[-1]
        bench_log(f"{r['mode']} x{r['nproc']}: {_timed_text(r)} ({r['strategy']})")
    elif result.reference is not None:
        bench_log(f"diffusers x1: {_timed_text(result.reference)}")
    if json_path:
        write_json(result, json_path)


def _timed_text(point: dict) -> str:
    reps = point.get("seconds_reps") or [point["seconds"]]
    return f"{point['seconds']:.3f} s (min {min(reps):.3f}, max {max(reps):.3f})"


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
        fast = options.get("fast") or FastOptions()
        text += "; " + ", ".join(f"{name}={getattr(fast, name)}" for name, *_ in FastOptions.knobs())
    return text


def bench_table(result: BenchResult) -> str:
    unit = "GiB" if result.device == "cuda" else "MiB"
    mem_kind = "allocated" if result.device == "cuda" else "RSS"
    headers = [
        "mode",
        "ranks",
        "strategy",
        "median s",
        "min-max s",
        "vs diffusers",
        "vs 1 rank",
        "util",
        f"peak {mem_kind} {unit}/rank",
        "max|diff|",
        "mean|diff|",
    ]
    reserved = result.device == "cuda"  # what the caching allocator held at most, beside what was allocated
    if reserved:
        headers.insert(9, f"reserved {unit}/rank")
    rows = []
    if result.reference is not None:
        rows.append(
            [
                "diffusers",
                "1",
                "untiled decode",
                f"{result.reference['seconds']:.3f}",
                _spread(result.reference.get("seconds_reps")),
                "1.00x",
                "",
                _fmt(_util(result, result.reference["seconds"], 1), ".1%"),
                _memory_text(result.reference["peak_bytes"], result.device),
                "(reference)",
                "",
            ]
        )
        if reserved:
            rows[-1].insert(9, _memory_text(result.reference.get("peak_reserved_bytes"), result.device))
    for r in result.rows:
        rows.append(
            [
                r["mode"],
                str(r["nproc"]),
                r["strategy"] + (" (fallback)" if r["fallback"] else ""),
                f"{r['seconds']:.3f}",
                _spread(r.get("seconds_reps")),
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
            rows[-1].insert(9, "/".join(_memory_text(b, result.device) for b in per_rank))
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


def _spread(seconds: list[float] | None) -> str:
    """The fastest and slowest timed decode beside the median: how far one run can be from it."""
    return f"{min(seconds):.3f}-{max(seconds):.3f}" if seconds else "-"


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


def read_json(path: str) -> BenchResult:
    """A record `write_json` wrote, as the result it was written from (to show or draw it again)."""
    with open(path) as f:
        return BenchResult(**json.load(f))


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
