"""HunyuanVideo 1.5 (AutoencoderKLHunyuanVideo15): 5-D latents, tile and spatial-shard decode and
encode on gloo ranks.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode`; spatial shard: within 1e-5 of the
untiled decode and encode (CPU fp32), the mid-block attention computed without diffusers' mask; the
frame-causal attention against diffusers' masked form on the whole tensor; the real config (on the
meta device: its layers, tile grid and plan) and the real layout at 16x with small widths.
"""

from __future__ import annotations

import pytest
import torch

import vaeshard

from ..dist_harness import run_ranks
from ..models import build, latent
from ..parity import CPU_FP32, assert_close, assert_identical, reference_from_rank0


def _build(model: str, tiles=None):
    """`tiles=(sample_h, sample_w, latent_h, latent_w, overlap)` sets diffusers' tile settings."""
    vae = build(model)
    if tiles is not None:
        (
            vae.tile_sample_min_height,
            vae.tile_sample_min_width,
            vae.tile_latent_min_height,
            vae.tile_latent_min_width,
            vae.tile_overlap_factor,
        ) = tiles
    return vae


def _sample(shape, seed: int = 3):
    return latent(shape, seed=seed).clamp(-1, 1)


class _NoMask:
    """Makes diffusers' (T*H*W)^2 mask fail while active: a sharded request must not build it."""

    def __enter__(self):
        from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

        self.cls = HunyuanVideo15AttnBlock
        self.saved = self.cls.__dict__["prepare_causal_attention_mask"]

        def refuse(*args, **kwargs):
            raise AssertionError("the sharded attention built diffusers' full mask")

        self.cls.prepare_causal_attention_mask = staticmethod(refuse)

    def __exit__(self, *exc):
        self.cls.prepare_causal_attention_mask = self.saved


# -- the frame-causal attention against diffusers' masked form ---------------------------------------


def _attention_block():
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    torch.manual_seed(5)
    block = HunyuanVideo15AttnBlock(8).eval()
    with torch.no_grad():
        block.norm.gamma.copy_(torch.rand_like(block.norm.gamma) + 0.5)
    return block


def _per_sample(fn, x):
    """diffusers' result sample by sample: its mid-block attention broadcasts its (B, L, L) mask
    against (B, 1, L, L) scores, which fails for a batch of more than one."""
    return torch.cat([fn(part) for part in x.split(1)])


def test_frame_causal_attention_matches_the_masked_form_in_chunks():
    from vaeshard.layers.frame_causal_attention import frame_causal_attention

    block = _attention_block()
    x = latent((2, 8, 4, 5, 3), seed=4)
    with torch.no_grad():
        reference = _per_sample(block, x)
        h = block.norm(x)
        q, k, v = block.to_q(h), block.to_k(h), block.to_v(h)
        for per_call in (1 << 26, 7):  # whole frames, and query rows in chunks of a few
            out = block.proj_out(frame_causal_attention(q, k, v, scores_per_call=per_call)) + x
            assert_close(out, reference, CPU_FP32, f"scores_per_call={per_call}")
        first = block(x[:1, :, :1])  # frame 0 sees itself only
    assert (reference[:1, :, 0] - first[:, :, 0]).abs().max() < 1e-5


def _sharded_attention(rank, world):
    from vaeshard.layers.frame_causal_attention import FrameCausalAttention
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    block = _attention_block()
    x = latent((2, 8, 3, 7, 5), seed=6)
    with torch.no_grad():
        reference = _per_sample(block, x)  # diffusers: one sdpa with the (T*H*W)^2 causal-by-frame mask
    swap.swap(block, FrameCausalAttention)
    comm = Comm.for_group(torch.distributed.group.WORLD)
    for axis, dim in ((spatial.HEIGHT, 3), (spatial.WIDTH, 4)):
        extents = spatial.split_extents(x.shape[dim], world)  # 7 rows over 3: 3, 2, 2
        start = sum(extents[:rank])
        ctx = spatial.ShardContext(comm=comm, axis=axis, extents=extents)
        with torch.no_grad(), _NoMask(), spatial.sharding(ctx):
            out = block(x.narrow(dim, start, extents[rank]))
        assert_close(out, reference.narrow(dim, start, extents[rank]), CPU_FP32, axis)


def test_sharded_frame_causal_attention_matches_the_masked_form():
    run_ranks(_sharded_attention, 3)


# -- tile: bit-identical to diffusers ----------------------------------------------------------------


def _tile_parity(rank, world, model, tiles, shape, op):
    vae = _build(model, tiles)
    x = latent(shape) if op == "decode" else _sample(shape)

    def diffusers_tiled():
        with torch.no_grad():
            return vae.tiled_decode(x) if op == "decode" else vae.tiled_encode(x)

    reference = reference_from_rank0(rank, diffusers_tiled)
    assert vaeshard.plan(vae, x.shape, world, "tile", op=op).strategy == "tile"
    vaeshard.parallelize(vae, mode="tile")
    if op == "decode":
        out = vae.decode(x).sample
    else:
        out = vae.encode(x).latent_dist.parameters
    assert_identical(out, reference, f"tile {op}")
    return tuple(out.shape)


TILE_CASES = [
    # id, model, tiles (sample h, w, latent h, w, overlap), shape, world, op
    ("decode-12-tiles-2", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 4, 2, 7, 10), 2, "decode"),
    ("decode-rect-rounding-3", "hunyuanvideo15", (16, 24, 4, 6, 0.3), (1, 4, 2, 9, 8), 3, "decode"),
    ("decode-fewer-tiles-than-ranks-3", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 4, 1, 5, 4), 3, "decode"),
    ("encode-2", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 3, 3, 32, 40), 2, "encode"),
    ("encode-rect-3", "hunyuanvideo15", (16, 32, 4, 8, 0.25), (1, 3, 5, 28, 40), 3, "encode"),
    ("layout-16x-decode-2", "hunyuanvideo15_layout", (64, 64, 4, 4, 0.25), (1, 32, 2, 6, 5), 2, "decode"),
]


@pytest.mark.parametrize("case", TILE_CASES, ids=[c[0] for c in TILE_CASES])
def test_tile_bit_identical(case):
    _, model, tiles, shape, world, op = case
    assert len(set(run_ranks(_tile_parity, world, model, tiles, shape, op))) == 1


# -- spatial shard: the untiled decode and encode within 1e-5 ------------------------------------------


def _spatial_parity(rank, world, model, shape, mode, op):
    vae = _build(model)
    x = latent(shape) if op == "decode" else _sample(shape)

    def diffusers_untiled():
        with torch.no_grad():
            if op == "decode":
                return _per_sample(lambda part: vae.decode(part).sample, x)
            return _per_sample(lambda part: vae.encode(part).latent_dist.parameters, x)

    reference = reference_from_rank0(rank, diffusers_untiled)
    vaeshard.parallelize(vae, mode=mode)
    strategy = vaeshard.plan(vae, x.shape, world, mode, op=op).strategy
    assert strategy.startswith("spatial_shard"), strategy
    with _NoMask():
        out = vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters
    assert_close(out, reference, CPU_FP32, f"{mode} {op}")
    return strategy


SPATIAL_CASES = [
    # id, model, shape, world, mode, op
    ("decode-h-2-uneven", "hunyuanvideo15", (1, 4, 2, 7, 5), 2, "spatial_shard_height", "decode"),
    ("decode-w-3-uneven-batch2", "hunyuanvideo15", (2, 4, 2, 4, 8), 3, "spatial_shard_width", "decode"),
    ("decode-h-4-9rows", "hunyuanvideo15", (1, 4, 3, 9, 3), 4, "spatial_shard_height", "decode"),
    ("decode-w-4-one-column-each", "hunyuanvideo15", (1, 4, 2, 3, 4), 4, "spatial_shard_width", "decode"),
    ("decode-auto-3", "hunyuanvideo15", (1, 4, 2, 4, 7), 3, "auto", "decode"),
    ("encode-h-3-uneven", "hunyuanvideo15", (1, 3, 5, 28, 12), 3, "spatial_shard_height", "encode"),
    ("encode-w-2", "hunyuanvideo15", (1, 3, 3, 12, 20), 2, "spatial_shard_width", "encode"),
    ("encode-w-4-one-column-each", "hunyuanvideo15", (1, 3, 3, 8, 16), 4, "spatial_shard_width", "encode"),
    ("layout-16x-decode-h-3", "hunyuanvideo15_layout", (1, 32, 2, 4, 3), 3, "spatial_shard_height", "decode"),
    ("layout-16x-encode-w-2", "hunyuanvideo15_layout", (1, 3, 5, 32, 48), 2, "spatial_shard_width", "encode"),
]


@pytest.mark.parametrize("case", SPATIAL_CASES, ids=[c[0] for c in SPATIAL_CASES])
def test_spatial_matches_untiled(case):
    _, model, shape, world, mode, op = case
    strategies = run_ranks(_spatial_parity, world, model, shape, mode, op)
    if mode == "auto":
        assert strategies[0] == "spatial_shard_width"


# -- the real config (diffusers' defaults), plan, install ------------------------------------------------


def _real_on_meta():
    from diffusers import AutoencoderKLHunyuanVideo15

    with torch.device("meta"):
        return AutoencoderKLHunyuanVideo15().eval()


def test_real_config_layers_tile_grid_and_plan():
    from vaeshard.families.hunyuanvideo15 import FAMILY

    vae = _real_on_meta()  # 1.3 B parameters: shapes only
    assert FAMILY.spatial_ratio(vae) == 16 and FAMILY.latent_channels(vae) == 32
    FAMILY.install_layers(vae)  # every layer of the real config is one vaeshard knows
    swapped = {n for n, m in vae.named_modules() if vaeshard.runtime.swap.is_swapped(m)}
    assert "decoder.mid_block.attentions.0" in swapped and "encoder.mid_block.attentions.0" in swapped
    assert "decoder.up_blocks.0.upsamplers.0.conv" in swapped and "encoder.conv_out" in swapped
    FAMILY.uninstall_layers(vae)
    z = torch.empty((1, 32, 3, 20, 18), device="meta")  # 2 x 2 of diffusers' 16-row latent tiles
    ops = FAMILY.decode_tile_ops(vae, z)
    assert len(ops.grid.tiles) == 4
    with torch.no_grad():
        tiled = vae.tiled_decode(z)
        tile = vae.decoder(z[..., :16, :16])
    assert tuple(tile.shape) == ops.out_shape((1, 32, 3, 16, 16))
    assert (ops.grid.out_rows, ops.grid.out_cols) == tuple(tiled.shape[-2:]) == (320, 288)
    x = torch.empty((1, 3, 9, 320, 288), device="meta")
    enc = FAMILY.encode_tile_ops(vae, x)
    with torch.no_grad():
        moments = vae.tiled_encode(x)
        one = vae.encoder(x[..., :256, :256])
    assert tuple(one.shape) == enc.out_shape((1, 3, 9, 256, 256))
    assert (enc.grid.out_rows, enc.grid.out_cols) == tuple(moments.shape[-2:])
    plan = vaeshard.plan(vae, (1, 32, 3, 20, 18), 4)
    assert plan.strategy == "spatial_shard_height", plan.explain()
    assert "frame loop:" in plan.explain() and plan.fast.frames_per_step == 1  # (the meta device: 1)
    assert vaeshard.plan(vae, (1, 32, 3, 8, 30), 4).strategy == "spatial_shard_width"
    assert vaeshard.plan(vae, (1, 3, 9, 320, 288), 4, op="encode").strategy == "spatial_shard_height"
    odd = vaeshard.plan(vae, (1, 3, 9, 328, 40), 4, "spatial_shard_height", op="encode")
    assert odd.fallback and "multiple of 16" in odd.reason
    assert vaeshard.plan(vae, (1, 32, 3, 8, 8), 4, "tile").strategy == "direct"  # one tile
    assert "4-D" in vaeshard.plan(vae, (1, 32, 8, 8), 2, "spatial_shard_width").reason


def test_install_refuses_an_unknown_layer_before_swapping():
    from vaeshard.families.hunyuanvideo15 import FAMILY

    vae = _build("hunyuanvideo15")
    vae.encoder.down_blocks[0].resnets[0].conv1.pad_mode = "reflect"
    with pytest.raises(ValueError, match="encoder.down_blocks.0.resnets.0.conv1"):
        FAMILY.install_layers(vae)
    vae = _build("hunyuanvideo15")
    vae.decoder.mid_block.resnets[0].norm1.channel_first = False
    with pytest.raises(ValueError, match="decoder.mid_block.resnets.0.norm1"):
        FAMILY.install_layers(vae)
    vae = _build("hunyuanvideo15")
    vae.decoder.conv_act = torch.nn.Upsample(scale_factor=1.0)
    with pytest.raises(ValueError, match="decoder.conv_act"):
        FAMILY.install_layers(vae)
    assert not any(vaeshard.runtime.swap.is_swapped(m) for m in vae.modules())


# -- the fast tier's frame loop: diffusers' untiled decode within 1e-5, memory per call -------------------


def _fast(vae, mode: str = "auto", frames_per_step: int = 1):
    return vaeshard.parallelize(vae, mode, fast=vaeshard.FastOptions(frames_per_step=frames_per_step))


def _streamed(vae, z) -> list[torch.Tensor]:
    with vaeshard.stream_decode(vae, z) as chunks:
        return list(chunks)


def test_frame_loop_direct_and_streamed_match_diffusers():
    from vaeshard.fast.frame_loop import num_steps

    vae = _build("hunyuanvideo15")
    latents = {frames: latent((1, 4, frames, 5, 6), seed=frames) for frames in (1, 2, 3, 4)}
    x = _sample((1, 3, 5, 16, 12))  # encode in the fast tier: its mid-block attention without the mask
    with torch.no_grad():
        references = {frames: vae.decode(z).sample for frames, z in latents.items()}
        moments = vae.encode(x).latent_dist.parameters
    for frames, z in latents.items():
        for per_step in (1, 2):
            what = f"{frames} latent frames, {per_step} per step"
            _fast(vae, frames_per_step=per_step)
            plan = vaeshard.plan(vae, z.shape)
            assert plan.strategy == "direct" and plan.fast.frames_per_step == per_step, what
            text = plan.explain()
            assert "frame loop:" in text and "cuda_graphs: off" in text and "layer frames: whole decoder" in text
            out = vae.decode(z).sample
            assert_close(out, references[frames], CPU_FP32, what)
            chunks = _streamed(vae, z)
            assert len(chunks) == num_steps(frames, per_step) and chunks[0].shape[2] == 1, what
            assert torch.equal(torch.cat(chunks, dim=2), out), what
    assert_close(vae.encode(x).latent_dist.parameters, moments, CPU_FP32, "fast-tier encode")
    vaeshard.parallelize(vae, exact=True)  # the exact tier: diffusers' whole-clip decode, bit for bit, once
    assert vaeshard.plan(vae, latents[3].shape).fast is None
    assert_identical(vae.decode(latents[3]).sample, references[3], "exact")
    assert_identical(vae.encode(x).latent_dist.parameters, moments, "exact encode")
    chunks = _streamed(vae, latents[3])
    assert len(chunks) == 1 and torch.equal(chunks[0], references[3])


def test_frame_loop_bounds_the_largest_activation():
    """The largest output of a layer after the mid block follows the frames per call, not the clip:
    the same for 2 and 6 latent frames a call at a time, where diffusers' grows with the clip."""
    vae = _build("hunyuanvideo15")
    decoder = vae.decoder
    largest = [0]

    def record(module, inputs, output):
        largest[0] = max(largest[0], output.numel())

    looped = [decoder.up_blocks, decoder.norm_out, decoder.conv_act, decoder.conv_out]
    hooks = [m.register_forward_hook(record) for part in looped for m in part.modules()]

    def largest_of(frames: int, per_step: int | None) -> int:
        z = latent((1, 4, frames, 5, 6), seed=frames)
        if per_step is not None:
            _fast(vae, frames_per_step=per_step)
        largest[0] = 0
        with torch.no_grad():
            vae.decode(z)
        if per_step is not None:
            vaeshard.unparallelize(vae)
        return largest[0]

    try:
        diffusers = {frames: largest_of(frames, None) for frames in (2, 6)}
        loop = {(frames, k): largest_of(frames, k) for frames in (2, 6) for k in (1, 2)}
    finally:
        for hook in hooks:
            hook.remove()
    frame = 8 * 20 * 24  # the widest full-resolution layer's values per output frame (8 channels, 20 x 24)
    assert diffusers[6] == 11 * frame and diffusers[2] == 3 * frame  # 1 + 2 (T - 1) output frames at once
    assert loop[2, 1] == loop[6, 1] == 2 * frame, loop  # one latent frame: 2 output frames a call
    assert loop[6, 2] == 4 * frame and loop[2, 2] == 2 * frame, loop


def _sharded_loop(rank, world):
    from vaeshard.fast.frame_loop import num_steps

    vae = _build("hunyuanvideo15")
    z = latent((1, 4, 4, 5, 7), seed=9)  # 5 rows and 7 columns: uneven over 2 and 3 ranks
    reference = reference_from_rank0(rank, lambda: _diffusers_decode(vae, z))
    seen = []
    for mode in ("spatial_shard_height", "spatial_shard_width"):
        for per_step in (1, 2):
            what = f"{mode}, {per_step} per step, {world} ranks"
            _fast(vae, mode, per_step)
            plan = vaeshard.plan(vae, z.shape)
            assert plan.strategy == mode and plan.fast.frames_per_step == per_step, what
            with _NoMask():
                out = vae.decode(z).sample
                chunks = _streamed(vae, z)
            assert_close(out, reference, CPU_FP32, what)
            assert len(chunks) == num_steps(4, per_step) and torch.equal(torch.cat(chunks, dim=2), out), what
            seen.append(mode)
    return seen


def _diffusers_decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


@pytest.mark.parametrize("world", [2, 3])
def test_frame_loop_sharded_matches_diffusers(world):
    run_ranks(_sharded_loop, world)
