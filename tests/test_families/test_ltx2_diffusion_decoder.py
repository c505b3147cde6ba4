"""LTX-2.5's diffusion decoder (LTX2VideoDiffusionDecoderModel): spatial-shard decode on gloo ranks
within the CPU fp32 tolerance of diffusers' own untiled decode (FlexAttention's neighbourhood mask,
which runs on the CPU in eager mode), uneven shards of 2 (`auto`) and 3 ranks along either axis, the stage-5
noise from the global RNG and from a generator; `tile` refused with its reason; a NATTEN processor
refused before anything is swapped."""

from __future__ import annotations

import pytest
import torch

import vaeshard

from ..dist_harness import run_ranks
from ..family_parity import Refusals, SpatialParity
from ..models import build, latent
from ..parity import CPU_FP32, assert_close, reference_from_rank0

MODEL = "ltx2_diffusion_decoder"
SEED = 11
# 5 latent rows: 3 + 2 over 2 ranks, 2 + 2 + 1 over 3 (1 latent row: 4 stage-5 rows, its 5-wide
# window's 2 halo rows plus one); 2 latent frames, 4 columns
Z = (1, 4, 2, 5, 4)


def _natten(vae):
    class LTX2VideoVaeNeighborhoodNattenProcessor:  # stands in for diffusers' (which fetches kernels)
        _parallel_config = None

    vae.decoder.diff_blocks[0].attn.processor = LTX2VideoVaeNeighborhoodNattenProcessor()


class TestLTX2DiffusionDecoder(SpatialParity, Refusals):
    SPATIAL_CASES = [
        ("decode-auto-2", MODEL, Z, 2, "auto", "decode"),
        ("decode-h-3", MODEL, Z, 3, "spatial_shard_height", "decode"),
        ("decode-w-3", MODEL, (1, 4, 2, 3, 5), 3, "spatial_shard_width", "decode"),
    ]
    AUTO_STRATEGY = "spatial_shard_height"  # the longer axis
    REFUSALS = [
        (
            "natten-processor",
            MODEL,
            _natten,
            r"decoder\.diff_blocks\.0\.attn \(LTX2VideoVaeNeighborhoodAttention\) is an attention whose processor "
            r"is LTX2VideoVaeNeighborhoodNattenProcessor",
        )
    ]

    @staticmethod
    def run(vae, x, op):
        torch.manual_seed(SEED)  # stage 5's noise: the same global RNG state for diffusers and every rank
        with torch.no_grad():
            return vae.decode(x).sample


def _model_and_decode(**decode_kwargs):
    """The tiny model and a decode of `Z` from the same global RNG state every time."""
    vae = build(MODEL)
    z = latent(Z)

    def decode():
        torch.manual_seed(SEED)
        kwargs = {k: v() if callable(v) else v for k, v in decode_kwargs.items()}
        with torch.no_grad():
            return vae.decode(z, **kwargs).sample

    return vae, z, decode


def _generator_rank(rank, world):
    vae, _, decode = _model_and_decode(generator=lambda: torch.Generator().manual_seed(5), num_inference_steps=2)
    reference = reference_from_rank0(rank, decode)
    vaeshard.parallelize(vae, mode="spatial_shard_height")
    out = decode()
    assert_close(out, reference, CPU_FP32, "generator, two steps")


def test_generator_and_steps_pass_to_every_rank():
    run_ranks(_generator_rank, 2)


def test_tile_is_refused_with_its_reason():
    vae = vaeshard.parallelize(build(MODEL), "tile")
    with pytest.raises(ValueError, match="does not reproduce diffusers' tiled decode"):
        vae.decode(latent(Z))


def _tiled_own_decode_twice(rank, world):
    # with diffusers' tiling on and a latent it tiles, `auto` is that tiled decode, run by rank 0 alone;
    # its draws of stage 5's noise must leave every rank's RNG where rank 0's is, or the next request's
    # noise differs between ranks (which its agreement refuses)
    vae = build(MODEL)
    vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16)
    big, small = latent(Z, seed=2), latent((1, 4, 2, 2, 2), seed=3)

    def decodes(gen):
        torch.manual_seed(SEED)
        with torch.no_grad():
            first = vae.decode(big, generator=gen()).sample
            second = vae.decode(small, generator=gen()).sample
            third = vae.decode(small).sample  # global RNG
        return first, second, third

    def shared_generator():
        g = torch.Generator().manual_seed(5)
        return lambda: g

    want = reference_from_rank0(rank, lambda: decodes(shared_generator()))
    vaeshard.parallelize(vae)  # auto
    plan = vaeshard.plan(vae, big.shape, world)
    assert plan.strategy == "direct" and "tiled decode (enable_tiling)" in plan.explain(), plan.explain()
    got = decodes(shared_generator())
    if rank == 0:
        for g, w, what in zip(got, want, ("tiled, generator", "after it, same generator", "global RNG")):
            assert_close(g, w, CPU_FP32, what)


def test_a_decode_rank0_runs_alone_keeps_every_rank_s_rng_in_step():
    run_ranks(_tiled_own_decode_twice, 2)


# --- the windows without a mask over every (query, key) pair ----------------------------------


def _flex_reference(q, k, v, grid, kernel):
    """diffusers' own attention of the windows: its FlexAttention BlockMask over the whole grid."""
    import warnings

    from diffusers.models.autoencoders.ltx2_diffusion_decoder import _neighborhood_block_mask
    from torch.nn.attention.flex_attention import flex_attention

    b, heads, d = q.shape[0], q.shape[4], q.shape[5]

    def seq(x):
        return x.reshape(b, -1, heads, d).transpose(1, 2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
        out = flex_attention(
            seq(q), seq(k), seq(v), block_mask=_neighborhood_block_mask(*grid, kernel, "cpu"), scale=1.0
        )
    return out.transpose(1, 2).reshape(q.shape)


@pytest.mark.parametrize(
    "grid, kernel, chunk",
    [
        ((5, 9, 11), (3, 5, 7), None),  # windows shifted inward at every border
        ((3, 17, 4), (7, 7, 7), None),  # kernels wider than the grid: clipped as diffusers clips them
        ((7, 10, 13), (3, 7, 5), 1),  # one T block per call, the last block of each axis overlapping
    ],
)
def test_windowed_attention_equals_diffusers_flex_windows(grid, kernel, chunk, monkeypatch):
    from vaeshard.layers import neighbourhood_attention as na

    if chunk is not None:
        monkeypatch.setattr(na, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, *grid, 2, 8, generator=g) for _ in range(3))
    want = _flex_reference(q, k, v, grid, kernel)
    assert_close(na.windowed_attention(q, k, v, grid, kernel), want, CPU_FP32, "whole grid")
    # a rank's rows [s, e) with its halo rows as keys: its rows of the whole grid's result
    height = grid[1]
    before, after = na.halo_rows(kernel[1], height)
    for s, e in ((0, na.min_rows(kernel[1], height)), (height // 3, height - 2), (height - 3, height)):
        if e - s < na.min_rows(kernel[1], height):
            continue
        ks, ke = max(0, s - before), min(height, e + after)
        got = na.windowed_attention(q[:, :, s:e], k[:, :, ks:ke], v[:, :, ks:ke], grid, kernel, (0, s, 0), (0, ks, 0))
        assert_close(got, want[:, :, s:e], CPU_FP32, f"rows {s}-{e}")


def _no_mask_rank(rank, world):
    import torch.nn.attention.flex_attention as flex

    vae, _, decode = _model_and_decode()
    reference = reference_from_rank0(rank, decode)

    def refuse(*args, **kwargs):
        raise AssertionError("a mask over every (query, key) pair was built")

    flex.create_block_mask = refuse  # this rank's process only
    vaeshard.parallelize(vae, mode="spatial_shard_height")
    assert_close(decode(), reference, CPU_FP32, "sharded, no BlockMask")


def test_a_sharded_decode_builds_no_mask_of_every_pair():
    run_ranks(_no_mask_rank, 2)


def test_one_rank_fast_tier_takes_the_windows_in_blocks(monkeypatch):
    """One rank, the fast tier: the whole grid's windows in blocks, no mask over every pair, within the
    CPU fp32 tolerance of diffusers' decode; exact=True is diffusers' own forward, mask and all."""
    import torch.nn.attention.flex_attention as flex

    vae, z, decode = _model_and_decode()
    reference = decode()
    built = []
    create = flex.create_block_mask
    monkeypatch.setattr(flex, "create_block_mask", lambda *a, **k: built.append(1) or create(*a, **k))
    vaeshard.parallelize(vae)
    explained = vaeshard.plan(vae, z.shape, 1).explain()
    assert "tier: the fast tier" in explained and "attention: each neighbourhood attention's windows" in explained
    assert_close(decode(), reference, CPU_FP32, "one rank, fast tier")
    assert not built
    vaeshard.parallelize(vae, exact=True)
    assert torch.equal(decode(), reference) and built
