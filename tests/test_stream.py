"""`vaeshard.stream_decode` on 1, 2 and 3 gloo ranks: its chunks, concatenated, are the VAE's decode
bit for bit (and diffusers' own decode within the tier's tolerance) for every strategy and every
family with a frame loop; chunks arrive per decoder step, where `output` says; a stream closed early
releases the request on every rank and leaves the group usable."""

from __future__ import annotations

import pytest
import torch

from .dist_harness import run_ranks
from .models import build, cogvideox_small, latent, ltx_small
from .parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, assert_identical, reference_from_rank0

# family: (latent shape, decoder steps of its frame loop); 3 rows and columns spread over 3 ranks
SUBJECTS = {
    "wan21": ((1, 4, 3, 3, 3), 3),  # one latent frame per call on CPU: 1 + 2 steps
    "wan22": ((1, 4, 3, 3, 3), 3),
    "qwenimage": ((1, 4, 3, 3, 3), 3),
    "cogvideox": ((1, 4, 5, 3, 3), 2),  # diffusers' frame batches of 2 latent frames, the remainder first
}
ONE_TILE = {2: (1, 1), 3: (2, 2)}  # latent rows and columns that cover no ranks: `auto` decodes directly
# per world size: (mode, latent, output, exact); "small" is the subject's latent, "one" ONE_TILE's
CASES = {
    1: [("auto", "small", "all", False), ("tile", "small", "all", True)],
    2: [
        ("auto", "small", "all", False),
        ("spatial_shard_height", "small", "rank0", False),
        ("spatial_shard_width", "small", "all", True),
        ("auto", "one", "all", False),
        ("auto", "one", "rank0", True),
        ("tile", "small", "all", False),
    ],
    3: [
        ("spatial_shard_height", "small", "all", True),
        ("auto", "small", "rank0", False),
        ("auto", "one", "all", False),
        ("tile", "small", "rank0", False),
    ],
}


def _model(name: str):
    if name == "cogvideox":
        from vaeshard.families import family_for

        vae = cogvideox_small()
        tile = 2 * family_for(vae).spatial_ratio(vae)  # latent tiles of 2: `tile` tiles a 3 x 3 latent
        vae.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile)
        vae.use_tiling = False
        return vae
    # latent tiles of 2 every 1 (Wan 2.2 patchifies: 16 pixels per latent pixel): `tile` tiles a 3 x 3 latent
    return build(name, tile_sample=(32, 16) if name == "wan22" else (16, 8))


def _chunks_of(vae, z, **kwargs) -> list[torch.Tensor]:
    import vaeshard

    with vaeshard.stream_decode(vae, z, **kwargs) as chunks:
        return list(chunks)


def _diffusers(vae, z, tiled: bool) -> torch.Tensor:
    vae.use_tiling = tiled
    try:
        with torch.no_grad():
            return vae.decode(z).sample
    finally:
        vae.use_tiling = False


def _parity(rank, world, names):
    """For each family and case: the stream's chunks against the VAE's decode and diffusers'."""
    import vaeshard

    seen = []
    for name in names:
        shape, steps = SUBJECTS[name]
        vae = _model(name)
        latents = {"small": latent(shape), "one": latent((*shape[:3], *ONE_TILE.get(world, (1, 1))))}
        references = {
            (kind, tiled): reference_from_rank0(rank, lambda vae=vae, z=z, tiled=tiled: _diffusers(vae, z, tiled))
            for kind, z in latents.items()
            for tiled in (False, True)
        }
        for mode, kind, output, exact in CASES[world]:
            z = latents[kind]
            vaeshard.parallelize(vae, mode, output=output, exact=exact)
            strategy = vaeshard.plan(vae, z.shape).strategy
            whole = vae.decode(z).sample
            chunks = _chunks_of(vae, z)
            what = f"{name} {mode} {kind} ({strategy}) output={output} exact={exact} rank {rank}"
            receives = output == "all" or rank == 0
            assert all(c.numel() == 0 for c in chunks) != receives, what
            # a frame loop yields once per decoder step, on every rank alike; `tile` once
            assert len(chunks) == (1 if strategy == "tile" else steps), (what, len(chunks))
            if receives:
                got = torch.cat(chunks, dim=2)
                assert got.dtype == whole.dtype and got.device == whole.device, what
                assert torch.equal(got, whole), what
                reference = references[kind, strategy == "tile"]
                assert reference.std() > 0.01
                if strategy == "tile" or exact and strategy == "direct":
                    assert torch.equal(got, reference), what  # diffusers' own loop, bit for bit
                else:
                    diff = (got - reference).abs().max().item()
                    assert diff <= (CPU_FP32_GROUPNORM if name == "cogvideox" else CPU_FP32), (what, diff)
            seen.append(strategy)
        vaeshard.unparallelize(vae)
    return sorted(set(seen))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_stream_chunks_concatenate_to_the_decode(world):
    # one rank: the strategies' paths for one family; three: the families whose loops differ (Wan 2.2's
    # patchified frames and Qwen-Image's classes run Wan's loop, on two ranks)
    names = {1: ["wan21"], 2: list(SUBJECTS), 3: ["wan21", "cogvideox"]}[world]
    strategies = set(run_ranks(_parity, world, names, timeout=280)[0])
    expected = {"direct", "tile"} | (set() if world == 1 else {"spatial_shard_height", "spatial_shard_width"})
    assert strategies == expected, strategies


def _decode_is_the_stream(rank, world):
    """A direct, a tile and a spatial request of a tiny Wan: `decode` is the stream's chunks
    concatenated (one executor runs both), and diffusers' decode (its tiled one for `tile`)."""
    import vaeshard

    vae = _model("wan21")  # latent tiles of 2 every 1: `tile` tiles a 3 x 3 latent
    small = latent((1, 4, 2, 3, 3), seed=7)
    one = latent((1, 4, 2, 1, 1), seed=8)  # a row and a column: covers no ranks, is one tile
    references = reference_from_rank0(
        rank, lambda: [_diffusers(vae, one, False), _diffusers(vae, small, True), _diffusers(vae, small, False)]
    )
    seen = []
    for (mode, z), reference in zip((("auto", one), ("tile", small), ("spatial_shard_height", small)), references):
        vaeshard.parallelize(vae, mode)
        strategy = vaeshard.plan(vae, z.shape).strategy
        whole = vae.decode(z).sample
        chunks = _chunks_of(vae, z)
        assert len(chunks) == (1 if strategy == "tile" else 2), (strategy, len(chunks))  # a chunk per decoder step
        assert torch.equal(torch.cat(chunks, dim=2), whole), strategy
        if strategy == "tile":
            assert_identical(whole, reference, "tile: diffusers' tiled decode")
        else:
            assert_close(whole, reference, CPU_FP32, f"{strategy}: diffusers' decode")
        seen.append(strategy)
    vaeshard.unparallelize(vae)
    return seen


def test_decode_is_the_concatenated_stream_for_each_strategy():
    assert run_ranks(_decode_is_the_stream, 2) == [["direct", "tile", "spatial_shard_height"]] * 2


def _once(rank, world):
    """A family without a frame loop (LTX-Video, its decoder timestep passed on) and a sliced batch:
    the whole decode, once."""
    import vaeshard

    vae = ltx_small()
    z = latent((1, vae.config.latent_channels, 2, 4, 4), seed=3)
    temb = torch.tensor([0.05])
    vaeshard.parallelize(vae, "spatial_shard_height")
    torch.manual_seed(0)
    whole = vae.decode(z, temb).sample
    torch.manual_seed(0)
    chunks = _chunks_of(vae, z, temb=temb)
    assert len(chunks) == 1 and torch.equal(chunks[0], whole)
    wan = build("wan21")
    zz = latent((2, 4, 3, 6, 6))
    wan.enable_slicing()
    vaeshard.parallelize(wan, "spatial_shard_width")
    whole = wan.decode(zz).sample
    chunks = _chunks_of(wan, zz)
    assert len(chunks) == 1 and torch.equal(chunks[0], whole)


def test_stream_without_a_frame_loop_yields_once():
    run_ranks(_once, 2)


def _early_exit(rank, world):
    import vaeshard

    vae = build("wan21")
    z = latent((1, 4, 5, 3, 3))
    with torch.no_grad():
        reference = reference_from_rank0(rank, lambda: vae.decode(z).sample)
    outcomes = []
    for mode in ("spatial_shard_height", "auto"):
        vaeshard.parallelize(vae, mode)
        # every rank breaks out of a plain for loop after two chunks: the stream is dropped and closed
        for k, _ in enumerate(vaeshard.stream_decode(vae, z)):
            if k == 1:
                break
        assert all(entry is None for entry in vae._feat_map), "the feature cache outlived the stream"
        # every rank's consumer raises inside the `with`
        with pytest.raises(KeyError):
            with vaeshard.stream_decode(vae, z) as chunks:
                next(chunks)
                raise KeyError("consumer")
        # rank 1 alone closes after one chunk: rank 0 learns it at its next step
        stream = vaeshard.stream_decode(vae, z)
        first = next(stream)
        if rank == 1:
            stream.close()
        else:
            with pytest.raises(vaeshard.StreamClosed, match=r"rank\(s\) \[1\] closed the stream after 1 of 5"):
                for _ in stream:
                    pass
        assert first.shape[2] == 1
        assert all(entry is None for entry in vae._feat_map)
        # the VAE takes no other request while a stream of it is open, and the group stays usable
        stream = vaeshard.stream_decode(vae, z)
        next(stream)
        with pytest.raises(RuntimeError, match="still open on this rank"):
            vae.decode(z)
        stream.close()
        got = vae.decode(z).sample
        assert (got - reference).abs().max().item() <= CPU_FP32
        outcomes.append(torch.equal(torch.cat(_chunks_of(vae, z), 2), got))
    return outcomes


def test_stream_closed_early_releases_the_request_and_the_group_stays_usable():
    assert run_ranks(_early_exit, 2) == [[True, True]] * 2


def test_stream_refuses_a_plain_vae_and_return_dict():
    import vaeshard

    vae = build("wan21")
    z = latent((1, 4, 1, 2, 2))
    with pytest.raises(TypeError, match="vaeshard.parallelize"):
        vaeshard.stream_decode(vae, z)
    vaeshard.parallelize(vae)
    with pytest.raises(TypeError, match="return_dict"):
        vaeshard.stream_decode(vae, z, return_dict=False)
    with pytest.raises(ValueError, match="channels"):
        next(vaeshard.stream_decode(vae, latent((1, 3, 1, 2, 2))))
    assert torch.equal(torch.cat(list(vaeshard.stream_decode(vae, z)), 2), vae.decode(z).sample)
