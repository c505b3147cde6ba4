"""What a VAE family declares to vaeshard, and the helpers shared by families."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..runtime.tile import TileOps


@dataclass(frozen=True)
class Family:
    """A family of diffusers VAE classes.

    Declarative part: names, latent layout, capabilities. Code part (callables) supplies what
    cannot be data: the tile grid and per-tile run, and the halo installation for spatial sharding.
    """

    name: str
    classes: tuple[str, ...]
    latent_ndim: int  # 5 for (B, C, T, H, W)
    tile_decode: bool
    tile_encode: bool
    spatial_decode: bool
    spatial_encode: bool = False
    # callables (set by the family module)
    latent_channels: object = None  # vae -> int
    decode_tile_ops: object = None  # (vae, z) -> TileOps | None (None: the latent fits one tile)
    encode_tile_ops: object = None  # (vae, x) -> TileOps | None, x already in encoder coordinates
    encode_prepare: object = None  # (vae, x) -> x in encoder coordinates (e.g. patchified)
    untiled_decode: object = None  # (vae, z) -> tensor: diffusers' untiled decode (the spatial reference)
    untiled_encode: object = None  # (vae, x) -> moments: diffusers' untiled encode
    direct_decode: object = None  # (vae, z) -> tensor: one rank's whole decode (None: the VAE's own `decode`)
    install_layers: object = None  # vae -> None: swap in request-aware layers (halo, fast tier; idempotent)
    uninstall_layers: object = None  # vae -> None
    release: object = None  # vae -> None: drop request scratch the model keeps (e.g. feature caches)
    # (vae, ranks, device) -> "height" | "width" | None: `auto`'s axis for a spatially sharded decode
    # on that device where BENCHMARKS.md measured it faster than the baseline rule's pick (the longer
    # axis), used when that axis covers the group; None (or no callable): the baseline rule
    decode_axis: object = None
    notes: dict = field(default_factory=dict)

    def supports(self, op: str, strategy: str) -> bool:
        if strategy == "direct":
            return True
        if strategy == "tile":
            return self.tile_decode if op == "decode" else self.tile_encode
        return self.spatial_decode if op == "decode" else self.spatial_encode


def frames_out(num_frames: int, temporal_factor: int) -> int:
    """Causal video VAEs decode the first latent frame to one frame and each later one to `factor`."""
    return 1 + (num_frames - 1) * temporal_factor if num_frames > 0 else 0


def with_tiling_off(vae, fn, *args):
    """Run `fn` with the VAE's own tiling and slicing switched off (restored afterwards)."""
    tiling, slicing = getattr(vae, "use_tiling", False), getattr(vae, "use_slicing", False)
    vae.use_tiling, vae.use_slicing = False, False
    try:
        with torch.no_grad():
            return fn(*args)
    finally:
        vae.use_tiling, vae.use_slicing = tiling, slicing


__all__ = ["Family", "TileOps", "frames_out", "with_tiling_off"]
