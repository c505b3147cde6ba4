"""Which strategy a request takes: `plan()` answers from shapes, counts, the VAE's device and whether
hooks replace its layers' forwards, alone (no collectives)."""

from __future__ import annotations

import logging
from typing import NamedTuple

from .config import MODES, SPATIAL_MODES
from .runtime.swap import replaced_forwards

log = logging.getLogger("vaeshard")

STRATEGIES = ("direct", "tile", "spatial_shard_height", "spatial_shard_width")


class Plan(NamedTuple):
    strategy: str  # one of STRATEGIES
    reason: str  # one line, shown by the debug log and `vaeshard bench`
    fallback: bool = False  # a forced mode could not run and `tile` (or `direct`) runs instead


def _fits_one_tile(family, vae, op: str, shape) -> bool:
    """True when the request is a single tile, so tiling would decode it directly anyway."""
    if len(shape) != family.latent_ndim:
        return True
    import torch

    probe = torch.empty(shape, device="meta")
    if op == "decode":
        return family.decode_tile_ops(vae, probe) is None
    return family.encode_tile_ops(vae, probe) is None


def _axis_extents(shape, op: str, vae) -> tuple[int, int]:
    """The (height, width) extents that decide sharding, in latent rows: the latent's own for decode;
    for encode the sample extent over the compression ratio, or 0 when the sample extent is not a
    multiple of it (shards are whole latent rows, so every downsampling stays on the global lattice)."""
    h, w = shape[-2], shape[-1]
    if op == "encode":
        ratio = vae.spatial_compression_ratio
        return (h // ratio if h % ratio == 0 else 0), (w // ratio if w % ratio == 0 else 0)
    return h, w


def hooks_reason(hooked: list[str]) -> str:
    """Why a VAE with hooked layers (shard.replaced_forwards) is not sharded, in one line."""
    return (f"{len(hooked)} of its layers have their forward replaced by a hook (the first: {hooked[0]}; "
            "diffusers' layerwise casting or group offloading, accelerate's offloading), which the "
            "sharded layers would bypass")


def _device_of(vae):
    """The device the VAE's weights are on (where its decode runs); CPU for a VAE without any."""
    import torch

    first = next(vae.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def plan(vae, latent_shape, world_size: int, mode: str = "auto", *, op: str = "decode", size: int | None = None) -> Plan:
    """The strategy a `decode` (or `encode`) of `latent_shape` over `world_size` ranks would take.

    Deterministic and free of side effects: no collectives, no allocation of real tensors.
    `size` is the number of ranks doing work (None = world_size); fewer than world_size is a
    partial group, which never shards spatially.
    """
    return plan_for(vae, latent_shape, world_size, mode, op=op, size=size, hooked=replaced_forwards(vae))


def plan_for(vae, latent_shape, world_size: int, mode: str, *, op: str, size: int | None, hooked: list[str]) -> Plan:
    """`plan`, given the VAE's hooked layers (shard.replaced_forwards), which a request has looked
    for already."""
    from .families import family_for

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: valid modes are {', '.join(MODES)}")
    family = family_for(vae)
    shape = tuple(int(s) for s in latent_shape)
    workers = world_size if size is None else min(size, world_size)
    one_tile = _fits_one_tile(family, vae, op, shape)
    has_tile = family.supports(op, "tile")

    def not_spatial(why: str, forced: bool) -> Plan:
        if workers == 1 and mode != "tile":
            return Plan("direct", f"{why}; one rank decodes directly", forced)
        if one_tile or not has_tile:
            what = "the request is a single tile" if one_tile else f"{family.name} has no tiled {op}"
            return Plan("direct", f"{why}; {what}, so it runs directly on every rank", forced)
        return Plan("tile", f"{why}; tiles are spread over {workers} ranks", forced)

    if mode == "tile":
        return not_spatial("mode tile", False)

    spatial_ok = family.supports(op, "spatial_shard_height")
    reasons = []
    if world_size == 1:
        reasons.append("world size 1")
    if workers < world_size:
        reasons.append(f"partial group ({workers} of {world_size} ranks)")
    if len(shape) != family.latent_ndim:
        layout = "(B, C, T, H, W)" if family.latent_ndim == 5 else "(B, C, H, W)"
        reasons.append(f"a {len(shape)}-D latent is not the {family.latent_ndim}-D {layout} layout of {family.name}")
    if not spatial_ok:
        reasons.append(f"{family.name} has no spatial-shard {op}")
    if hooked:
        reasons.append(hooks_reason(hooked))

    if mode in SPATIAL_MODES:
        axis = "height" if mode == "spatial_shard_height" else "width"
        if not reasons:
            extent = _axis_extents(shape, op, vae)[0 if axis == "height" else 1]
            if extent < world_size:
                reasons.append(
                    f"latent {axis} {extent} is shorter than the group ({world_size} ranks)"
                    if extent or op == "decode"
                    else f"sample {axis} is not a multiple of {vae.spatial_compression_ratio}"
                )
        if reasons:
            return not_spatial(f"{mode} cannot run: " + ", ".join(reasons), True)
        return Plan(mode, f"forced {mode} over {world_size} ranks")

    # auto
    if reasons:
        return not_spatial(", ".join(reasons), False)
    h, w = _axis_extents(shape, op, vae)
    candidates = [(extent, name) for extent, name in ((h, "height"), (w, "width")) if extent >= world_size]
    if not candidates:
        return not_spatial(f"neither latent height {h} nor width {w} covers {world_size} ranks", False)
    device = _device_of(vae)
    measured = family.decode_axis(vae, world_size, device) if op == "decode" and family.decode_axis else None
    for extent, axis in candidates:
        if axis == measured:  # the family's measured refinement (DESIGN.md: only where BENCHMARKS.md shows it)
            return Plan(f"spatial_shard_{axis}", f"auto: {axis} {extent} covers {world_size} ranks, and {family.name} "
                        f"decodes over {world_size} ranks on {device.type} measured faster by {axis} (BENCHMARKS.md)")
    # the longer axis; width wins ties (rows of a wide frame stay contiguous and halos stay short)
    extent, axis = max(candidates, key=lambda c: (c[0], c[1] == "width"))
    return Plan(f"spatial_shard_{axis}", f"auto: {axis} {extent} is the longer axis covering {world_size} ranks")
