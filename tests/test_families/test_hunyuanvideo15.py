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
from ..family_parity import FrameLoopParity, Refusals, SpatialParity, TileParity, fast, setting, streamed
from ..models import build, latent
from ..parity import CPU_FP32, assert_close, reference_from_rank0


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


# -- tile (bit-identical to diffusers), spatial shard, frame loop, refusals: the shared checks ------------


TILE_CASES = [
    # id, model, tiles (sample h, w, latent h, w, overlap), shape, world, op
    ("decode-12-tiles-2", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 4, 2, 7, 10), 2, "decode"),
    ("decode-rect-rounding-3", "hunyuanvideo15", (16, 24, 4, 6, 0.3), (1, 4, 2, 9, 8), 3, "decode"),
    ("decode-fewer-tiles-than-ranks-3", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 4, 1, 5, 4), 3, "decode"),
    ("encode-2", "hunyuanvideo15", (16, 16, 4, 4, 0.25), (1, 3, 3, 32, 40), 2, "encode"),
    ("encode-rect-3", "hunyuanvideo15", (16, 32, 4, 8, 0.25), (1, 3, 5, 28, 40), 3, "encode"),
    ("layout-16x-decode-2", "hunyuanvideo15_layout", (64, 64, 4, 4, 0.25), (1, 32, 2, 6, 5), 2, "decode"),
]

# spatial shard: the untiled decode and encode within 1e-5, the mid-block attention without the mask
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


class TestHunyuanVideo15(TileParity, SpatialParity, FrameLoopParity, Refusals):
    """The shared checks (tests/family_parity.py) with HunyuanVideo 1.5's configs and cases."""

    TILE_CASES = TILE_CASES
    SPATIAL_CASES = SPATIAL_CASES
    REFUSALS = [
        ("reflect-pad", "hunyuanvideo15", setting("encoder.down_blocks.0.resnets.0.conv1.pad_mode", "reflect"),
         "encoder.down_blocks.0.resnets.0.conv1"),
        ("channel-last-norm", "hunyuanvideo15", setting("decoder.mid_block.resnets.0.norm1.channel_first", False),
         "decoder.mid_block.resnets.0.norm1"),
        ("unknown-layer", "hunyuanvideo15", setting("decoder.conv_act", lambda: torch.nn.Upsample(scale_factor=1.0)),
         "decoder.conv_act"),
    ]  # fmt: skip
    # the frame loop: diffusers' untiled decode within 1e-5, the fast-tier encode too; memory per call
    LOOP_MODEL = "hunyuanvideo15"
    LOOP_LATENT = (4, 5, 6)
    LOOP_FRAMES = (1, 2, 3, 4)
    LOOP_EXPLAIN = ("frame loop:", "cuda_graphs: off", "layer frames: whole decoder")
    LOOP_ENCODE = (1, 3, 5, 16, 12)  # encode in the fast tier: its mid-block attention without the mask
    BOUND_FRAME_VALUES = 8 * 20 * 24  # the widest full-resolution layer's values per output frame (8 channels)
    BOUND_DIFFUSERS = {2: 3, 6: 11}  # 1 + 2 (T - 1) output frames at once
    BOUND_LOOP = {(2, 1): 2, (6, 1): 2, (2, 2): 2, (6, 2): 4}  # one latent frame: 2 output frames a call

    @staticmethod
    def set_tiles(vae, tiles):
        (
            vae.tile_sample_min_height,
            vae.tile_sample_min_width,
            vae.tile_latent_min_height,
            vae.tile_latent_min_width,
            vae.tile_overlap_factor,
        ) = tiles

    @classmethod
    def diffusers_untiled(cls, vae, x, op):
        return _per_sample(lambda part: cls.run(vae, part, op), x)

    @staticmethod
    def sharded():
        return _NoMask()

    @staticmethod
    def looped_modules(decoder):
        return [decoder.up_blocks, decoder.norm_out, decoder.conv_act, decoder.conv_out]


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


# -- the fast tier's frame loop sharded (the direct one: TestHunyuanVideo15) --------------------------------


def _sharded_loop(rank, world):
    from vaeshard.fast.frame_loop import num_steps

    vae = build("hunyuanvideo15")
    z = latent((1, 4, 4, 5, 7), seed=9)  # 5 rows and 7 columns: uneven over 2 and 3 ranks
    reference = reference_from_rank0(rank, lambda: _diffusers_decode(vae, z))
    seen = []
    for mode in ("spatial_shard_height", "spatial_shard_width"):
        for per_step in (1, 2):
            what = f"{mode}, {per_step} per step, {world} ranks"
            fast(vae, mode, per_step)
            plan = vaeshard.plan(vae, z.shape)
            assert plan.strategy == mode and plan.fast.frames_per_step == per_step, what
            with _NoMask():
                out = vae.decode(z).sample
                chunks = streamed(vae, z)
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
