#!/usr/bin/env python3
"""What a sharded decode exchanges, per rank and kind of exchange, predicted without a GPU.

    python3 benchmarks/comm_model.py --ranks 2,4,8 --json comm_model.json

A model of the communication, not a run of it: the family's VAE (its real config) decodes once,
unsharded, on PyTorch's meta device (shapes only), with hooks on the modules its shard plan treats
(`Family.shard_report`); from each call's input shape and the plan's treatment, the bytes rank r
of N hands the backend follow:

- halo (a convolution's or pad's rows on the sharded axis): the rows its padding covers above the
  slice go to the next rank, those below to the previous one (none past a global edge), each row
  C x T x W values; a causal convolution's cached frames travel with the rows.
- global_norm (GroupNorm with whole-map statistics): two all-reduces of float64 sums,
  B x groups + 1 and 2 x B x groups values.
- whole_map (attention): keys and values (or the normed map) all-gathered, each rank's slice
  padded to the longest slice.
- assemble: the decoded slice (`output="all"`: every rank broadcasts its own rows).
- tile: one gather of every rank's tiles, padded to the largest tile and the largest per-rank
  count (runtime/tile.py); a request of one tile is decoded by rank 0 and broadcast.

tests/test_runtime/test_comm_model.py checks these against the bytes gloo ranks count
(vaeshard.runtime.traffic) on the tiny test configs. The payload is what one rank hands the
backend; on the wire NCCL's ring algorithms move (N-1) x the payload for an all-gather and
2 (N-1) / N x it for an all-reduce, which `link_bytes` applies for the predicted time
(docs/figures/comm.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vaeshard  # noqa: E402
from vaeshard.families import family_for  # noqa: E402
from vaeshard.families.base import GLOBAL_NORM, HALO, WHOLE_MAP  # noqa: E402
from vaeshard.runtime import tile as tile_mod  # noqa: E402
from vaeshard.runtime.spatial import split_extents  # noqa: E402

# Each family's common resolution (latent shape, bf16), as BENCHMARKS.md's presets decode it.
PRESETS = {
    "wan21": ("wan21", (1, 16, 21, 90, 160)),
    "wan22": ("wan22", (1, 48, 21, 44, 80)),
    "hunyuanvideo15": ("hunyuanvideo15", (1, 32, 31, 45, 80)),
    "cogvideox": ("cogvideox", (1, 16, 13, 60, 90)),
    "sdxl": ("sdxl", (1, 4, 128, 128)),
    "flux1": ("flux1", (1, 16, 128, 128)),
}


def _halo_rows(module) -> tuple[int, int]:
    """(rows from the previous rank, rows from the next) a halo module takes on the height axis:
    what its padding covers there."""
    for name in ("_padding", "time_causal_padding"):  # causal convolutions: (w, w, h, h, t, 0) for F.pad
        pad = getattr(module, name, None)
        if pad is not None:
            return pad[2], pad[3]
    if hasattr(module, "height_pad"):
        return module.height_pad, module.height_pad
    if isinstance(module, torch.nn.ZeroPad2d):
        return module.padding[2], module.padding[3]
    conv = module.conv if hasattr(module, "conv") and isinstance(module.conv, torch.nn.Module) else module
    pad = conv.padding
    if isinstance(pad, str):
        raise ValueError(f"{type(module).__name__}: string padding {pad!r} is not modelled")
    return pad[-2], pad[-2]  # (h, w) or (t, h, w)


def _maps_gathered(mixin: str) -> int:
    """How many maps of its input's size a whole-map attention (vaeshard's layer `mixin`) gathers a
    call: its keys and values (two), or, for WholeImageAttention, its normed input (one)."""
    return 1 if mixin == "WholeImageAttention" else 2


def _calls(vae, z) -> tuple[list[tuple[str, str, torch.nn.Module, tuple, int]], tuple]:
    """(treatment, vaeshard layer, module, input shape, cached frames) of every call of a treated module in the
    unsharded decode of `z` (meta device), and the decoded shape."""
    report = family_for(vae).shard_report(vae)
    modules = dict(vae.named_modules())
    calls, handles = [], []
    for swapped in report.swapped:
        if swapped.treatment not in (HALO, GLOBAL_NORM, WHOLE_MAP):
            continue
        module = modules[swapped.path]

        def hook(mod, args, kwargs, treatment=swapped.treatment, mixin=swapped.mixin):
            x = args[0] if args else next(iter(kwargs.values()))
            cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
            cached = cache.shape[2] if isinstance(cache, torch.Tensor) and cache.ndim == 5 else 0
            calls.append((treatment, mixin, mod, tuple(x.shape), cached))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            out = vae.decode(z).sample
    finally:
        for h in handles:
            h.remove()
    return calls, tuple(out.shape)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def spatial_bytes(vae, z, world: int, itemsize: int) -> list[dict[str, int]]:
    """Each rank's payload bytes by kind for spatial_shard_height over `world` ranks."""
    calls, out_shape = _calls(vae, z)
    latent_rows = z.shape[-2]
    extents = split_extents(latent_rows, world)
    ranks = [Counter() for _ in range(world)]
    for treatment, mixin, module, shape, cached in calls:
        scale = shape[-2] // latent_rows
        if treatment == HALO:
            before, after = _halo_rows(module)
            frames = (shape[2] + cached) if len(shape) == 5 else 1
            row = _prod(shape[:2]) * frames * shape[-1] * itemsize
            for r in range(world):
                rows = (after if r > 0 else 0) + (before if r < world - 1 else 0)
                ranks[r]["halo"] += rows * row
        elif treatment == GLOBAL_NORM:
            groups = shape[0] * module.num_groups
            for r in range(world):
                ranks[r]["all_reduce"] += 8 * (groups + 1) + 8 * 2 * groups
        elif treatment == WHOLE_MAP:
            row = _prod(shape) // shape[-2] * itemsize
            gathers = _maps_gathered(mixin)
            norms = getattr(module, "group_norm", None)
            for r in range(world):
                ranks[r]["all_gather"] += gathers * max(extents) * scale * row
                if isinstance(norms, torch.nn.GroupNorm):  # an attention's own GroupNorm, whole-map statistics
                    ranks[r]["all_reduce"] += 8 * (3 * shape[0] * norms.num_groups + 1)
    row = _prod(out_shape) // out_shape[-2] * itemsize
    scale = out_shape[-2] // latent_rows
    for r in range(world):
        ranks[r]["assemble"] += extents[r] * scale * row
    return [dict(c) for c in ranks]


def tile_bytes(vae, z, world: int, itemsize: int) -> list[dict[str, int]]:
    """Each rank's payload bytes by kind for tile mode over `world` ranks."""
    ops = family_for(vae).decode_tile_ops(vae, z)
    tiles = ops.all_tiles() if ops is not None else ()
    if len(tiles) <= 1:  # one tile: rank 0 decodes and broadcasts it (a header, then the values)
        with torch.no_grad():
            out = vae.decode(z).sample
        return [{"control": 72, "broadcast": out.numel() * itemsize}] + [{} for _ in range(world - 1)]
    shapes = [ops.out_shape(t.in_shape(z.shape)) for t in tiles]
    common = [max(dims) for dims in zip(*shapes)]
    count = max(len(a) for a in tile_mod.balance(tiles, world))
    return [{"tile_gather": count * _prod(common) * itemsize} for _ in range(world)]


WEIGHTS_SHAPES_ONLY = "meta"
