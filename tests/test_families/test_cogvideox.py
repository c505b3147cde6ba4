"""CogVideoX (AutoencoderKLCogVideoX, CogVideoX 1.0 / 1.5, ConsisID): 5-D latents, tile and
spatial-shard decode and encode on gloo ranks, one launch per world size.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode` (each tile's frame loop with its conv
cache); spatial shard: within CPU_FP32_GROUPNORM of diffusers' untiled decode and encode (GroupNorm
statistics combined across ranks), over two frame batches (the first odd, so the SpatialNorm3D and
upsampler first-frame splits run), uneven shards, the feature map never gathered, diffusers' time
chunks of CogVideoXSafeConv3d forced; nearest interpolation of a latent slice against the slice of
the interpolation on vaeshard's splits; the real config on the meta device (layers, tile grids, plan)
and the real layout (8x, 4x temporal, 16 latent channels) at small widths.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.nn.functional as F

import vaeshard

from ..dist_harness import run_ranks
from ..family_parity import Refusals, setting
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, assert_identical, reference_from_rank0


def _build(model: str, tiles=None):
    """`tiles=(sample_h, sample_w)`: diffusers' tile size (the latent tile follows, as in enable_tiling)."""
    vae = build(model)
    if tiles is not None:
        vae.enable_tiling(tile_sample_min_height=tiles[0], tile_sample_min_width=tiles[1])
        vae.use_tiling = False
    return vae


def _input(shape, op: str):
    return latent(shape) if op == "decode" else latent(shape, seed=3).clamp(-1, 1)


def _diffusers(vae, x, op: str, tiled: bool):
    with torch.no_grad():
        if tiled:
            return vae.tiled_decode(x).sample if op == "decode" else vae.tiled_encode(x)
        if op == "decode":
            return vae.decode(x).sample
        return vae.encode(x).latent_dist.parameters


class _NoGather:
    """Makes every gather of a feature map fail while active (the result's assembly is not one)."""

    def __enter__(self):
        from vaeshard.runtime.comm import Comm

        self.saved = Comm.all_gather_along

        def refuse(*args, **kwargs):
            raise AssertionError("a sharded CogVideoX request gathered a feature map")

        Comm.all_gather_along = refuse

    def __exit__(self, *exc):
        from vaeshard.runtime.comm import Comm

        Comm.all_gather_along = self.saved


def _local_norm_rows(vae, rank, world, shape, mode, op):
    """Hooks asserting every GroupNorm sees only this rank's rows: its latent rows times the level's
    scale (1, 2, 4, ...), never the whole map."""
    from vaeshard.families.cogvideox import FAMILY
    from vaeshard.runtime.spatial import split_extents

    dim = 3 if mode == "spatial_shard_height" else 4
    mine = split_extents(shape[dim] // (1 if op == "decode" else FAMILY.spatial_ratio(vae)), world)[rank]
    seen = []

    def check(module, args):
        rows = args[0].shape[dim]
        assert rows % mine == 0 and (rows // mine) & (rows // mine - 1) == 0, (rows, mine)
        seen.append(rows)

    handles = [m.register_forward_pre_hook(check) for m in vae.modules() if type(m).__name__ == "GroupNorm"]
    return handles, seen


def _run_case(rank, world, case):
    from vaeshard.layers import halo as cached_causal_conv

    name, model, tiles, shape, mode, op = case[:6]
    options = case[6] if len(case) > 6 else {}
    vae = _build(model, tiles)
    x = _input(shape, op)
    reference = reference_from_rank0(rank, lambda: _diffusers(vae, x, op, mode == "tile"))
    plan = vaeshard.plan(vae, x.shape, world, mode, op=op)
    vaeshard.parallelize(vae, mode=mode)
    handles, seen = [], None
    if options.get("local_norms"):
        handles, seen = _local_norm_rows(vae, rank, world, shape, plan.strategy, op)
    saved = cached_causal_conv.SAFE_CONV_GIB
    if options.get("chunks"):  # diffusers' time chunks in every padded causal conv
        cached_causal_conv.SAFE_CONV_GIB = 1e-6
    try:
        with contextlib.nullcontext() if mode == "tile" else _NoGather():
            out = vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters
    finally:
        cached_causal_conv.SAFE_CONV_GIB = saved
        for h in handles:
            h.remove()
    if mode == "tile":
        assert plan.strategy == "tile", (name, plan.explain())
        assert_identical(out, reference, name)
    else:
        assert plan.strategy == options.get("expect", mode), (name, plan.explain())
        assert_close(out, reference, CPU_FP32_GROUPNORM, name)
        assert seen is None or seen, name


def _run_cases(rank, world, cases):
    times = {}
    for case in cases:
        started = time.perf_counter()
        _run_case(rank, world, case)
        times[case[0]] = round(time.perf_counter() - started, 2)
    return times


# name, model, tiles (sample h, w), shape, mode, op[, options]
CASES = {
    2: [
        # 2 x 2 tiles: latent tiles 8 x 10, strides int(8 * 5/6) = 6 and int(10 * 4/5) = 8, blends
        # int(32 / 6) = 5 and int(40 / 5) = 8 sample rows, the last tiles clipped
        ("tile-decode-2x2", "cogvideox", None, (1, 4, 5, 12, 14), "tile", "decode"),
        ("tile-encode-2x2", "cogvideox", None, (1, 3, 9, 48, 56), "tile", "encode"),
        ("decode-h-uneven", "cogvideox", None, (1, 4, 5, 7, 6), "spatial_shard_height", "decode", {"local_norms": 1}),
        ("encode-w", "cogvideox", None, (1, 3, 17, 12, 20), "spatial_shard_width", "encode", {"local_norms": 1}),
        ("layout-8x-decode-h", "cogvideox_layout", None, (1, 16, 3, 5, 3), "spatial_shard_height", "decode"),
        ("layout-8x-encode-w", "cogvideox_layout", None, (1, 3, 9, 16, 24), "spatial_shard_width", "encode"),
    ],
    3: [
        # tiles of 30 x 42 sample pixels: latent 7 x 10 (decoded to 28 rows, less than the sample tile),
        # strides 5 and 8, blends 5 and 8, kept 25 and 34; encode strides 25 and 33, blends 1 and 2
        ("tile-decode-rounding", "cogvideox", (30, 42), (1, 4, 3, 12, 19), "tile", "decode"),
        ("tile-decode-fewer-tiles-than-ranks", "cogvideox", None, (1, 4, 2, 9, 10), "tile", "decode"),
        ("tile-encode-rounding", "cogvideox", (30, 42), (1, 3, 9, 56, 72), "tile", "encode"),
        ("decode-w-batch2-chunks", "cogvideox", None, (2, 4, 5, 4, 8), "spatial_shard_width", "decode", {"chunks": 1}),
        ("encode-h-uneven", "cogvideox", None, (1, 3, 9, 28, 12), "spatial_shard_height", "encode", {"chunks": 1}),
        ("decode-auto", "cogvideox", None, (1, 4, 3, 4, 7), "auto", "decode", {"expect": "spatial_shard_width"}),
    ],
    4: [
        ("decode-h-9rows", "cogvideox", None, (1, 4, 5, 9, 5), "spatial_shard_height", "decode", {"local_norms": 1}),
        ("decode-w-one-column-each", "cogvideox", None, (1, 4, 3, 3, 4), "spatial_shard_width", "decode"),
        ("encode-w-one-column-each", "cogvideox", None, (1, 3, 9, 12, 16), "spatial_shard_width", "encode"),
        ("encode-auto", "cogvideox", None, (1, 3, 9, 20, 12), "auto", "encode", {"expect": "spatial_shard_height"}),
    ],
}


@pytest.mark.parametrize("world", sorted(CASES))
def test_tile_bit_identical_and_spatial_matches_untiled(world):
    times = run_ranks(_run_cases, world, CASES[world])
    print(times[0])


def _auto_with_tiling_on(rank, world):
    """diffusers' decode with `enable_tiling` (small tiles): tiled above one tile, whose frames are not
    the untiled decode's shape (58 x 80 here, 48 x 76 untiled), and direct below it."""
    vae = build("cogvideox")
    vae.enable_tiling(tile_sample_min_height=30, tile_sample_min_width=42)
    large, small = latent((1, 4, 3, 12, 19)), latent((1, 4, 3, 6, 8), seed=2)

    def diffusers_decodes():
        with torch.no_grad():
            return vae.decode(large).sample, vae.decode(small).sample

    tiled, whole = reference_from_rank0(rank, diffusers_decodes)
    assert tiled.shape[-2:] == (58, 80)
    vaeshard.parallelize(vae)  # auto
    assert_identical(vae.decode(large).sample, tiled, "auto, tiling on, several tiles")
    plan = vaeshard.plan(vae, small.shape, world)
    assert plan.strategy.startswith("spatial_shard") and not plan.changes_result, plan.explain()
    assert_close(vae.decode(small).sample, whole, CPU_FP32_GROUPNORM, "auto, tiling on, smaller than a tile")


def test_auto_with_tiling_on_gives_diffusers_decode():
    run_ranks(_auto_with_tiling_on, 2)


# -- SpatialNorm3D's conditioning: a slice's nearest interpolation is the interpolation's slice -----------


def test_nearest_interpolation_of_a_slice_is_the_slice_of_the_interpolation():
    from vaeshard.runtime.spatial import split_extents

    for rows in (1, 2, 5, 7, 9, 12, 17, 30, 60, 96):
        z = latent((1, 2, 3, rows, 3), seed=rows)
        for scale in (1, 2, 4, 8):  # the decoder's levels: the latent times a power of two
            size = (9, rows * scale, 3 * scale)  # time resized too (the first frame apart in diffusers)
            whole = F.interpolate(z, size=size)
            for ranks in (2, 3, 4, 8):
                if ranks > rows:
                    continue
                start = 0
                for extent in split_extents(rows, ranks):
                    part = F.interpolate(z[..., start : start + extent, :], size=(9, extent * scale, 3 * scale))
                    assert torch.equal(part, whole[..., start * scale : (start + extent) * scale, :])
                    start += extent


# -- CogVideoXSafeConv3d's time chunks ------------------------------------------------------------------


def test_time_chunks_of_the_safe_conv_match_the_whole_convolution(monkeypatch):
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d

    from vaeshard.layers import halo as cached_causal_conv

    torch.manual_seed(2)
    conv = CogVideoXSafeConv3d(4, 6, kernel_size=3, padding=(0, 1, 1))
    x = latent((1, 4, 20, 5, 6), seed=7)  # 4.5e-6 GiB at diffusers' 2 bytes per value
    calls = []
    conv3d = F.conv3d
    monkeypatch.setattr(F, "conv3d", lambda *args: calls.append(1) or conv3d(*args))
    with torch.no_grad():
        whole = conv(x)  # diffusers: far below 2 GiB, one convolution
        # 2 chunks, 3, and at most one per 3 frames (20 // 3 = 6 asked, torch.chunk makes 5 of 4 frames),
        # where diffusers' would ask for thousands, shorter than the kernel, and fail
        for gib, chunks in ((3e-6, 2), (1.5e-6, 3), (1e-9, 5)):
            monkeypatch.setattr(cached_causal_conv, "SAFE_CONV_GIB", gib)
            calls.clear()
            out = cached_causal_conv.safe_conv3d(conv, x, conv.padding)
            assert len(calls) == chunks, (gib, len(calls))
            assert_close(out, whole, 1e-6, f"{gib} GiB")


# -- the real config (diffusers' defaults: CogVideoX 1.0 / 1.5), on the meta device -------------------------


def _real_on_meta():
    from diffusers import AutoencoderKLCogVideoX

    with torch.device("meta"):
        return AutoencoderKLCogVideoX().eval()


def test_real_config_layers_tile_grid_and_plan():
    from vaeshard.families.cogvideox import FAMILY

    vae = _real_on_meta()
    assert FAMILY.spatial_ratio(vae) == 8 and FAMILY.latent_channels(vae) == 16
    FAMILY.install_layers(vae)  # every layer of the real config is one vaeshard knows
    swapped = {n for n, m in vae.named_modules() if vaeshard.runtime.swap.is_swapped(m)}
    assert {"decoder.conv_in.conv", "decoder.norm_out.norm_layer", "decoder.up_blocks.2.upsamplers.0.conv"} <= swapped
    assert {"encoder.down_blocks.2.downsamplers.0.conv", "encoder.norm_out", "encoder.conv_out.conv"} <= swapped
    shortcut = "decoder.up_blocks.1.resnets.0.conv_shortcut"  # 1x1x1: per pixel, left as it is
    assert shortcut in dict(vae.named_modules()) and shortcut not in swapped
    FAMILY.uninstall_layers(vae)
    z = torch.empty((1, 16, 2, 40, 50), device="meta")  # 2 x 2 of diffusers' 30 x 45 latent tiles
    ops = FAMILY.decode_tile_ops(vae, z)
    assert len(ops.grid.tiles) == 4
    with torch.no_grad():
        tiled = vae.tiled_decode(z).sample
    assert tuple(tiled.shape) == (*ops.out_shape((1, 16, 2, 30, 45))[:3], ops.grid.out_rows, ops.grid.out_cols)
    x = torch.empty((1, 3, 1, 300, 400), device="meta")
    enc = FAMILY.encode_tile_ops(vae, x)
    with torch.no_grad():
        moments = vae.tiled_encode(x)
    assert tuple(moments.shape) == (*enc.out_shape((1, 3, 1, 240, 360))[:3], enc.grid.out_rows, enc.grid.out_cols)
    # CogVideoX 1.0 at 720 x 480, 49 frames; CogVideoX 1.5 at 1360 x 768, 81 frames
    assert vaeshard.plan(vae, (1, 16, 13, 60, 90), 4).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 16, 21, 96, 170), 8).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 16, 13, 90, 60), 4).strategy == "spatial_shard_height"
    assert vaeshard.plan(vae, (1, 3, 49, 480, 720), 4, op="encode").strategy == "spatial_shard_width"
    odd = vaeshard.plan(vae, (1, 3, 9, 484, 40), 4, "spatial_shard_height", op="encode")
    assert odd.fallback and "multiple of 8" in odd.reason
    assert vaeshard.plan(vae, (1, 16, 3, 30, 45), 4, "tile").strategy == "direct"  # one tile
    assert "4-D" in vaeshard.plan(vae, (1, 16, 8, 8), 2, "spatial_shard_width").reason


class TestCogVideoX(Refusals):
    """A layer vaeshard cannot shard is refused before any swap (tests/family_parity.py); the parity
    checks above run a world size's cases in one launch."""

    REFUSALS = [
        ("replicate-pad", "cogvideox", setting("encoder.down_blocks.0.resnets.0.conv1.pad_mode", "replicate"),
         "encoder.down_blocks.0.resnets.0.conv1"),
        ("unpadded-upsampler", "cogvideox", setting("decoder.up_blocks.0.upsamplers.0.conv.padding", (0, 0)),
         "decoder.up_blocks.0.upsamplers.0.conv"),
        ("unknown-layer", "cogvideox", setting("decoder.conv_act", lambda: torch.nn.Upsample(scale_factor=1.0)),
         "decoder.conv_act"),
    ]  # fmt: skip


# -- one-frame causal convolutions keep no cache -------------------------------------------------------


def test_one_frame_convolutions_keep_no_cache_and_the_decode_stays_diffusers():
    """diffusers' CogVideoXCausalConv3d returns `inputs[:, :, -k + 1:].clone()` as its cache: for a time
    kernel of one frame (the SpatialNorm3D's 1x1x1 convolutions) a clone of its whole input, which
    nothing reads. Parallelized, they return none, in both tiers; the decode (two frame batches, the
    first odd) stays diffusers' bit for bit in the exact tier (the fast tier's channels-last
    convolutions sum in another order: within CPU fp32)."""
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

    vae = build("cogvideox")
    z = latent((1, 4, 5, 6, 8))
    one_frame = [m for m in vae.decoder.modules() if isinstance(m, CogVideoXCausalConv3d) and m.time_kernel_size == 1]
    assert one_frame, "the test config has no one-frame causal convolution"
    caches = []

    def record(module, args, output):
        caches.append((args[0].shape, None if output[1] is None else output[1].shape))

    handles = [m.register_forward_hook(record) for m in one_frame]
    try:
        with torch.no_grad():
            want = vae.decode(z).sample
        assert caches and all(kept == shape for shape, kept in caches), caches  # diffusers: whole clones
        for exact in (False, True):
            caches.clear()
            vaeshard.parallelize(vae, exact=exact)
            with torch.no_grad():
                got = vae.decode(z).sample
            if exact:
                assert_identical(got, want, "exact tier")
            else:
                assert_close(got, want, CPU_FP32, "fast tier")
            assert caches and all(kept is None for _, kept in caches), caches
            vaeshard.unparallelize(vae)
    finally:
        for h in handles:
            h.remove()
