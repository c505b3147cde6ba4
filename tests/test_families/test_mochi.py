"""Mochi 1 (AutoencoderKLMochi): 5-D latents, tile and spatial-shard decode and encode on gloo ranks.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode`; spatial shard: within 1e-4 of the
untiled (one-shot) decode and encode (CPU fp32; per-frame GroupNorm statistics combined over the
ranks), uneven shards, the replicate-padded causal convolution against diffusers' on the whole
tensor; the real config on the meta device (its layers, tile grid and plan). Each world size runs
all its checks in one call on the shared rank pool.
"""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard import families

from ..dist_harness import run_ranks
from ..family_parity import FrameLoopParity, Refusals, fast, setting, streamed
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, assert_identical, reference_from_rank0

# 8x spatial: latent tiles of 4 rows every 3, blended over 8 sample rows and cut to 24
TILES = (32, 32, 24, 24)
# roundings that bite: 38 // 8 = 4 and 30 // 8 = 3 latent rows, blended over 8 and cut to 30 rows;
# 44 // 8 = 5 every 36 // 8 = 4 columns
ODD_TILES = (38, 44, 30, 36)


def _sample(shape, seed: int = 3):
    return latent(shape, seed=seed).clamp(-1, 1)


def _tiled(vae, tiles, fn):
    """diffusers' own tiled decode / encode with `tiles` (min h, min w, stride h, stride w)."""
    vae.enable_tiling(*tiles)
    try:
        with torch.no_grad():
            return fn()
    finally:
        vae.use_tiling = False


def _decode(vae, z):
    return vae.decode(z).sample


def _encode(vae, x):
    return vae.encode(x).latent_dist.parameters


def _spatial(vae, world, cases, what):
    """Each (mode, op, input, reference): vaeshard's result within 1e-4 of diffusers' untiled one."""
    for mode, op, x, ref in cases:
        vaeshard.parallelize(vae, mode=mode)
        strategy = vaeshard.plan(vae, x.shape, world, mode, op=op).strategy
        assert strategy.startswith("spatial_shard"), strategy
        out = _decode(vae, x) if op == "decode" else _encode(vae, x)
        assert_close(out, ref, CPU_FP32_GROUPNORM, f"{what}: {mode} {op} {tuple(x.shape)} over {world}")


def _tile(vae, world, cases, what):
    """Each (tiles, op, input, reference, tile count): vaeshard's tile result bit-identical."""
    vaeshard.parallelize(vae, mode="tile")
    for tiles, op, x, ref, count in cases:
        vae.tile_sample_min_height, vae.tile_sample_min_width = tiles[:2]
        vae.tile_sample_stride_height, vae.tile_sample_stride_width = tiles[2:]
        family = families.family_for(vae)
        ops = family.decode_tile_ops(vae, x) if op == "decode" else family.encode_tile_ops(vae, x)
        assert len(ops.grid.tiles) == count
        assert vaeshard.plan(vae, x.shape, world, "tile", op=op).strategy == "tile"
        out = _decode(vae, x) if op == "decode" else _encode(vae, x)
        assert_identical(out, ref, f"{what}: tile {op} {tuple(x.shape)} over {world}")


def _conv_against_diffusers(rank, world):
    """The replicate-padded causal convolution (a resnet's 3x3x3 and a downsampler's (2, 2, 2)
    patchify), sharded over uneven rows and columns, against diffusers' module on the whole tensor."""
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

    from vaeshard.layers.halo import HaloPadThenCachedConv as HaloReplicateCachedCausalConv3d
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    torch.manual_seed(2)
    convs = [
        CogVideoXCausalConv3d(4, 6, kernel_size=3, stride=1, pad_mode="replicate"),
        CogVideoXCausalConv3d(4, 6, kernel_size=(2, 2, 2), stride=(2, 2, 2), pad_mode="replicate"),
    ]
    x = latent((2, 4, 5, 14, 10), seed=8)
    comm = Comm.for_group(torch.distributed.group.WORLD)
    for conv in convs:
        stride = conv.conv.stride[1]
        with torch.no_grad():
            reference, cache = conv(x)
        assert cache is None
        swap.swap(conv, HaloReplicateCachedCausalConv3d)
        for axis, dim in ((spatial.HEIGHT, 3), (spatial.WIDTH, 4)):
            extents = spatial.split_extents(x.shape[dim] // stride, world)  # 14 // 2 rows over 3: 3, 2, 2
            start = sum(extents[:rank])
            ctx = spatial.ShardContext(comm=comm, axis=axis, extents=extents)
            with torch.no_grad(), spatial.sharding(ctx):
                out, cache = conv(x.narrow(dim, start * stride, extents[rank] * stride))
            assert cache is None
            assert_close(out, reference.narrow(dim, start, extents[rank]), CPU_FP32, f"{axis} stride {stride}")


def _checks(rank, world):
    vae = build("mochi")
    if world == 2:
        z = latent((1, 4, 2, 5, 7))  # 5 rows: 3 + 2; 7 columns: 4 + 3
        x = _sample((1, 3, 7, 40, 56))  # latent 5 x 7
        zt, xt = latent((1, 4, 2, 7, 10), seed=5), _sample((1, 3, 7, 56, 80), seed=6)  # 3 x 4 tiles each
        zl = latent((1, 4, 4, 5, 7), seed=11)  # 4 latent frames for the frame loop

        def reference():
            with torch.no_grad():
                untiled = _decode(vae, z), _encode(vae, x), _decode(vae, zl)
            return untiled + (
                _tiled(vae, TILES, lambda: _decode(vae, zt)),
                _tiled(vae, TILES, lambda: _encode(vae, xt)),
            )

        dec, enc, loop_dec, tdec, tenc = reference_from_rank0(rank, reference)
        plan = vaeshard.plan(vae, z.shape, world)
        assert plan.strategy == "spatial_shard_width", plan.explain()  # auto: the longer axis
        vaeshard.parallelize(vae, mode="auto")
        assert_close(_decode(vae, z), dec, CPU_FP32_GROUPNORM, "auto decode over 2")
        spatial = [
            ("spatial_shard_height", "decode", z, dec),
            ("spatial_shard_height", "encode", x, enc),
            ("spatial_shard_width", "encode", x, enc),
        ]
        _spatial(vae, world, spatial, "mochi")
        _sharded_loop(vae, world, zl, loop_dec)
        _tile(vae, world, [(TILES, "decode", zt, tdec, 12), (TILES, "encode", xt, tenc, 12)], "mochi")
    elif world == 3:
        _conv_against_diffusers(rank, world)
        z = latent((1, 4, 2, 7, 5))  # 7 rows: 3 + 2 + 2
        zb = latent((2, 4, 2, 4, 8), seed=4)  # two samples; 8 columns: 3 + 3 + 2
        x = _sample((1, 3, 7, 56, 24))  # latent 7 rows
        zt, zf = latent((1, 4, 2, 9, 11), seed=5), latent((1, 4, 2, 5, 3), seed=7)

        def reference():
            with torch.no_grad():
                untiled = _decode(vae, z), _decode(vae, zb), _encode(vae, x)
            return untiled + (
                _tiled(vae, ODD_TILES, lambda: _decode(vae, zt)),
                _tiled(vae, TILES, lambda: _decode(vae, zf)),
                _tiled(vae, ODD_TILES, lambda: _encode(vae, x)),
            )

        dec, decb, enc, tdec, tfew, tenc = reference_from_rank0(rank, reference)
        spatial = [
            ("spatial_shard_height", "decode", z, dec),
            ("spatial_shard_width", "decode", zb, decb),
            ("spatial_shard_height", "encode", x, enc),
        ]
        _spatial(vae, world, spatial, "mochi")
        tiles = [
            (ODD_TILES, "decode", zt, tdec, 9),
            (TILES, "decode", zf, tfew, 2),  # fewer tiles than ranks: one rank decodes none
            (ODD_TILES, "encode", x, tenc, 2),
        ]
        _tile(vae, world, tiles, "mochi")
    else:
        z = latent((1, 4, 2, 9, 3))  # 9 rows: 3 + 2 + 2 + 2
        zc = latent((1, 4, 1, 3, 4), seed=4)  # one latent frame; one column each
        x = _sample((1, 3, 4, 24, 32))  # latent 3 x 4: one column each

        def reference():
            with torch.no_grad():
                return _decode(vae, z), _decode(vae, zc), _encode(vae, x)

        dec, decc, enc = reference_from_rank0(rank, reference)
        spatial = [
            ("spatial_shard_height", "decode", z, dec),
            ("spatial_shard_width", "decode", zc, decc),
            ("spatial_shard_width", "encode", x, enc),
        ]
        _spatial(vae, world, spatial, "mochi")


def _sharded_loop(vae, world, z, reference):
    """The fast tier's frame loop sharded, 2 latent frames per call after the first, and streamed."""
    from vaeshard.fast.frame_loop import num_steps

    for mode in ("spatial_shard_height", "spatial_shard_width"):
        fast(vae, mode, 2)
        plan = vaeshard.plan(vae, z.shape)
        assert plan.strategy == mode and plan.fast.frames_per_step == 2, plan.explain()
        out = _decode(vae, z)
        assert_close(out, reference, CPU_FP32_GROUPNORM, f"frame loop {mode} over {world}")
        chunks = streamed(vae, z)
        assert len(chunks) == num_steps(4, 2) and torch.equal(torch.cat(chunks, dim=2), out), mode


@pytest.mark.parametrize("world", [2, 3, 4])
def test_tile_and_spatial_parity(world):
    run_ranks(_checks, world)


# -- the real config (diffusers' defaults) on the meta device; refusals ----------------------------------


def _real_on_meta():
    from diffusers import AutoencoderKLMochi

    with torch.device("meta"):
        return AutoencoderKLMochi().eval()


def test_real_config_layers_tile_grid_and_plan():
    from vaeshard.families.mochi import FAMILY

    vae = _real_on_meta()  # 362 M parameters: shapes only
    assert FAMILY.spatial_ratio(vae) == 8 and FAMILY.latent_channels(vae) == 12
    FAMILY.install_layers(vae)  # every layer of the real config is one vaeshard knows
    swapped = {n for n, m in vae.named_modules() if vaeshard.runtime.swap.is_swapped(m)}
    assert {"decoder.block_out.resnets.2.conv2", "encoder.down_blocks.0.conv_in"} <= swapped
    assert "encoder.norm_out.norm_layer" in swapped and "decoder.up_blocks.2.resnets.0.norm1.norm_layer" in swapped
    assert not any("attentions" in n for n in swapped)  # over each pixel's frames: local
    FAMILY.uninstall_layers(vae)
    z = torch.empty((1, 12, 1, 40, 36), device="meta")  # 2 x 2 of diffusers' 32-row latent tiles
    ops = FAMILY.decode_tile_ops(vae, z)
    assert [(t.h0, t.h1, t.w0, t.w1) for t in ops.grid.tiles[:2]] == [(0, 32, 0, 32), (0, 32, 24, 36)]
    assert len(ops.grid.tiles) == 4 and (ops.grid.out_rows, ops.grid.out_cols) == (320, 288)
    assert (ops.grid.blend_rows, ops.grid.keep_rows) == (64, 192)
    with torch.no_grad():  # (diffusers' whole tiled loops on meta take seconds: one tile each)
        tile = vae.decoder(z[..., :32, :32])[0][:, :, 5:]  # diffusers drops the first 5 frames
    assert tuple(tile.shape) == ops.out_shape((1, 12, 1, 32, 32)) == (1, 3, 1, 256, 256)
    x = torch.empty((1, 3, 7, 320, 288), device="meta")
    enc = FAMILY.encode_tile_ops(vae, x)
    assert len(enc.grid.tiles) == 4 and (enc.grid.out_rows, enc.grid.out_cols) == (40, 36)
    with torch.no_grad():
        one = vae.encoder(x[..., :256, :256])[0]
    assert tuple(one.shape) == enc.out_shape((1, 3, 7, 256, 256)) == (1, 24, 2, 32, 32)
    # Mochi 1's own resolution: 163 frames of 480 x 848 are 28 latent frames of 60 x 106
    plan = vaeshard.plan(vae, (1, 12, 28, 60, 106), 4)
    assert plan.strategy == "spatial_shard_width", plan.explain()
    assert "frame loop:" in plan.explain() and plan.fast.frames_per_step == 1  # (the meta device: 1)
    assert vaeshard.plan(vae, (1, 12, 28, 106, 60), 8).strategy == "spatial_shard_height"
    assert vaeshard.plan(vae, (1, 3, 163, 480, 848), 4, op="encode").strategy == "spatial_shard_width"
    odd = vaeshard.plan(vae, (1, 3, 13, 484, 64), 4, "spatial_shard_height", op="encode")
    assert odd.fallback and "multiple of 8" in odd.reason
    assert vaeshard.plan(vae, (1, 12, 3, 16, 16), 4, "tile").strategy == "direct"  # one tile
    assert "4-D" in vaeshard.plan(vae, (1, 12, 8, 8), 2, "spatial_shard_width").reason


class TestMochi(FrameLoopParity, Refusals):
    """The shared checks (tests/family_parity.py) with Mochi 1's configs; its tile and spatial cases run
    all of a world size's checks in one launch (above)."""

    REFUSALS = [
        ("unpadded-width", "mochi",
         setting("encoder.down_blocks.1.resnets.0.conv1.time_causal_padding", (0, 0, 1, 1, 2, 0)),
         "encoder.down_blocks.1.resnets.0.conv1"),
        ("unknown-layer", "mochi", setting("decoder.block_in.resnets.0.nonlinearity",
                                        lambda: torch.nn.Upsample(scale_factor=1.0)),
         "decoder.block_in.resnets.0.nonlinearity"),
    ]  # fmt: skip
    # the frame loop: diffusers' one-shot decode within 1e-5; memory per call
    LOOP_MODEL = "mochi"
    LOOP_LATENT = (4, 3, 4)
    LOOP_FRAMES = (1, 2, 3)  # the first call's 6 frames less the 5 diffusers drops, then 6 per latent frame
    BOUND_FRAME_VALUES = 32 * 24 * 32  # the widest full-resolution layer's values per output frame (32 channels)
    BOUND_DIFFUSERS = {2: 12, 4: 24}  # 6 output frames per latent frame at once
    BOUND_LOOP = {(2, 1): 6, (4, 1): 6, (4, 2): 12}

    @staticmethod
    def looped_modules(decoder):
        return [decoder.up_blocks, decoder.block_out, decoder.proj_out]


def test_frame_wise_decoding_is_refused_before_swapping():
    vae = build("mochi")
    vae._enable_framewise_decoding()  # diffusers 0.42's frame-wise decode fails on this VAE itself
    with pytest.raises(RuntimeError):
        vae.decode(latent((1, 4, 2, 3, 3)))
    with pytest.raises(ValueError, match="frame-wise"):
        vaeshard.parallelize(vae, mode="tile")
    assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules()) and "decode" not in vae.__dict__


@pytest.mark.parametrize("phases", [(3, 2, 2), (2, 2, 2), (1, 2, 2)])
def test_depth_to_space_comes_out_channels_last_with_diffusers_values(phases):
    """The fast tier's up-block projection (fast/depth_to_space.py): diffusers' up block with no resnets
    (its Linear and unpatchify alone) gives the same values, and the fast tier's map is channels-last
    (the layout the next norms and convolutions read) where diffusers' is channels-first."""
    from diffusers.models.autoencoders.autoencoder_kl_mochi import MochiUpBlock3D

    from vaeshard.fast.depth_to_space import depth_to_space

    st, sh, _ = phases
    torch.manual_seed(31)
    block = MochiUpBlock3D(16, 8, num_layers=0, temporal_expansion=st, spatial_expansion=sh).eval()
    x = latent((2, 16, 3, 5, 7), seed=32)
    with torch.no_grad():
        reference, _ = block(x)
        out = depth_to_space(block.proj, x, phases)
    assert reference.shape == out.shape == (2, 8, 3 * st, 5 * sh, 7 * sh)
    assert out.is_contiguous(memory_format=torch.channels_last_3d) and not out.is_contiguous()
    assert_close(out, reference, CPU_FP32, f"phases {phases}")
