"""Model-agnostic tile-parallel executor: split -> balance -> run local -> gather -> merge.

A family describes its tile grid (`TileGrid`) and how to run one tile; this module spreads the tiles
over ranks, gathers the finished ones and blends them in exactly the order diffusers does, so the
result is bit-identical to the family's single-process tiled decode/encode.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .comm import Comm


@dataclass(frozen=True)
class Tile:
    row: int
    col: int
    h0: int
    h1: int
    w0: int
    w1: int

    @property
    def workload(self) -> int:
        # Cost scales with the tile's area; edge tiles are clipped and so cheaper.
        return (self.h1 - self.h0) * (self.w1 - self.w0)


@dataclass(frozen=True)
class TileGrid:
    """Where the tiles are cut (input coordinates) and how finished tiles are blended (output coordinates)."""

    tiles: tuple[Tile, ...]  # row-major
    num_rows: int
    num_cols: int
    blend_rows: int  # vertical blend extent between a tile and the one above it
    blend_cols: int  # horizontal blend extent between a tile and the one left of it
    keep_rows: int  # rows of each blended tile kept in the result (the output stride)
    keep_cols: int
    out_rows: int  # final crop of the merged result
    out_cols: int

    @classmethod
    def regular(cls, in_rows, in_cols, tile_rows, tile_cols, stride_rows, stride_cols, **merge) -> TileGrid:
        """The grid diffusers cuts: tiles start every `stride` and span `tile` (clipped at the edges)."""
        starts_h = list(range(0, in_rows, stride_rows))
        starts_w = list(range(0, in_cols, stride_cols))
        tiles = tuple(
            Tile(i, j, h, min(h + tile_rows, in_rows), w, min(w + tile_cols, in_cols))
            for i, h in enumerate(starts_h)
            for j, w in enumerate(starts_w)
        )
        return cls(tiles=tiles, num_rows=len(starts_h), num_cols=len(starts_w), **merge)


@dataclass(frozen=True)
class TileOps:
    """What a family supplies to the executor for one request."""

    grid: TileGrid
    source: torch.Tensor  # the tensor the grid cuts: (B, C, T, H, W) or (B, C, H, W)
    run: Callable[[torch.Tensor], torch.Tensor]  # one input tile -> finished tile
    blend_v: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # diffusers' own blend methods
    blend_h: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    finish: Callable[[torch.Tensor], torch.Tensor]  # merged result -> final result (unpatchify, clamp)
    out_shape: Callable[[tuple[int, ...]], tuple[int, ...]]  # input tile shape -> finished tile shape
    out_dtype: torch.dtype
    # what a rank does in place of a tile another rank runs (in grid order, interleaved with its own):
    # e.g. replay the RNG draws that tile's decode makes, so every tile sees diffusers' RNG state
    skip: Callable[[torch.Tensor], None] | None = None


def balance(tiles: tuple[Tile, ...], num_ranks: int) -> list[list[Tile]]:
    """Largest tile first to the least-loaded rank (ties: lower rank). Deterministic on every rank."""
    order = sorted(tiles, key=lambda t: (-t.workload, t.row, t.col))
    heap = [(0, r) for r in range(num_ranks)]
    assignment: list[list[Tile]] = [[] for _ in range(num_ranks)]
    for tile in order:
        load, rank = heapq.heappop(heap)
        assignment[rank].append(tile)
        heapq.heappush(heap, (load + tile.workload, rank))
    for tiles_of_rank in assignment:
        tiles_of_rank.sort(key=lambda t: (t.row, t.col))
    return assignment


def run_tiled(ops: TileOps, comm: Comm, num_ranks: int, to_all: bool) -> torch.Tensor | None:
    """Run the tiles of `ops.source` over ranks 0..num_ranks-1 of `comm` and merge on the receiving ranks.

    Every rank of the group enters the one gather, also a rank with no tile. Returns the finished
    result on receiving ranks (all, or rank 0 only) and None elsewhere.
    """
    grid, x_bcthw = ops.grid, ops.source
    assignment = balance(grid.tiles, num_ranks)
    mine = assignment[comm.rank] if comm.rank < num_ranks else []

    # Every rank knows every tile's output shape from the grid alone, so tiles are padded to one
    # common shape (and each rank to the largest per-rank count) and one gather suffices.
    def in_shape(t: Tile) -> tuple[int, ...]:
        return (*x_bcthw.shape[:-2], t.h1 - t.h0, t.w1 - t.w0)

    out_shapes = {(t.row, t.col): tuple(ops.out_shape(in_shape(t))) for t in grid.tiles}
    lead = next(iter(out_shapes.values()))[:-2]
    max_h = max(s[-2] for s in out_shapes.values())
    max_w = max(s[-1] for s in out_shapes.values())
    max_count = max(len(a) for a in assignment)

    stack = None
    mine_set = set(mine)
    order = grid.tiles if ops.skip is not None else mine
    k = -1
    for t in order:
        if t not in mine_set:
            ops.skip(x_bcthw[..., t.h0 : t.h1, t.w0 : t.w1])
            continue
        k += 1
        out = ops.run(x_bcthw[..., t.h0 : t.h1, t.w0 : t.w1])
        if tuple(out.shape) != out_shapes[(t.row, t.col)]:
            raise RuntimeError(
                f"tile ({t.row}, {t.col}) decoded to shape {tuple(out.shape)}, but the family predicted "
                f"{out_shapes[(t.row, t.col)]}: the family's out_shape does not match this model"
            )
        if stack is None:
            stack = out.new_zeros((max_count, *lead, max_h, max_w))
        stack[k, ..., : out.shape[-2], : out.shape[-1]] = out
        del out
    if stack is None:  # a rank with no tile still enters the gather
        stack = x_bcthw.new_zeros((max_count, *lead, max_h, max_w), dtype=ops.out_dtype)
    gathered = comm.gather_stacks(stack, to_all=to_all)
    del stack
    if gathered is None:
        return None

    by_position: dict[tuple[int, int], torch.Tensor] = {}
    for rank, tiles_of_rank in enumerate(assignment):
        for k, t in enumerate(tiles_of_rank):
            h, w = out_shapes[(t.row, t.col)][-2:]
            by_position[(t.row, t.col)] = gathered[rank][k, ..., :h, :w]
    del gathered
    rows = [[by_position[(i, j)] for j in range(grid.num_cols)] for i in range(grid.num_rows)]
    return ops.finish(merge(rows, grid, ops))


def merge(rows: list[list[torch.Tensor]], grid: TileGrid, ops: TileOps) -> torch.Tensor:
    """Blend each tile with the one above and the one to its left, in diffusers' order and in place."""
    result_rows = []
    for i, row in enumerate(rows):
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = ops.blend_v(rows[i - 1][j], tile, grid.blend_rows)
            if j > 0:
                tile = ops.blend_h(row[j - 1], tile, grid.blend_cols)
            result_row.append(tile[..., : grid.keep_rows, : grid.keep_cols])
        result_rows.append(torch.cat(result_row, dim=-1))
    return torch.cat(result_rows, dim=-2)[..., : grid.out_rows, : grid.out_cols]
