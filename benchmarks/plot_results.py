#!/usr/bin/env python3
"""Latency and per-rank peak memory against GPU count, per mode, from `vaeshard bench --json` files.

    python3 benchmarks/plot_results.py OUT.png TITLE RUN.json [RUN.json ...] [--anchors ANCHORS.jsonl]

Merges several bench runs (e.g. a 1-GPU and a 2-GPU run of one subject); diffusers' single-GPU
decode and the anchors (other libraries, same machine and day) are drawn as reference points.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GIB = 1024**3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("title")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--anchors", default=None)
    args = ap.parse_args()

    series = defaultdict(dict)  # mode -> nproc -> (seconds, peak GiB)
    diffusers = None
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        ref = run.get("reference")
        if ref:
            diffusers = (ref["seconds"], ref["peak_bytes"] / GIB)
        for row in run["rows"]:
            series[row["mode"]][row["nproc"]] = (row["seconds"], max(row["peak_bytes_per_rank"]) / GIB)
    anchors = []
    if args.anchors:
        with open(args.anchors) as f:
            lines = f.read().splitlines()
        for line in filter(None, lines):
            a = json.loads(line)
            if a["mode"] == "plain":
                continue
            label = f"{a['impl']} {a['mode']}" + (f" + {a['fastpath']}" if a.get("fastpath") else "")
            anchors.append((label, a["world_size"], a["median_s"], max(a["peak_mem_bytes"]) / GIB))

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, points in sorted(series.items()):
        ranks = sorted(points)
        ax_t.plot(ranks, [points[r][0] for r in ranks], "o-", label=f"vaeshard {mode}")
        ax_m.plot(ranks, [points[r][1] for r in ranks], "o-", label=f"vaeshard {mode}")
    for label, ranks, seconds, mem in anchors:
        ax_t.plot([ranks], [seconds], "x", markersize=9, label=label)
        ax_m.plot([ranks], [mem], "x", markersize=9, label=label)
    if diffusers:
        ax_t.axhline(diffusers[0], color="grey", ls="--", label="diffusers, 1 GPU")
        ax_m.axhline(diffusers[1], color="grey", ls="--", label="diffusers, 1 GPU")
    for ax, ylabel in ((ax_t, "median seconds per decode"), (ax_m, "peak allocated GiB per rank")):
        ax.set_xlabel("GPUs")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({r for p in series.values() for r in p} | {a[1] for a in anchors}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax_m.legend(fontsize=7, loc="lower left")
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
