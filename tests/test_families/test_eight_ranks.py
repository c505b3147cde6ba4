"""Eight gloo ranks: the spatial-shard decode of every family added after Wan, against diffusers'
untiled decode of the same weights (rank 0's, sent to all), on shards of one or two latent rows or
columns (uneven), in one launch (starting eight processes is the expensive part on a small machine).

Wan's eight-rank case is tests/test_spatial.py's; each family's file covers 2, 3 and 4 ranks.
"""

from __future__ import annotations

import torch

import vaeshard

from ..dist_harness import run_ranks
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, reference_from_rank0

# builder, latent shape (9 rows or columns over 8 ranks: one rank holds two), mode, extra decode
# inputs, tolerance (GroupNorm families combine statistics across ranks)
CASES = [
    ("flux2", (1, 8, 9, 5), "spatial_shard_height", {}, CPU_FP32_GROUPNORM),
    ("qwenimage21", (1, 4, 1, 5, 9), "spatial_shard_width", {}, CPU_FP32),
    ("hunyuanvideo15", (1, 4, 2, 9, 5), "spatial_shard_height", {}, CPU_FP32),
    ("ltx", (1, 4, 2, 5, 9), "spatial_shard_width", {"temb": torch.tensor([0.05])}, CPU_FP32),
    ("ltx2", (1, 4, 2, 9, 5), "spatial_shard_height", {"temb": torch.tensor([0.05])}, CPU_FP32),
    ("mochi", (1, 4, 2, 8, 9), "spatial_shard_width", {}, CPU_FP32_GROUPNORM),
    ("cogvideox", (1, 4, 5, 9, 8), "spatial_shard_height", {}, CPU_FP32_GROUPNORM),
    ("hunyuanvideo", (1, 4, 2, 3, 9), "spatial_shard_width", {}, CPU_FP32_GROUPNORM),
    ("minimax_h3_untiled", (1, 4, 2, 5, 9), "spatial_shard_width", {}, CPU_FP32),
]


def _decode(vae, z, inputs):
    torch.manual_seed(7)  # LTX's decoder noise: every rank draws from the same state
    with torch.no_grad():
        return vae.decode(z, **inputs).sample


def _all_families(rank, world):
    diffs = {}
    for model, shape, mode, inputs, tol in CASES:
        vae = build(model)
        z = latent(shape)
        reference = reference_from_rank0(rank, lambda vae=vae, z=z, inputs=inputs: _decode(vae, z, inputs))
        vaeshard.parallelize(vae, mode=mode)
        plan = vaeshard.plan(vae, z.shape, world, mode)
        assert plan.strategy == mode, plan.explain()
        diffs[model] = assert_close(_decode(vae, z, inputs), reference, tol, f"{model} {mode} over {world}")
    return diffs


def test_every_newer_family_decodes_sharded_over_eight_ranks():
    results = run_ranks(_all_families, 8, timeout=280)
    assert all(r == results[0] for r in results)  # every rank holds the same (gathered) result
