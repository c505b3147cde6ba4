"""HunyuanVideo (AutoencoderKLHunyuanVideo): 5-D latents, GroupNorm throughout, tile and spatial-shard
decode and encode on gloo ranks, one launch per world size.

tile: bit-identical to diffusers' decode / encode with tiling on, which tiles in time above 4 latent
frames (16 sample frames) and in space above one tile: cases that tile in time and space (with the
one-frame last chunk diffusers' loop makes), in space only, and in time only with fewer tiles than
ranks. spatial shard: within 1e-4 (CPU fp32, GroupNorm statistics combined across ranks) of
diffusers' untiled decode and encode (framewise decoding off), uneven shards on 2, 3 and 4 ranks,
the mid-block attention computed without diffusers' mask. The frame-causal attention of diffusers'
`Attention` against its masked form; the real config on the meta device (layers, tile grids, plan).
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import vaeshard
from vaeshard.families import family_for

from ..dist_harness import run_ranks
from ..family_parity import Refusals, setting
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, assert_identical, reference_from_rank0

MODEL = "hunyuanvideo"


def _input(op: str, shape):
    return latent(shape) if op == "decode" else latent(shape, seed=3).clamp(-1, 1)


def _diffusers(op: str, x, tiled: bool):
    """diffusers' own result: with tiling on (its default framewise tiling in time included), or
    untiled (tiling and framewise decoding off: the whole clip at once)."""
    vae = build(MODEL)
    if tiled:
        vae.enable_tiling()
    else:
        vae.use_framewise_decoding = vae.use_framewise_encoding = False
    with torch.no_grad():
        return vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters


@contextlib.contextmanager
def _no_mask():
    """Makes diffusers' (T*H*W)^2 mask fail while active: a sharded request must not build it."""
    from diffusers.models.autoencoders import autoencoder_kl_hunyuan_video as module

    saved = module.prepare_causal_attention_mask

    def refuse(*args, **kwargs):
        raise AssertionError("the sharded attention built diffusers' full mask")

    module.prepare_causal_attention_mask = refuse
    try:
        yield
    finally:
        module.prepare_causal_attention_mask = saved


def _run(vae, op: str, x):
    return vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters


def _tile(rank, world, op, shape, chunks, tiles):
    x = _input(op, shape)
    reference = reference_from_rank0(rank, lambda: _diffusers(op, x, tiled=True))
    vae = build(MODEL)
    family = family_for(vae)
    ops = family.decode_tile_ops(vae, x) if op == "decode" else family.encode_tile_ops(vae, x)
    assert (len(ops.time.spans) if ops.time else 1, len(ops.grid.tiles)) == (chunks, tiles)
    assert vaeshard.plan(vae, x.shape, world, "tile", op=op).strategy == "tile"
    vaeshard.parallelize(vae, mode="tile")
    assert_identical(_run(vae, op, x), reference, f"tile {op} {shape}")


def _spatial(rank, world, op, shape, mode, expect=None):
    x = _input(op, shape)
    reference = reference_from_rank0(rank, lambda: _diffusers(op, x, tiled=False))
    vae = build(MODEL)
    vaeshard.parallelize(vae, mode=mode)
    strategy = vaeshard.plan(vae, x.shape, world, op=op).strategy
    assert strategy == (expect or mode), strategy
    with _no_mask():
        out = _run(vae, op, x)
    assert_close(out, reference, CPU_FP32_GROUPNORM, f"{mode} {op} {shape}")


def _mid_block():
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoMidBlock3D

    torch.manual_seed(5)
    block = HunyuanVideoMidBlock3D(8, resnet_groups=2, attention_head_dim=4).eval()  # two heads
    with torch.no_grad():
        for m in block.modules():
            if type(m) is torch.nn.GroupNorm:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
    return block


def _sharded_mid_block(rank, world):
    """The mid-block alone (two heads, batch 2) on both axes against diffusers' masked form."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoCausalConv3d

    from vaeshard.layers.frame_causal_attention import FrameCausalMidBlock
    from vaeshard.layers.halo import HaloPadThenConv as HaloReplicateCausalConv3d
    from vaeshard.layers.norms import GlobalGroupNorm
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    block = _mid_block()
    x = latent((2, 8, 3, 7, 5), seed=6)
    with torch.no_grad():
        reference = block(x)
    swap.swap(block, FrameCausalMidBlock)
    for m in block.modules():
        if type(m) is torch.nn.GroupNorm:
            swap.swap(m, GlobalGroupNorm)
        elif isinstance(m, HunyuanVideoCausalConv3d):
            swap.swap(m, HaloReplicateCausalConv3d)
    comm = Comm.for_group(torch.distributed.group.WORLD)
    for axis, dim in ((spatial.HEIGHT, 3), (spatial.WIDTH, 4)):
        extents = spatial.split_extents(x.shape[dim], world)  # 7 rows over 3: 3, 2, 2
        start = sum(extents[:rank])
        ctx = spatial.ShardContext(comm=comm, axis=axis, extents=extents)
        with torch.no_grad(), _no_mask(), spatial.sharding(ctx):
            out = block(x.narrow(dim, start, extents[rank]))
        assert_close(out, reference.narrow(dim, start, extents[rank]), CPU_FP32_GROUPNORM, axis)


def _auto_as_built(rank, world, shape, strategy):
    """auto on the VAE as diffusers builds it (frame-wise decoding on, tiling off): a clip longer than
    one chunk decodes in chunks of time, which `tile` gives where a frame fits one tile, and only the
    VAE's own decode (one rank's, shared) where it does not: diffusers' decode either way."""
    x = _input("decode", shape)

    def diffusers_decode():
        with torch.no_grad():
            return _run(build(MODEL), "decode", x)

    reference = reference_from_rank0(rank, diffusers_decode)
    vae = build(MODEL)
    plan = vaeshard.plan(vae, x.shape, world)
    assert plan.strategy == strategy and not plan.changes_result, plan.explain()
    vaeshard.parallelize(vae)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("vaeshard").addHandler(handler)
    try:
        if strategy == "direct":  # the fast tier: the mid-block attention without the mask, within tolerance
            assert_close(_run(vae, "decode", x), reference, CPU_FP32_GROUPNORM, f"auto {shape}")
            vaeshard.parallelize(vae, exact=True)
            assert_identical(_run(vae, "decode", x), reference, f"auto {shape}, exact=True")
        else:
            assert_identical(_run(vae, "decode", x), reference, f"auto {shape}")
    finally:
        logging.getLogger("vaeshard").removeHandler(handler)
    # one rank decoding a sharded group's request is said once in the log, with how to shard it
    assert len([m for m in seen if "use_framewise_decoding = " in m]) == (strategy == "direct"), seen


# world -> the checks of its one launch: (function, args)
LAUNCHES = {
    2: [
        # tile: time and space, 3 chunks (the last of one frame) of 1 x 2 tiles
        (_tile, ("decode", (1, 4, 7, 3, 5), 3, 2)),
        (_tile, ("decode", (1, 4, 2, 7, 5), 1, 6)),  # space only
        (_tile, ("encode", (1, 3, 17, 40, 48), 2, 4)),  # time and space
        (_spatial, ("decode", (1, 4, 5, 7, 5), "spatial_shard_height")),  # 4 / 3 rows; 5 frames
        (_spatial, ("encode", (1, 3, 9, 16, 40), "spatial_shard_width")),  # 3 / 2 latent columns
        (_auto_as_built, ((1, 4, 7, 3, 4), "tile")),  # 3 chunks in time of one 3 x 4 tile
        (_auto_as_built, ((1, 4, 7, 3, 5), "direct")),  # 3 chunks of frames wider than a tile
    ],
    3: [
        (_tile, ("decode", (1, 4, 6, 4, 5), 2, 4)),  # time and space, 2 x 2 tiles
        (_tile, ("decode", (1, 4, 6, 4, 4), 2, 1)),  # time only: 2 tiles over 3 ranks
        (_tile, ("encode", (1, 3, 5, 40, 56), 1, 6)),  # space only
        # auto: the longer axis, 3 / 3 / 2 columns, batch 2
        (_spatial, ("decode", (2, 4, 2, 4, 8), "auto", "spatial_shard_width")),
        (_spatial, ("encode", (1, 3, 5, 40, 16), "spatial_shard_height")),  # 2 / 2 / 1 latent rows
        (_sharded_mid_block, ()),
    ],
    4: [
        (_spatial, ("decode", (1, 4, 1, 9, 3), "spatial_shard_height")),  # 3 / 2 / 2 / 2 rows
        (_spatial, ("decode", (1, 4, 3, 3, 4), "spatial_shard_width")),  # one column each
        (_spatial, ("encode", (1, 3, 1, 16, 32), "spatial_shard_width")),  # one latent column each
    ],
}


def _launch(rank, world):
    for fn, args in LAUNCHES[world]:
        fn(rank, world, *args)
    return world


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_tile_bit_identical_and_spatial_within_tolerance(world):
    assert run_ranks(_launch, world) == [world] * world


# -- single process ------------------------------------------------------------------------------------


def test_frame_causal_attention_matches_diffusers_masked_attention():
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import prepare_causal_attention_mask

    from vaeshard.layers.frame_causal_attention import attention_causal_by_frame

    attn = _mid_block().attentions[0]
    x = latent((2, 8, 4, 3, 5), seed=4)
    b, c, t, h, w = x.shape
    with torch.no_grad():
        tokens = x.permute(0, 2, 3, 4, 1).flatten(1, 3)
        mask = prepare_causal_attention_mask(t, h * w, x.dtype, x.device, batch_size=b)
        reference = attn(tokens, attention_mask=mask).unflatten(1, (t, h, w)).permute(0, 4, 1, 2, 3)
        out = attention_causal_by_frame(None, attn, x)
    assert_close(out, reference, CPU_FP32, "attention")
    attn.set_processor(type("Other", (), {"__call__": lambda *a, **k: None})())
    with pytest.raises(ValueError, match="processor is Other"):
        attention_causal_by_frame(None, attn, x)


def _real_on_meta():
    from diffusers import AutoencoderKLHunyuanVideo

    with torch.device("meta"):
        return AutoencoderKLHunyuanVideo().eval()


def test_real_config_layers_tile_grids_and_plan():
    from vaeshard.families.hunyuanvideo import FAMILY

    vae = _real_on_meta()  # diffusers' defaults are HunyuanVideo's VAE: shapes only
    assert FAMILY.spatial_ratio(vae) == 8 and FAMILY.latent_channels(vae) == 16
    FAMILY.install_layers(vae)  # every layer of the real config is one vaeshard knows
    swapped = {n for n, m in vae.named_modules() if vaeshard.runtime.swap.is_swapped(m)}
    for name in (
        "decoder.mid_block",
        "encoder.mid_block",
        "decoder.mid_block.attentions.0.group_norm",
        "encoder.down_blocks.1.downsamplers.0.conv",  # stride (2, 2, 2)
        "decoder.up_blocks.0.upsamplers.0.conv",
        "decoder.conv_norm_out",
    ):
        assert name in swapped, name
    FAMILY.uninstall_layers(vae)
    assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())

    vae.enable_tiling()  # diffusers: 256-pixel tiles every 192, 16 frames every 12
    z = torch.empty((1, 16, 9, 40, 36), device="meta")  # 720p-like rows: 2 x 2 tiles, 3 chunks
    ops = FAMILY.decode_tile_ops(vae, z)
    assert ops.time.spans == ((0, 5), (3, 8), (6, 9)) and len(ops.grid.tiles) == 4
    with torch.no_grad():
        tile = vae.decoder(z[:, :, :5, :32, :32])
    assert tuple(tile.shape) == ops.out_shape((1, 16, 5, 32, 32)) == (1, 3, 17, 256, 256)
    assert (ops.grid.out_rows, ops.grid.out_cols) == (320, 288)
    x = torch.empty((1, 3, 33, 320, 288), device="meta")
    enc = FAMILY.encode_tile_ops(vae, x)
    assert enc.time.spans == ((0, 17), (12, 29), (24, 33))
    with torch.no_grad():
        one = vae.quant_conv(vae.encoder(x[:, :, :17, :256, :256]))
    assert tuple(one.shape) == enc.out_shape((1, 3, 17, 256, 256)) == (1, 32, 5, 32, 32)
    assert FAMILY.decode_tile_ops(vae, torch.empty((1, 16, 4, 32, 32), device="meta")) is None

    assert vaeshard.plan(vae, (1, 16, 33, 90, 160), 8).strategy == "tile"  # tiling on: diffusers' tiles
    vae.disable_tiling()  # frame-wise decoding still on: chunks in time of whole frames, the VAE's own
    assert "frame-wise" in vaeshard.plan(vae, (1, 16, 33, 90, 160), 8).explain()
    vae.use_framewise_decoding = vae.use_framewise_encoding = False  # the untiled decode: spatial shards
    assert vaeshard.plan(vae, (1, 16, 33, 90, 160), 8).strategy == "spatial_shard_width"
    plan = vaeshard.plan(vae, (1, 16, 33, 160, 90), 4)
    assert plan.strategy == "spatial_shard_height" and "longer axis" in plan.explain()
    assert vaeshard.plan(vae, (1, 3, 33, 720, 1280), 4, op="encode").strategy == "spatial_shard_width"
    odd = vaeshard.plan(vae, (1, 3, 33, 724, 40), 4, "spatial_shard_height", op="encode")
    assert odd.fallback and "multiple of 8" in odd.reason
    vae.use_framewise_decoding = vae.use_framewise_encoding = True
    assert vaeshard.plan(vae, (1, 16, 3, 32, 32), 4, "tile").strategy == "direct"  # one tile, one chunk
    assert vaeshard.plan(vae, (1, 16, 9, 32, 32), 4, "tile").strategy == "tile"  # chunks in time


def _other_processor(vae):
    vae.decoder.mid_block.attentions[0].set_processor(type("Other", (), {"__call__": lambda *a, **k: None})())


class TestHunyuanVideo(Refusals):
    """A layer vaeshard cannot shard is refused before any swap (tests/family_parity.py); the parity
    checks above run a world size's cases in one launch."""

    REFUSALS = [
        ("reflect-pad", MODEL, setting("encoder.down_blocks.0.resnets.0.conv1.pad_mode", "reflect"),
         "encoder.down_blocks.0.resnets.0.conv1"),
        ("other-processor", MODEL, _other_processor, "decoder.mid_block.attentions.0"),
        ("unknown-layer", MODEL, setting("decoder.conv_act", lambda: torch.nn.Upsample(scale_factor=1.0)),
         "decoder.conv_act"),
    ]  # fmt: skip


# -- the fast tier: the mid-block attention without the mask --------------------------------------------


def test_fast_tier_decodes_without_building_the_mask(monkeypatch):
    """One process, auto (direct: diffusers' default decode, in chunks of time, and untiled): the fast
    tier's mid-block attention never builds diffusers' (T*H*W)^2 mask and stays within the tolerance of
    diffusers' decode; the exact tier builds it and is diffusers' bit for bit."""
    import diffusers.models.autoencoders.autoencoder_kl_hunyuan_video as hv

    vae = build(MODEL)
    long, short = _input("decode", (1, 4, 7, 3, 5)), _input("decode", (1, 4, 3, 3, 5))
    with torch.no_grad():
        want = [vae.decode(z).sample for z in (long, short)]
    built = []
    original = hv.prepare_causal_attention_mask
    monkeypatch.setattr(hv, "prepare_causal_attention_mask", lambda *a, **k: built.append(a) or original(*a, **k))
    vaeshard.parallelize(vae)
    with torch.no_grad():
        got = [vae.decode(z).sample for z in (long, short)]
    assert built == []
    for g, w, what in zip(got, want, ("in chunks of time", "one chunk")):
        assert_close(g, w, CPU_FP32_GROUPNORM, what)
    vaeshard.parallelize(vae, exact=True)
    with torch.no_grad():
        assert_identical(vae.decode(short).sample, want[1], "exact tier")
    assert built


@pytest.mark.parametrize("heads", [1, 2])
def test_frame_causal_sdpa_is_the_masked_attention(heads):
    """frame_causal_sdpa against PyTorch's attention with the frame-causal mask written out (fp64)."""
    from vaeshard.layers.frame_causal_attention import frame_causal_sdpa

    b, c, t, h, w = 1, 4 * heads, 3, 2, 3
    q, k, v = (latent((b, c, t, h, w), seed=s).double() for s in (1, 2, 3))
    frame = torch.arange(t).repeat_interleave(h * w)
    mask = frame[:, None] >= frame[None, :]  # query frame i sees key frames 0..i

    def tokens(m):  # (B, C, T, h, w) -> (B, heads, T*h*w, C // heads)
        return m.permute(0, 2, 3, 4, 1).reshape(b, t * h * w, heads, c // heads).transpose(1, 2)

    want = torch.nn.functional.scaled_dot_product_attention(tokens(q), tokens(k), tokens(v), attn_mask=mask)
    want = want.transpose(1, 2).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
    got = frame_causal_sdpa(q, k, v, heads)
    assert got.shape == want.shape and (got - want).abs().max() < 1e-12


@pytest.mark.parametrize("tier_name", ["fast", "exact-asked-fast"])
def test_upsamplers_write_straight_into_the_padded_convolution_input(monkeypatch, tier_name):
    """Each decoder upsampler in the fast tier, and in the exact tier of a request that asked for the
    fast tier (tier.same_kernels; one rank), writes its nearest upsampling into its causal
    convolution's replicate-padded input: the output is diffusers' bit for bit (on the same input),
    and neither F.interpolate nor F.pad runs (diffusers makes the two pieces, their concatenation and
    the padded copy)."""
    import torch.nn.functional as F
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoUpsampleCausal3D

    from vaeshard.layers import tier

    vae = build(MODEL)
    ups = [m for m in vae.decoder.modules() if isinstance(m, HunyuanVideoUpsampleCausal3D)]
    assert {tuple(int(f) for f in m.upsample_factor)[0] for m in ups} == {1, 2}  # space only, and time too
    inputs = [latent((1, m.conv.conv.in_channels, frames, 3, 5), seed=frames) for m in ups for frames in (1, 4)]
    with torch.no_grad():
        want = [m(x) for m, x in zip([m for m in ups for _ in (1, 4)], inputs)]
    vaeshard.parallelize(vae)
    calls = []
    for name in ("interpolate", "pad"):
        original = getattr(F, name)
        monkeypatch.setattr(F, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    asked = tier.same_kernels
    if tier_name == "exact-asked-fast":  # the exact tier of a request whose plan allows vaeshard's kernels
        tier.same_kernels = lambda: True
    try:
        with torch.no_grad(), tier.active(tier.FastPlan() if tier_name == "fast" else None):
            got = [m(x) for m, x in zip([m for m in ups for _ in (1, 4)], inputs)]
    finally:
        tier.same_kernels = asked
    assert calls == []
    for g, w in zip(got, want):
        assert_identical(g, w, "upsampler")
    with torch.no_grad():  # outside either (exact=True, tile, no request): diffusers' forward
        assert_identical(ups[0](inputs[0]), want[0], "exact tier")
    assert calls
