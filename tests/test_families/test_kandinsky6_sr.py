"""Kandinsky 6's SR VAE (Kandinsky6SRVAE): spatial-shard decode and encode on gloo ranks, within the CPU
fp32 tolerance of diffusers' own segmented decode and encode (uneven shards; 9 latent frames: two
decoder segments, so each rank carries its rows' caches across them), `tile` refused (diffusers has
no tiled path), and a layer it does not know refused before anything is swapped."""

from __future__ import annotations

import pytest
import torch

import vaeshard

from ..family_parity import Refusals, SpatialParity, setting
from ..models import build, latent

Z, X = (1, 4, 9, 7, 5), (1, 3, 17, 28, 20)


class TestKandinsky6SR(SpatialParity, Refusals):
    SPATIAL_CASES = [
        ("decode-h-2", "kandinsky6_sr", Z, 2, "spatial_shard_height", "decode"),
        ("decode-w-3", "kandinsky6_sr", Z, 3, "spatial_shard_width", "decode"),
        ("decode-auto-2", "kandinsky6_sr", (1, 4, 3, 8, 6), 2, "auto", "decode"),
        ("encode-h-3", "kandinsky6_sr", X, 3, "spatial_shard_height", "encode"),
        ("encode-w-2", "kandinsky6_sr", X, 2, "spatial_shard_width", "encode"),
    ]
    AUTO_STRATEGY = "spatial_shard_height"
    REFUSALS = [
        (
            "unknown-upsampler",
            "kandinsky6_sr",
            setting("decoder.up.1.upsample", lambda: torch.nn.Upsample(scale_factor=2)),
            r"decoder\.up\.1\.upsample \(Upsample\) is a layer vaeshard does not know",
        )
    ]


def test_tile_is_refused_with_its_reason():
    vae = vaeshard.parallelize(build("kandinsky6_sr"), "tile")
    with pytest.raises(ValueError, match="no tiled decode in diffusers"):
        vae.decode(latent(Z))
