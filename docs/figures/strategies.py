#!/usr/bin/env python3
"""docs/strategies.md's figure: how `tile`, `spatial_shard_height` and `spatial_shard_width` split one
latent frame over ranks, drawn from vaeshard's own code: diffusers' tile grid and its balance over the
ranks (runtime/tile.py), and the slices of a spatial shard (runtime/spatial.py).

    python3 docs/figures/strategies.py [OUT_DIR]      # default: docs/figures
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from vaeshard.runtime.spatial import split_extents
from vaeshard.runtime.tile import TileGrid, balance

# Wan 2.1 at 480p: a 60 x 104 latent frame (480 x 832 pixels); diffusers' tiles of 256 pixels every 192,
# 32 latent rows every 24 (spatial factor 8); four ranks
ROWS, COLS, TILE, STRIDE, RANKS = 60, 104, 32, 24, 4
COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")


def _frame(ax, title: str) -> None:
    ax.set_xlim(0, COLS)
    ax.set_ylim(ROWS, 0)  # row 0 at the top, as an image
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("latent columns", fontsize=8)
    ax.tick_params(labelsize=7)


def _tile(ax) -> None:
    grid = TileGrid.regular(ROWS, COLS, TILE, TILE, STRIDE, STRIDE, blend_rows=0, blend_cols=0, keep_rows=0,
                            keep_cols=0, out_rows=0, out_cols=0)  # fmt: skip
    for rank, tiles in enumerate(balance(grid.tiles, RANKS)):
        for t in tiles:
            ax.add_patch(Rectangle((t.w0, t.h0), t.w1 - t.w0, t.h1 - t.h0, facecolor=COLOURS[rank], alpha=0.35,
                                   edgecolor=COLOURS[rank], linewidth=1.2))  # fmt: skip
            ax.text((t.w0 + min(t.w0 + STRIDE, t.w1)) / 2, (t.h0 + min(t.h0 + STRIDE, t.h1)) / 2, str(rank),
                    ha="center", va="center", fontsize=8, color=COLOURS[rank], weight="bold")  # fmt: skip
    _frame(ax, f"tile: {len(grid.tiles)} tiles, largest first to the least-loaded rank\n(darker: the overlaps, "
           "decoded by each tile and blended)")  # fmt: skip
    ax.set_ylabel("latent rows", fontsize=8)


def _shard(ax, axis: str) -> None:
    extent = ROWS if axis == "height" else COLS
    start = 0
    for rank, size in enumerate(split_extents(extent, RANKS)):
        box = (0, start, COLS, size) if axis == "height" else (start, 0, size, ROWS)
        ax.add_patch(Rectangle(box[:2], *box[2:], facecolor=COLOURS[rank], alpha=0.35, edgecolor=COLOURS[rank]))
        middle = start + size / 2
        where = (COLS / 2, middle) if axis == "height" else (middle, ROWS / 2)
        label = f"rank {rank}\n{size} {'rows' if axis == 'height' else 'columns'}"
        ax.text(*where, label, ha="center", va="center", fontsize=8, color=COLOURS[rank])
        if rank:  # the halo: each side's edge row (column), sent to its neighbour before every convolution
            halo = (0, start - 1, COLS, 2) if axis == "height" else (start - 1, 0, 2, ROWS)
            ax.add_patch(Rectangle(halo[:2], *halo[2:], facecolor="none", edgecolor="black", hatch="////", lw=0))
        start += size
    edge = "rows" if axis == "height" else "columns"
    _frame(ax, f"spatial_shard_{axis}: one slice per rank\n(hatched: the edge {edge} neighbours exchange)")


def main(out_dir: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    _tile(axes[0])
    _shard(axes[1], "height")
    _shard(axes[2], "width")
    fig.suptitle(f"One Wan 2.1 480p latent frame ({ROWS} x {COLS}) over {RANKS} ranks", fontsize=11)
    fig.legend(handles=[Patch(color=c, alpha=0.5, label=f"rank {r}") for r, c in enumerate(COLOURS)], ncol=RANKS,
               loc="lower center", fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out = out_dir / "strategies.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent))
