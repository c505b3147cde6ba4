#!/usr/bin/env python3
"""docs/strategies.md's communication figure: what benchmarks/comm_model.py predicts a
spatial_shard_height decode exchanges per rank, and its predicted time, on 1-8 GPUs, for each family
at its common resolution. A model's prediction, not a measurement: it reads the model's committed
output (docs/figures/comm-model.json; rerun `python3 benchmarks/comm_model.py --json
...` to refresh it).

    python3 docs/figures/comm.py [OUT_DIR]      # default: docs/figures
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "figures" / "comm-model.json"  # the model's output: a prediction, not a record


def main(out_dir: Path) -> Path:
    model = json.loads(RECORD.read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.6))
    colors = plt.cm.tab20.colors  # one colour per family: more families than the default cycle's ten
    for n, preset in enumerate(model["presets"]):
        ranks = [row["ranks"] for row in preset["rows"]]
        sent = [(row["ranks"], row["link_bytes"] / 2**30) for row in preset["rows"] if row["ranks"] > 1]  # (1: none)
        label = f"{preset['preset']} {tuple(preset['latent'])}"
        (line,) = left.plot(*zip(*sent), marker="o", markersize=3, color=colors[n % len(colors)], label=label)
        if preset["one_gpu_s"] is not None:
            times = [row["time_s"] for row in preset["rows"]]
            right.plot(ranks, times, marker="o", markersize=3, color=line.get_color(), label=preset["preset"])
    bandwidth = model["link_bytes_per_s"] / 1e9
    left.set(xlabel="ranks (GPUs)", ylabel="GiB sent per rank (busiest rank)", yscale="log",
             title="Bytes per rank, per decode")  # fmt: skip
    right.set(xlabel="ranks (GPUs)", ylabel="seconds", yscale="log",
              title=f"Predicted time: 1-GPU / N + bytes at {bandwidth:.0f} GB/s\n"
              f"+ {model['latency_s'] * 1e6:.0f} us per operation")  # fmt: skip
    for ax in (left, right):
        ax.set_xticks(range(1 if ax is right else 2, 9))
        ax.grid(alpha=0.3)
    left.legend(fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    right.legend(fontsize=7, frameon=False)
    fig.suptitle("MODEL PREDICTION, not a measurement: spatial_shard_height, bf16 (benchmarks/comm_model.py)",
                 fontsize=10)  # fmt: skip
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.8, wspace=0.62)
    out = out_dir / "comm-model.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent))
