"""benchmarks/comm_model.py's bytes per rank against the bytes gloo ranks count (runtime/traffic.py):
spatial_shard_height and tile decodes of tiny configs on 2 and 3 ranks, every rank and kind of
exchange exactly (the model predicts payloads from shapes, which have no rounding)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from vaeshard.runtime import traffic

from ..dist_harness import run_ranks
from ..models import build, latent

MODEL = Path(__file__).resolve().parents[2] / "benchmarks" / "comm_model.py"

# DC-AE's tiles: 16 sample pixels (4 latent) every 12
DCAE_TILES = {
    "tile_sample_min_height": 16,
    "tile_sample_min_width": 16,
    "tile_sample_stride_height": 12,
    "tile_sample_stride_width": 12,
    "tile_latent_min_height": 4,
    "tile_latent_min_width": 4,
}
# (family's tiny config, diffusers' tile settings that make the latent several tiles, latent shape)
CASES = [
    (
        "autoencoder_kl",
        {"tile_sample_min_size": 16, "tile_latent_min_size": 2, "tile_overlap_factor": 0.25},
        (1, 4, 7, 10),
    ),
    (
        "wan21",
        {
            "tile_sample_min_height": 32,
            "tile_sample_min_width": 32,
            "tile_sample_stride_height": 24,
            "tile_sample_stride_width": 24,
        },
        (1, 4, 3, 10, 13),
    ),
    (
        "hunyuanvideo15",
        {
            "tile_sample_min_height": 16,
            "tile_sample_min_width": 16,
            "tile_latent_min_height": 4,
            "tile_latent_min_width": 4,
            "tile_overlap_factor": 0.25,
        },
        (1, 4, 2, 7, 10),
    ),
    (
        "cogvideox",
        {
            "tile_sample_min_height": 16,
            "tile_sample_min_width": 16,
            "tile_sample_stride_height": 8,
            "tile_sample_stride_width": 8,
        },
        (1, 4, 3, 10, 12),
    ),
    (
        "hunyuanvideo",
        {
            "tile_sample_min_height": 16,
            "tile_sample_min_width": 16,
            "tile_sample_stride_height": 8,
            "tile_sample_stride_width": 8,
        },
        (1, 4, 3, 10, 12),
    ),
    (
        "mochi",
        {
            "tile_sample_min_height": 16,
            "tile_sample_min_width": 16,
            "tile_sample_stride_height": 8,
            "tile_sample_stride_width": 8,
        },
        (1, 4, 3, 10, 12),
    ),
    (  # linear attention: its score matrix all-reduced; the smallest maps (at most d pixels) gathered
        "dcae",
        DCAE_TILES,
        (1, 4, 7, 6),
    ),
    (  # a latent of 6 pixels: the latent-level attention takes the quadratic branch (keys, values gathered)
        "dcae",
        DCAE_TILES,
        (1, 4, 6, 1),
    ),
    # MiniMax-H3 with diffusers' tiling off (its spatial modes): every attention gathers keys and values;
    # `tile` keeps the builder's tile geometry (64 sample pixels, 16 overlapping)
    ("minimax_h3_untiled", {}, (1, 4, 5, 11, 9)),
]


def _model():
    spec = importlib.util.spec_from_file_location("benchmark_comm_model", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vae(name, tiles):
    vae = build(name)
    for key, value in tiles.items():
        setattr(vae, key, value)
    return vae


def _counted_rank(rank, world, name, tiles, shape):
    import vaeshard

    counted = {}
    for mode in ("spatial_shard_height", "tile"):
        vae = _vae(name, tiles)
        vaeshard.parallelize(vae, mode=mode, exact=True)
        assert vaeshard.plan(vae, shape, world, mode).strategy == mode
        with traffic.counting() as tally, torch.no_grad():
            vae.decode(latent(shape))
        counted[mode] = tally.bytes
    return counted


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("name", "tiles", "shape"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[2]))}" for c in CASES])
def test_model_predicts_the_counted_bytes(name, tiles, shape, world):
    counted = run_ranks(_counted_rank, world, name, tiles, shape, timeout=180)
    model = _model()
    with torch.device("meta"):
        vae = _vae(name, tiles)
    z = torch.empty(shape, device="meta")
    assert [c["spatial_shard_height"] for c in counted] == model.spatial_bytes(vae, z, world, 4)
    assert [c["tile"] for c in counted] == model.tile_bytes(vae, z, world, 4)
    assert all(c["tile"].get("tile_gather") for c in counted)  # several tiles: the gather ran


def test_counting_is_off_outside_the_context_and_nests():
    with traffic.counting() as outer:
        traffic.note("halo", torch.zeros(3, dtype=torch.float32))
        with traffic.counting() as inner:
            traffic.note("all_reduce", torch.zeros(2, dtype=torch.float64))
        traffic.note("halo", torch.zeros(1, dtype=torch.bfloat16))
    traffic.note("halo", torch.zeros(5))
    assert (outer.bytes, outer.messages) == ({"halo": 14}, {"halo": 2})
    assert (inner.bytes, inner.messages) == ({"all_reduce": 16}, {"all_reduce": 1})


# decoders without a tiled decode: spatial_shard_height only (LTX-2.5's diffusion decoder: its
# neighbourhood attentions' halo rows; 5 latent rows: 3 + 2 over 2 ranks, 2 + 2 + 1 over 3), and LTX's
# residual blocks with noise injection (noise drawn whole, no exchange of their own)
# (its timestep conditioning: a decode argument)
SPATIAL_ONLY = [("ltx2_diffusion_decoder", (1, 4, 2, 5, 4), None), ("ltx", (1, 4, 2, 6, 8), 0.05)]


def _inputs(temb, device=None):
    return () if temb is None else (torch.tensor([temb], device=device),)


def _counted_spatial_rank(rank, world, name, shape, temb):
    import vaeshard

    vae = vaeshard.parallelize(build(name), mode="spatial_shard_height", exact=True)
    assert vaeshard.plan(vae, shape, world).strategy == "spatial_shard_height"
    torch.manual_seed(11)  # decoder noise: the same global RNG state on every rank
    with traffic.counting() as tally, torch.no_grad():
        vae.decode(latent(shape), *_inputs(temb))
    return tally.bytes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("name", "shape", "temb"), SPATIAL_ONLY, ids=[c[0] for c in SPATIAL_ONLY])
def test_model_predicts_the_counted_bytes_of_spatial_decodes(name, shape, temb, world):
    counted = run_ranks(_counted_spatial_rank, world, name, shape, temb, timeout=180)
    with torch.device("meta"):
        vae = build(name)
    z = torch.empty(shape, device="meta")
    assert counted == _model().spatial_bytes(vae, z, world, 4, inputs=_inputs(temb, "meta"))
    assert all(c.get("halo") for c in counted)


def test_model_refuses_a_layer_it_does_not_model():
    # a whole-map layer without a rule: a guessed byte count would read as a prediction
    with pytest.raises(ValueError, match="does not model ShardedSomethingNew"):
        _model()._maps_gathered("ShardedSomethingNew")


def test_every_preset_is_predicted():
    """Each preset of the model (every family it models, at its common resolution, on meta) gets bytes,
    operations and a time on 1 and 2 ranks: one rank sends nothing, two send halo rows (MiniMax-H3's ViT
    decoder, which has no convolution: gathered keys and values)."""
    model = _model()
    for preset in model.PRESETS:
        one, two = model.predict(preset, [1, 2])["rows"]
        assert one["link_bytes"] == 0 and one["operations"] == 0, preset
        exchanged = two["payload_bytes"].get("all_gather" if preset.startswith("minimax") else "halo", 0)
        assert exchanged > 0 and two["operations"] > 0 and two["comm_s"] > 0, preset
