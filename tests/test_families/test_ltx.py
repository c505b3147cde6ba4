"""LTX-Video 0.9.x (AutoencoderKLLTXVideo) and LTX-2 (AutoencoderKLLTX2Video): 5-D latents, a
timestep-conditioned decoder with optional noise from the global RNG, on gloo ranks.

tile: bit-identical to diffusers' `tiled_decode` / `tiled_encode` for the same global seed (the
noise of tiles other ranks decode is replayed), and the RNG left as diffusers leaves it; spatial
shard: within 1e-5 of diffusers' untiled decode / encode for that seed (CPU fp32), uneven shards.
Each world size runs all its checks in one call on the shared rank pool.
"""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard import families

from ..dist_harness import run_ranks
from ..models import latent
from ..parity import CPU_FP32, CPU_FP32_REAL_SIZES, assert_close, assert_identical, reference_from_rank0

SEED = 11
TEMB = torch.tensor([0.05])
TILES = dict(
    tile_sample_min_height=96,
    tile_sample_min_width=96,
    tile_sample_stride_height=64,
    tile_sample_stride_width=64,
)


def build_model(model: str, **overrides):
    from ..models import BUILDERS

    return BUILDERS[model](**overrides)


def _seeded_call(fn):
    torch.manual_seed(SEED)
    out = fn()
    return out, torch.rand(4)  # and the RNG's state after it


def _checks(rank, world, model, noise, tile):
    """Every check of `model` at this world size: spatial decode on both axes and encode (uneven:
    5 x 7 latent rows and columns), and where `tile` the tiled decode (12 tiles) and encode."""
    vae = build_model(model) if noise else build_model(model, decoder_inject_noise=(False,) * 4)
    z = latent((1, 4, 2, 5, 7))
    x = latent((1, 3, 9, 160, 224), seed=3).clamp(-1, 1)

    zz, tt = torch.cat([z, latent(z.shape, seed=2)]), torch.tensor([0.05, 0.3])  # two samples, two timesteps

    def untiled():
        dec, after = _seeded_call(lambda: vae.decode(z, TEMB).sample)
        extra = vae.decode(z, TEMB, False).sample if model == "ltx2" else None  # LTX-2: causal=False
        sliced = _seeded_call(lambda: torch.cat([vae.decode(zz[i : i + 1], tt[i : i + 1]).sample for i in (0, 1)]))
        return dec, after, vae.encode(x).latent_dist.parameters, extra, sliced[0]

    ref_dec, ref_after, ref_enc, ref_extra, ref_sliced = reference_from_rank0(rank, untiled)
    plan = vaeshard.plan(vae, z.shape, world)
    assert plan.strategy == "spatial_shard_width", plan.explain()
    for mode in ("spatial_shard_height", "spatial_shard_width"):
        vaeshard.parallelize(vae, mode=mode)
        assert vaeshard.plan(vae, z.shape).strategy == mode
        assert vaeshard.plan(vae, x.shape, op="encode").strategy == mode
        out, after = _seeded_call(lambda: vae.decode(z, TEMB).sample)
        assert_close(out, ref_dec, CPU_FP32, f"{model} {mode} decode over {world}")
        assert torch.equal(after, ref_after)  # every rank drew the whole noise: RNG as diffusers leaves it
        enc = vae.encode(x).latent_dist.parameters
        assert_close(enc, ref_enc, CPU_FP32, f"{model} {mode} encode over {world}")
    if model == "ltx2":  # the positional `causal` reaches every rank's decoder
        assert_close(vae.decode(z, TEMB, False).sample, ref_extra, CPU_FP32, "ltx2 causal=False")
    vae.enable_slicing()  # one sample at a time, each with its own timestep
    out, _ = _seeded_call(lambda: vae.decode(zz, tt).sample)
    assert_close(out, ref_sliced, CPU_FP32, f"{model} sliced batch over {world}")
    vae.disable_slicing()
    if not tile:
        return None
    vaeshard.unparallelize(vae)
    vae.enable_tiling(**TILES)
    z = latent((1, 4, 2, 6, 8))  # edge tiles of 2 latent rows: LTX-2's reflect padding needs them

    def tiled():
        dec, after = _seeded_call(lambda: vae.decode(z, TEMB).sample)
        return dec, after, vae.encode(x).latent_dist.parameters

    ref_dec, ref_after, ref_enc = reference_from_rank0(rank, tiled)
    vae.disable_tiling()
    vaeshard.parallelize(vae, mode="tile")
    assert vaeshard.plan(vae, z.shape).strategy == "tile"
    ops = families.family_for(vae).decode_tile_ops(vae, z)
    assert len(ops.grid.tiles) == 12 and (ops.skip is not None) == noise
    out, after = _seeded_call(lambda: vae.decode(z, TEMB).sample)
    assert_identical(out, ref_dec, f"{model} tile decode over {world}")
    assert torch.equal(after, ref_after)  # the other ranks' tiles' draws replayed
    enc = vae.encode(x).latent_dist.parameters
    assert_identical(enc, ref_enc, f"{model} tile encode over {world}")
    return None


CASES = [
    # model, world, noise, tile
    ("ltx", 2, True, True),
    ("ltx", 3, True, True),
    ("ltx", 4, False, False),
    ("ltx2", 2, False, True),
    ("ltx2", 3, True, True),
    ("ltx2", 4, True, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{w}-{'noise' if n else 'quiet'}" for m, w, n, _ in CASES])
def test_tile_and_spatial_parity(case):
    model, world, noise, tile = case
    run_ranks(_checks, world, model, noise, tile)


# -- the real configs (each class's diffusers defaults) at a tiny latent size ----------------------------


def _real_vae(cls_name: str):
    """LTX-Video's defaults, built whole; LTX-2's decoder only (its defaults hold 1.2 B parameters, the
    encoder 0.7 B of them): built on the meta device, the decoder then given seeded weights."""
    import diffusers

    torch.manual_seed(0)
    if cls_name == "AutoencoderKLLTXVideo":
        return diffusers.AutoencoderKLLTXVideo().eval()
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLLTX2Video().eval()
    vae.encoder = None
    vae.decoder.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in vae.decoder.parameters():
            fan_in = p[0].numel() if p.ndim > 1 else 1
            p.normal_(0.0, (1.0 / fan_in) ** 0.5 if p.ndim > 1 else 0.02, generator=g)
    return vae


def _real_parity(rank, world, cls_name):
    vae = _real_vae(cls_name)
    z = latent((1, 128, 2, 2, 3))
    x = latent((1, 3, 9, 64, 96), seed=3).clamp(-1, 1)
    with_encoder = vae.encoder is not None

    def reference():
        return vae.decode(z).sample, vae.encode(x).latent_dist.parameters if with_encoder else None

    ref_dec, ref_enc = reference_from_rank0(rank, reference)
    vaeshard.parallelize(vae, mode="spatial_shard_width", exact=True)
    assert vaeshard.plan(vae, z.shape).strategy == "spatial_shard_width"
    assert_close(vae.decode(z).sample, ref_dec, CPU_FP32_REAL_SIZES, f"{cls_name} defaults, width over {world}")
    if with_encoder:
        enc = vae.encode(x).latent_dist.parameters
        assert_close(enc, ref_enc, CPU_FP32_REAL_SIZES, f"{cls_name} defaults, encode")


@pytest.mark.parametrize("cls_name", ["AutoencoderKLLTXVideo", "AutoencoderKLLTX2Video"])
def test_real_config_spatial_parity(cls_name):
    run_ranks(_real_parity, 2, cls_name)


@pytest.mark.parametrize("cls_name", ["AutoencoderKLLTXVideo", "AutoencoderKLLTX2Video"])
def test_real_config_shapes_and_layers_from_the_meta_device(cls_name):
    # every layer of the real config is accepted, and the tile hooks predict diffusers' shapes
    import diffusers

    with torch.device("meta"):
        vae = getattr(diffusers, cls_name)()
    family = families.family_for(vae)
    family.install_layers(vae)
    family.uninstall_layers(vae)
    z = torch.empty(1, 128, 3, 20, 24, device="meta")
    x = torch.empty(1, 3, 17, 640, 768, device="meta")
    with torch.no_grad():
        dec = vae.decoder(z, None)
        enc = vae.encoder(x)
    assert family._decoded_shape(vae, z.shape) == tuple(dec.shape)
    assert family._encoded_shape(vae, x.shape) == tuple(enc.shape)
    assert family.spatial_ratio(vae) == 32 and family.latent_channels(vae) == 128
    assert len(family.decode_tile_ops(vae, z).grid.tiles) > 1 and family.encode_tile_ops(vae, x) is not None


def _different_timesteps(rank, world):
    vae = vaeshard.parallelize(build_model("ltx", decoder_inject_noise=(False,) * 4), mode="spatial_shard_width")
    z = latent((1, 4, 2, 5, 7))
    with pytest.raises(ValueError, match="same extra inputs") as refused:
        vae.decode(z, TEMB * (rank + 1))  # each rank its own timestep: refused on every rank, before any work
    assert "inputs " in str(refused.value)  # each rank's digest is shown
    return tuple(vae.decode(z, TEMB).sample.shape)  # the group still decodes


def test_ranks_with_different_timesteps_are_refused():
    assert len(set(run_ranks(_different_timesteps, 2))) == 1


def _noise_needs_one_seed(rank, world):
    vae = build_model("ltx")  # noise on
    z = latent((1, 4, 2, 5, 7))
    torch.manual_seed(SEED + rank)  # each rank its own RNG state: its noise would differ
    vaeshard.parallelize(vae, mode="spatial_shard_width")
    with pytest.raises(ValueError, match="seed every rank alike"):
        vae.decode(z, TEMB)
    # a direct decode (one latent pixel: no axis covers the group) keeps every rank's RNG in step
    # with rank 0's, which alone decodes: two requests in a row equal diffusers' two decodes
    small = latent((1, 4, 2, 1, 1), seed=4)
    vaeshard.unparallelize(vae)

    def twice():
        torch.manual_seed(SEED)
        return vae.decode(small, TEMB).sample, vae.decode(small, TEMB).sample

    want = reference_from_rank0(rank, twice)
    vaeshard.parallelize(vae)
    assert vaeshard.plan(vae, small.shape).strategy == "direct"
    torch.manual_seed(SEED)
    got = vae.decode(small, TEMB).sample, vae.decode(small, TEMB).sample
    for g, w in zip(got, want):
        assert_identical(g, w, "direct decode with noise")


def test_decoder_noise_needs_one_seed_and_direct_keeps_ranks_in_step():
    run_ranks(_noise_needs_one_seed, 2)


# -- the fast tier: RMS norms in parts of frames ---------------------------------------------------------


@pytest.mark.parametrize("model", ["ltx", "ltx2"])
def test_fast_tier_norms_run_in_parts_of_frames_with_diffusers_values(model, monkeypatch):
    """With a part bound below one frame's temporaries, each RMS norm of the decoder runs on one frame
    at a time into one output: the decode is within the CPU fp32 tolerance of diffusers' (a norm reads
    only each voxel's channels; a part's sums may round otherwise in the last bit), every norm call of
    the decode ran in parts, and the exact tier is diffusers' bit for bit, on whole maps."""
    from vaeshard.fast import norm_parts

    vae = build_model(model, decoder_inject_noise=(False,) * 4) if model == "ltx" else build_model(model)
    z = latent((1, 4, 5, 3, 4))
    kwargs = {"temb": TEMB}
    with torch.no_grad():
        want = _seeded_call(lambda: vae.decode(z, **kwargs).sample)[0]  # (decoder noise: the same seed each time)
    mixin = norm_parts.FramePartsRMSNorm if model == "ltx" else norm_parts.FramePartsPerChannelRMSNorm
    norm_class = type(next(m for m in vae.decoder.modules() if type(m).__name__ in ("RMSNorm", "PerChannelRMSNorm")))
    parts, whole = [], []
    part_into, forward = mixin.part_into, norm_class.forward
    monkeypatch.setattr(mixin, "part_into", lambda self, x, out: parts.append(x.shape) or part_into(self, x, out))
    monkeypatch.setattr(
        norm_class, "forward", lambda self, x, *a, **k: whole.append(x.shape) or forward(self, x, *a, **k)
    )
    vaeshard.parallelize(vae)
    monkeypatch.setattr(norm_parts, "PART_BYTES", 1)  # one frame per part
    with torch.no_grad():
        got = _seeded_call(lambda: vae.decode(z, **kwargs).sample)[0]
    assert_close(got, want, CPU_FP32, f"{model} fast tier")
    frame_dim = mixin.FRAME_DIM  # RMSNorm takes a channels-last view; PerChannelRMSNorm (B, C, T, H, W)
    assert parts and whole == [] and max(s[frame_dim] for s in parts) == 1, (parts, whole)
    vaeshard.parallelize(vae, exact=True)
    parts.clear()
    with torch.no_grad():
        assert_identical(_seeded_call(lambda: vae.decode(z, **kwargs).sample)[0], want, f"{model} exact tier")
    assert parts == [] and max(s[frame_dim] for s in whole) > 1  # diffusers' forward on whole maps
