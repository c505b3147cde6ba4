"""Model-agnostic tile-parallel executor: split -> balance -> run local -> gather -> merge.

A family describes its tile grid (`TileGrid`) and how to run one tile; this module spreads the tiles
over ranks, gathers the finished ones and blends them in exactly the order diffusers does, so the
result is bit-identical to the family's single-process tiled decode/encode. Where diffusers also
tiles in time (`TimeChunks`: HunyuanVideo's temporal tiled decode), the grid is cut in every chunk
of frames, the tiles of all chunks are spread over the ranks together, each chunk's tiles are
merged as one grid and the chunks are then merged in time by the family's mirror of diffusers' loop.
One process alone runs and merges the chunks one after the other, holding one chunk's tiles at a
time as diffusers' loop does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from . import requests
from .comm import Comm


@dataclass(frozen=True)
class Tile:
    row: int
    col: int
    h0: int
    h1: int
    w0: int
    w1: int
    chunk: int = 0  # the time chunk (TimeChunks) the tile is cut from; 0 without one
    t0: int = 0  # frames [t0, t1) of the source in a time chunk; t1 None: every frame
    t1: int | None = None

    @property
    def workload(self) -> int:
        # Cost scales with the tile's area (and frames); edge tiles are clipped and so cheaper.
        frames = 1 if self.t1 is None else self.t1 - self.t0
        return (self.h1 - self.h0) * (self.w1 - self.w0) * frames

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.chunk, self.row, self.col)

    def cut(self, x: torch.Tensor) -> torch.Tensor:
        """The tile's input: its rows and columns of `x` (and its frames, in a time chunk)."""
        if self.t1 is None:
            return x[..., self.h0 : self.h1, self.w0 : self.w1]
        return x[..., self.t0 : self.t1, self.h0 : self.h1, self.w0 : self.w1]

    def in_shape(self, shape) -> tuple[int, ...]:
        """The shape of the tile's input, cut from a source of `shape`."""
        if self.t1 is None:
            return (*shape[:-2], self.h1 - self.h0, self.w1 - self.w0)
        return (*shape[:-3], self.t1 - self.t0, self.h1 - self.h0, self.w1 - self.w0)


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
class TimeChunks:
    """diffusers' tiling in time: the source's frames [t0, t1) of each span, in order, are tiled as
    one grid each; `merge` takes the merged chunks in order and blends them in time as diffusers'
    loop does (a family's mirror of it, with the VAE's own blend)."""

    spans: tuple[tuple[int, int], ...]  # frames (dim -3 of the source)
    merge: Callable[[list[torch.Tensor]], torch.Tensor]


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
    # diffusers' tiling in time around the grid (None: the grid covers every frame at once)
    time: TimeChunks | None = None
    # the family's merge of one grid's finished tiles (rows of tiles, row-major), in place of `merge`:
    # diffusers' own stitch where its overlaps differ from boundary to boundary (MiniMax-H3)
    stitch: Callable[[list[list[torch.Tensor]]], torch.Tensor] | None = None
    # several input tiles of one shape -> their finished tiles, in one call: the fast tier's batch, used
    # where the request runs the fast tier; None (or the exact tier): one tile at a time through `run`
    run_many: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None

    def all_tiles(self) -> tuple[Tile, ...]:
        """The grid's tiles, once per time chunk where there are chunks (chunk by chunk, row-major)."""
        if self.time is None:
            return self.grid.tiles
        return tuple(
            replace(t, chunk=c, t0=t0, t1=t1) for c, (t0, t1) in enumerate(self.time.spans) for t in self.grid.tiles
        )


def balance(tiles: tuple[Tile, ...], num_ranks: int) -> list[list[Tile]]:
    """Largest tile first to the least-loaded rank (ties: lower rank). Deterministic on every rank."""
    order = sorted(tiles, key=lambda t: (-t.workload, *t.key))
    heap = [(0, r) for r in range(num_ranks)]
    assignment: list[list[Tile]] = [[] for _ in range(num_ranks)]
    for tile in order:
        load, rank = heapq.heappop(heap)
        assignment[rank].append(tile)
        heapq.heappush(heap, (load + tile.workload, rank))
    for tiles_of_rank in assignment:
        tiles_of_rank.sort(key=lambda t: t.key)
    return assignment


def run_tiled(ops: TileOps, comm: Comm, num_ranks: int, to_all: bool) -> torch.Tensor | None:
    """Run the tiles of `ops.source` over ranks 0..num_ranks-1 of `comm` and merge on the receiving ranks.

    Every rank of the group enters the one gather, also a rank with no tile. Returns the finished
    result on receiving ranks (all, or rank 0 only) and None elsewhere.
    """
    grid, x_bcthw = ops.grid, ops.source
    tiles = ops.all_tiles()
    out_shapes = {t.key: tuple(ops.out_shape(t.in_shape(x_bcthw.shape))) for t in tiles}
    if comm.world == 1:
        return _run_alone(ops, tiles, out_shapes)
    assignment = balance(tiles, num_ranks)
    mine = assignment[comm.rank] if comm.rank < num_ranks else []

    # Every rank knows every tile's output shape from the grid alone, so tiles are padded to one
    # common shape (and each rank to the largest per-rank count) and one gather suffices.
    common = tuple(max(dims) for dims in zip(*out_shapes.values()))
    max_count = max(len(a) for a in assignment)

    def within(shape) -> tuple[slice, ...]:
        return tuple(slice(0, n) for n in shape)

    stack = None
    mine_set = set(mine)
    order = tiles if ops.skip is not None else mine
    batched = _run_batched(ops, mine, x_bcthw) if _batches(ops) else None
    k = -1
    for t in order:
        if t not in mine_set:
            ops.skip(t.cut(x_bcthw))
            continue
        k += 1
        out = _checked(t, batched.pop(t.key) if batched is not None else ops.run(t.cut(x_bcthw)), out_shapes)
        if stack is None:
            stack = out.new_zeros((max_count, *common))
        stack[k][within(out.shape)] = out
        del out
    if stack is None:  # a rank with no tile still enters the gather
        stack = x_bcthw.new_zeros((max_count, *common), dtype=ops.out_dtype)
    gathered = comm.gather_stacks(stack, to_all=to_all)
    del stack
    if gathered is None:
        return None

    by_position: dict[tuple[int, int, int], torch.Tensor] = {}
    for rank, tiles_of_rank in enumerate(assignment):
        for k, t in enumerate(tiles_of_rank):
            by_position[t.key] = gathered[rank][k][within(out_shapes[t.key])]
    del gathered

    def merged(chunk: int) -> torch.Tensor:
        rows = [[by_position[(chunk, i, j)] for j in range(grid.num_cols)] for i in range(grid.num_rows)]
        return ops.stitch(rows) if ops.stitch is not None else merge(rows, grid, ops)

    if ops.time is None:
        return ops.finish(merged(0))
    return ops.finish(ops.time.merge([merged(c) for c in range(len(ops.time.spans))]))


def _run_alone(ops: TileOps, tiles: tuple[Tile, ...], out_shapes) -> torch.Tensor:
    """One process runs every tile: time chunk by time chunk, each chunk's tiles merged as soon as they
    are done and then let go, as diffusers' own loop holds them (the one gather of several ranks needs
    every tile at once). The same tiles, in the same order, merged the same way."""
    x, grid = ops.source, ops.grid
    merged = []
    for chunk in range(1 if ops.time is None else len(ops.time.spans)):
        mine = [t for t in tiles if t.chunk == chunk]
        batched = _run_batched(ops, mine, x) if _batches(ops) else None
        done = {t.key: _checked(t, batched.pop(t.key) if batched is not None else ops.run(t.cut(x)), out_shapes)
                for t in mine}  # fmt: skip
        rows = [[done[(chunk, i, j)] for j in range(grid.num_cols)] for i in range(grid.num_rows)]
        del done
        merged.append(ops.stitch(rows) if ops.stitch is not None else merge(rows, grid, ops))
        del rows
    return ops.finish(merged[0] if ops.time is None else ops.time.merge(merged))


def _batches(ops: TileOps) -> bool:
    """Whether this request runs a rank's tiles of one shape as batches (`TileOps.run_many`): the fast
    tier, where no tile's decode draws from the RNG (`skip`)."""
    request = requests.current()
    return request is not None and request.fast is not None and ops.run_many is not None and ops.skip is None


def _checked(t: Tile, out: torch.Tensor, out_shapes) -> torch.Tensor:
    if tuple(out.shape) != out_shapes[t.key]:
        where = f"({t.row}, {t.col})" if t.t1 is None else f"({t.row}, {t.col}) of time chunk {t.chunk}"
        raise RuntimeError(
            f"tile {where} decoded to shape {tuple(out.shape)}, but the family predicted "
            f"{out_shapes[t.key]}: the family's out_shape does not match this model"
        )
    return out


def _run_batched(ops: TileOps, mine: list[Tile], x: torch.Tensor) -> dict[tuple[int, int, int], torch.Tensor]:
    """This rank's tiles run through `ops.run_many`, those of one input shape in one call (in key
    order), by key."""
    by_shape: dict[tuple[int, ...], list[Tile]] = {}
    for t in mine:
        by_shape.setdefault(t.in_shape(x.shape), []).append(t)
    done = {}
    for group in by_shape.values():
        outs = ops.run_many([t.cut(x) for t in group])
        done.update({t.key: out for t, out in zip(group, outs)})
    return done


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
