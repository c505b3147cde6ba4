"""MiniMax-H3 (AutoencoderKLMiniMaxH3): 5-D latents, a ViT decoder and a causal conv encoder run per
temporal clip, tiling on by default; tile decode and encode on gloo ranks, one launch per world size.

tile: bit-identical (torch.equal) to diffusers' own decode / encode with its default tiling on: clips
overlapping in time (the latent padded by repetition), tiles whose overlaps differ per boundary, the
encoder's last clip padded by repeating the last frame and `token_drop` frames dropped, a one-frame
encode, the real clip geometry (17 frames, 3 dropped) at tiny widths, geometry set with
`enable_tiling(...)`, fewer tiles than ranks, batch 2. `auto` follows the VAE's tiling: bit for bit
with `exact=True`; in the fast tier (tiles of one shape batched) within CPU fp32 tolerance. With
tiling off, spatial shards of the clip's tokens (keys and values gathered per layer) within CPU fp32
tolerance of diffusers' untiled decode, uneven on 2, 3 and 4 ranks. The real config on the meta
device (grids, shapes, plan, layers).
"""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard import cast_as_loaded
from vaeshard.families import family_for

from .. import interpreter
from ..dist_harness import run_ranks
from ..models import latent, minimax_h3_small
from ..parity import (
    BF16_MAX,
    BF16_MAX_RATIO,
    BF16_MEAN_RATIO,
    CPU_FP32,
    assert_close,
    assert_identical,
    assert_real,
    reference_from_rank0,
)

REAL_CLIPS = {"clip_length": 17, "token_drop": 3}  # the released clip geometry (4x temporal: 5 latent frames)


def _build(overrides: dict, tiling=None):
    vae = minimax_h3_small(**overrides)
    if tiling is not None:
        vae.enable_tiling(*tiling)
    return vae


def _input(op: str, shape):
    return latent(shape) if op == "decode" else latent(shape, seed=3)


def _run(vae, op: str, x):
    return vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters


def _counts(vae, op, x):
    family = family_for(vae)
    ops = family.decode_tile_ops(vae, x) if op == "decode" else family.encode_tile_ops(vae, x)
    return len(ops.time.spans), len(ops.grid.tiles)


def _tile(rank, world, op, shape, clips, tiles, overrides=None, tiling=None, mode="tile", exact=False):
    """vaeshard's `mode` against diffusers' decode (encode) of the VAE as configured (tiling on)."""
    overrides = overrides or {}
    x = _input(op, shape)

    def diffusers():
        with torch.no_grad():
            return _run(_build(overrides, tiling), op, x)

    reference = reference_from_rank0(rank, diffusers)
    vae = _build(overrides, tiling)
    assert _counts(vae, op, x) == (clips, tiles)
    plan = vaeshard.plan(vae, x.shape, world, mode, op=op, exact=exact)
    assert plan.strategy == "tile" and not plan.changes_result, plan.explain()
    vaeshard.parallelize(vae, mode=mode, exact=exact)
    batches = []  # the batch of every decoder call on this rank (each begins with post_quant_conv)
    vae.post_quant_conv.register_forward_pre_hook(lambda module, args: batches.append(args[0].shape[0]))
    out = _run(vae, op, x)
    if plan.fast is None:
        assert_identical(out, reference, f"{mode} {op} {shape}")
        assert op == "encode" or set(batches) <= {shape[0]}, batches  # one tile at a time
    else:  # the fast tier: a rank's tiles of one shape in batches
        assert op == "decode" and "in batches" in plan.explain(), plan.explain()
        assert max(batches) > shape[0], batches
        assert_close(out, reference, CPU_FP32, f"{mode} fast {op} {shape}")


def _spatial(rank, world, shape, mode, expect=None, overrides=None):
    """A spatially sharded decode of the VAE with tiling off against diffusers' untiled decode: each
    rank's tokens attend over the whole clip (keys and values gathered), registers on every rank."""
    overrides = overrides or {}
    z = latent(shape)

    def diffusers():
        vae = _build(overrides)
        vae.disable_tiling()
        with torch.no_grad():
            return vae.decode(z).sample

    reference = reference_from_rank0(rank, diffusers)
    vae = _build(overrides)
    vae.disable_tiling()
    vaeshard.parallelize(vae, mode=mode)
    plan = vaeshard.plan(vae, z.shape, world)
    assert plan.strategy == (expect or mode) and not plan.changes_result, plan.explain()
    assert_close(vae.decode(z).sample, reference, CPU_FP32, f"{mode} {shape}")


def _encode_has_no_spatial_mode(rank, world):
    vae = _build({})
    plan = vaeshard.plan(vae, (1, 3, 12, 80, 72), world, "spatial_shard_height", op="encode")
    assert plan.strategy == "tile" and plan.fallback, plan.explain()
    assert "minimax_h3 has no spatial-shard encode" in plan.reason


LAUNCHES = {
    2: [
        # 2 clips (latent padded by one frame) of 2 x 2 tiles, overlaps 40 / 56 pixels
        (_tile, ("decode", (1, 4, 5, 11, 9), 2, 4)),
        (_tile, ("encode", (1, 3, 12, 80, 72), 2, 4)),  # last clip padded (12 -> 14 frames)
        (_tile, ("encode", (1, 3, 1, 80, 56), 1, 2)),  # one frame: one clip as it is, no token_drop
        (_tile, ("decode", (2, 4, 4, 9, 11), 2, 4), {"mode": "auto", "exact": True}),
        (_tile, ("decode", (1, 4, 5, 11, 9), 2, 4), {"mode": "auto"}),  # the fast tier
        (_encode_has_no_spatial_mode, ()),
        (_spatial, ((1, 4, 5, 11, 9), "spatial_shard_height")),  # 6 / 5 rows, 2 clips
        (_spatial, ((1, 4, 4, 7, 10), "auto", "spatial_shard_width")),  # tiling off: the longer axis
    ],
    3: [
        # enable_tiling(48, 48, 8, 8): 3 rows with overlaps 16 / 8, 2 columns overlapping by 24
        (_tile, ("decode", (1, 4, 2, 15, 9), 1, 6), {"tiling": (48, 48, 8, 8)}),
        (_tile, ("decode", (1, 4, 2, 8, 11), 1, 2)),  # one clip of 2 tiles over 3 ranks
        (_tile, ("decode", (1, 4, 7, 6, 9), 1, 2), {"overrides": REAL_CLIPS}),  # 17 * 1 + 5 frames
        (_tile, ("encode", (1, 3, 22, 48, 80), 2, 2), {"overrides": REAL_CLIPS}),  # 17 + 5 frames
        (_spatial, ((2, 4, 2, 5, 6), "spatial_shard_height")),  # batch 2, 2 / 2 / 1 rows
        (_spatial, ((1, 4, 7, 4, 8), "spatial_shard_width", None, REAL_CLIPS)),  # 3 / 3 / 2 columns
    ],
    4: [
        # the real clip geometry: 11 latent frames (1 repeated) in 2 clips of 2 x 2 uneven tiles
        (_tile, ("decode", (1, 4, 11, 9, 10), 2, 4), {"overrides": REAL_CLIPS}),
        (_tile, ("decode", (1, 4, 11, 9, 10), 2, 4), {"overrides": REAL_CLIPS, "mode": "auto"}),
        (_spatial, ((1, 4, 11, 6, 10), "spatial_shard_width", None, REAL_CLIPS)),  # 3 / 3 / 2 / 2 columns
        (_spatial, ((1, 4, 2, 9, 3), "spatial_shard_height")),  # 3 / 2 / 2 / 2 rows
    ],
}


def _launch(rank, world):
    for entry in LAUNCHES[world]:
        fn, args, kwargs = (*entry, {})[:3]
        fn(rank, world, *args, **kwargs)
    return world


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_tile_bit_identical_to_diffusers_tiled(world):
    assert run_ranks(_launch, world) == [world] * world


# -- single process ------------------------------------------------------------------------------------


def test_batched_tiles_match_tiles_one_at_a_time(monkeypatch):
    """The fast tier's batches (TileOps.run_many, at most tuning.MINIMAX_BATCH_TOKENS tokens a call) against
    diffusers' decoder run on each tile."""
    from vaeshard import tuning
    from vaeshard.layers import tier

    vae = _build({})
    z = latent((1, 4, 5, 11, 9))
    with tier.active(tier.FastPlan()):
        ops = family_for(vae).decode_tile_ops(vae, z)
    tiles = [t.cut(ops.source) for t in ops.all_tiles()]  # 8 tiles of 3 x 8 x 8 latent voxels
    assert len(tiles) == 8 and all(t.shape == tiles[0].shape for t in tiles)
    monkeypatch.setattr(tuning, "MINIMAX_BATCH_TOKENS", 3 * 3 * 8 * 8)  # three tiles a call: 3 + 3 + 2
    batches = []  # each decoder call begins with post_quant_conv
    vae.post_quant_conv.register_forward_pre_hook(lambda module, args: batches.append(args[0].shape[0]))
    with torch.no_grad():
        batched = ops.run_many(tiles)
        assert batches == [3, 3, 2]
        for tile, out in zip(tiles, batched, strict=True):
            assert_close(out, vae.decoder(vae.post_quant_conv(tile)), CPU_FP32, "batched tile")


def test_untiled_decode_aligns_the_latent_with_a_mixed_precision_decoder():
    """diffusers' `decode` casts the latent to `post_quant_conv`'s dtype before `_decode`; the untiled
    decode a sharded request runs on each rank does too (bf16 decoder, float32 pinned modules)."""
    vae = _build({})
    vae.disable_tiling()
    vae.decoder.to(torch.bfloat16)
    vae.post_quant_conv.to(torch.bfloat16)
    for name, param in vae.decoder.named_parameters():  # diffusers' _keep_in_fp32_modules of the decoder
        if any(part in name for part in ("norm1", "norm2", "norm_out", "scale1", "scale2")):
            param.data = param.data.float()
    z = latent((1, 4, 2, 4, 4))  # float32, one of the VAE's dtypes
    with torch.no_grad():
        assert_identical(family_for(vae).untiled_decode(vae, z), vae.decode(z).sample, "mixed precision")


def test_one_clip_of_one_tile_is_run_as_diffusers_runs_it():
    """One clip of one tile is no tile grid (diffusers runs the model once): one rank runs it."""
    vae = _build({})  # clips of 7 frames (2 latent frames, 1 dropped), tiles of 64 pixels
    family = family_for(vae)

    def meta(*shape):
        return torch.empty(shape, device="meta")

    assert family.encode_tile_ops(vae, meta(1, 3, 7, 64, 64)) is None
    assert len(family.encode_tile_ops(vae, meta(1, 3, 8, 64, 64)).time.spans) == 2
    assert family.decode_tile_ops(vae, meta(1, 4, 2, 8, 8)) is None
    assert len(family.decode_tile_ops(vae, meta(1, 4, 4, 8, 8)).time.spans) == 2
    assert vaeshard.plan(vae, (1, 3, 7, 64, 64), 2, op="encode").strategy == "direct"


@pytest.mark.parametrize("tiling", [True, False])
def test_too_few_latent_frames_are_refused_clearly(tiling):
    vae = _build(REAL_CLIPS)  # clips of 5 latent frames, 3 dropped: at least 3 frames
    if not tiling:
        vae.disable_tiling()
    z = latent((1, 4, 2, 4, 12))  # larger than one tile: diffusers' own decode fails on an empty list
    with pytest.raises(ValueError, match="non-empty"):
        vae.decode(z)
    assert vaeshard.plan(vae, z.shape, 2).strategy != "refused"  # planning does not raise
    vaeshard.parallelize(vae)
    with pytest.raises(ValueError, match="at least 3 frames"):
        vae.decode(z)


def test_spatial_plan_says_what_each_attention_gathers():
    """A spatial plan says what each rank holds beyond its tokens: each attention's gathered keys and
    values of the whole clip, 2 x B x frames x H x W x width x the weights' bytes, with the clip's
    frames as diffusers' own decode feeds its ViT decoder (hooked here); `tile` and one rank hold none."""
    vae = _build({})
    vae.disable_tiling()
    z = latent((1, 4, 5, 11, 9))
    fed = []
    handle = vae.decoder.register_forward_pre_hook(lambda module, args: fed.append(args[0].shape[2]))
    with torch.no_grad():
        vae.decode(z)
    handle.remove()
    width = vae.decoder.transformer_blocks[0].attn.to_k.out_features
    expected = 2 * 1 * max(fed) * 11 * 9 * width * 4 / 2**20  # float32 weights
    vaeshard.parallelize(vae)
    text = vaeshard.plan(vae, z.shape, 2, "spatial_shard_height").explain()
    assert f"gathers its clip's keys and values from every rank: {expected:.1f} MiB" in text, (expected, text)
    assert "memory:" not in vaeshard.plan(vae, z.shape, 1).explain()
    vae.enable_tiling(64, 64, 16, 16)
    assert "memory:" not in vaeshard.plan(vae, z.shape, 2, "tile").explain()


def test_real_config_tile_grids_shapes_and_plan():
    from diffusers import AutoencoderKLMiniMaxH3

    with torch.device("meta"):
        vae = AutoencoderKLMiniMaxH3().eval()  # diffusers' defaults are MiniMax-H3's VAE: shapes only
    family = family_for(vae)
    assert family.latent_channels(vae) == 24 and family.spatial_ratio(vae) == 16
    z = torch.empty((1, 24, 13, 45, 80), device="meta")  # 13 latent frames of 720 x 1280
    ops = family.decode_tile_ops(vae, z)
    assert ops.time.spans == ((0, 7), (5, 12), (10, 17)) and ops.source.shape[2] == 17  # 4 frames repeated
    assert (ops.grid.num_rows, ops.grid.num_cols) == (4, 7)  # 720: 4 tiles of 256; 1280: 7
    with torch.no_grad():
        tile = vae.decoder(vae.post_quant_conv(z[:, :, :7, :16, :16]))
    assert tuple(tile.shape) == ops.out_shape((1, 24, 7, 16, 16)) == (1, 3, 28, 256, 256)
    x = torch.empty((1, 3, 39, 720, 1280), device="meta")  # 17 * 2 + 5 frames: 5 * 2 + 2 latent frames
    enc = family.encode_tile_ops(vae, x)
    assert enc.time.spans == ((0, 17), (17, 34), (34, 51))
    with torch.no_grad():
        moments = vae.quant_conv(vae.encoder(x[:, :, :17, :256, :256]))
    assert tuple(moments.shape) == enc.out_shape((1, 3, 17, 256, 256)) == (1, 48, 5, 16, 16)
    plan = vaeshard.plan(vae, z.shape, 8)
    assert plan.strategy == "tile" and not plan.changes_result and plan.fast is not None, plan.explain()
    exact = vaeshard.plan(vae, z.shape, 8, exact=True)
    assert exact.fast is None and "bit for bit" in exact.result, exact.explain()
    vae.disable_tiling()  # untiled: the clip's tokens sharded over the ranks, by the longer axis
    assert vaeshard.plan(vae, z.shape, 8).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, x.shape, 8, op="encode").strategy == "direct"  # the encoder is not sharded
    family.install_layers(vae)  # every attention of the real decoder is one vaeshard can shard
    swapped = [n for n, m in vae.named_modules() if vaeshard.runtime.swap.is_swapped(m)]
    assert swapped[0] == "decoder" and len(swapped) == 1 + 36
    family.uninstall_layers(vae)


def test_named_configs_cast_as_diffusers_loads_them(tmp_path):
    """`cast_as_loaded` (how the named configs' random-weight models take a dtype) gives every parameter
    and buffer the dtype diffusers' from_pretrained(torch_dtype=bfloat16) gives it: MiniMax-H3 keeps its
    norms, residual scales and encoder in float32 (its `_keep_in_fp32_modules`)."""
    vae = _build({})
    vae.save_pretrained(tmp_path)
    loaded = type(vae).from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    cast = cast_as_loaded(_build({}), torch.bfloat16)
    want = {name: t.dtype for name, t in [*loaded.named_parameters(), *loaded.named_buffers()]}
    got = {name: t.dtype for name, t in [*cast.named_parameters(), *cast.named_buffers()]}
    assert got == want
    assert {torch.float32, torch.bfloat16} <= set(got.values())
    # the values: the same weights, each rounded once
    for (name, a), b in zip(loaded.state_dict().items(), cast.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_as_loaded_bf16_tiles_equal_diffusers():
    """The bf16 model as loaded (float32 norms and scales: a float32 residual stream) through `tile` and
    the fast tier's batched tiles on one rank, against diffusers' own tiled decode of it."""
    z = latent((1, 4, 5, 11, 9)).to(torch.bfloat16)
    with torch.no_grad():
        reference = cast_as_loaded(_build({}), torch.bfloat16).decode(z).sample
        vae = vaeshard.parallelize(cast_as_loaded(_build({}), torch.bfloat16), mode="tile")
        assert_identical(vae.decode(z).sample, reference, "tile")
        vae = vaeshard.parallelize(cast_as_loaded(_build({}), torch.bfloat16))  # auto: batched tiles
        assert "in batches" in vaeshard.plan(vae, z.shape, 1).explain()
        # bf16 batches may sum in another order than one tile at a time: the bf16 rule (tests/parity.py)
        # against the float32 decode of the same weights and diffusers' bf16 decode
        fp32 = _build({}).decode(z.float()).sample
        out = vae.decode(z).sample
    theirs, ours = (fp32 - reference.float()).abs(), (fp32 - out.float()).abs()
    assert_real(fp32)
    assert ours.max() <= BF16_MAX_RATIO * theirs.max() and ours.mean() <= BF16_MEAN_RATIO * theirs.mean()
    assert_close(out, reference, BF16_MAX, "fast tier bf16 against diffusers' bf16")


FUSED_BLOCKS = """
import torch, vaeshard
from tests.models import latent, minimax_h3_small
from tests.parity import BF16_MAX, BF16_MAX_RATIO, BF16_MEAN_RATIO, CPU_FP32
from vaeshard import cast_as_loaded
from vaeshard.kernels import token_block, triton_support
assert triton_support.interpreting()
calls = []
for name in ("qk_norm_rope", "residual_rms", "swiglu"):
    def counted(*args, _f=getattr(token_block, name), _n=name, **kwargs):
        calls.append(_n)
        return _f(*args, **kwargs)
    setattr(token_block, name, counted)
z = latent((1, 4, 5, 11, 9))  # 2 clips of 2 x 2 tiles
with torch.no_grad():
    ref = minimax_h3_small().decode(z).sample  # diffusers' tiled decode, fp32
    out = vaeshard.parallelize(minimax_h3_small()).decode(z).sample  # auto: batched tiles, one rank
    assert {"qk_norm_rope", "residual_rms", "swiglu"} <= set(calls), calls
    assert (out - ref).abs().max() <= CPU_FP32, (out - ref).abs().max()
    # bf16 as loaded (float32 norms and scales: a float32 stream): the bf16 rule against the fp32 decode
    ref16 = cast_as_loaded(minimax_h3_small(), torch.bfloat16).decode(z.bfloat16()).sample
    out16 = vaeshard.parallelize(cast_as_loaded(minimax_h3_small(), torch.bfloat16)).decode(z.bfloat16()).sample
theirs, ours = (ref16.float() - ref).abs(), (out16.float() - ref).abs()
assert ours.max() <= BF16_MAX_RATIO * theirs.max() and ours.mean() <= BF16_MEAN_RATIO * theirs.mean(), (ours, theirs)
assert (out16.float() - ref16.float()).abs().max() <= BF16_MAX
print("ok")
"""


FUSED_BLOCKS_JOB = interpreter.script("minimax-fused-blocks", FUSED_BLOCKS)


@pytest.mark.background(FUSED_BLOCKS_JOB)
def test_fused_token_blocks_match_diffusers_in_the_interpreter():
    """The fast tier's batched tiles run the ViT blocks with their elementwise passes fused
    (fast/token_blocks.py, kernels/token_block.py: Q/K norms with the rotary embedding, residual
    updates with the next norm), in Triton's interpreter: fp32 within CPU tolerance of diffusers' tiled
    decode, and the bf16 model as diffusers loads it within the bf16 rule."""
    run = interpreter.result(FUSED_BLOCKS_JOB, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
