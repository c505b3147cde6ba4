"""Requests over a live gloo group: bad input fails on every rank, long-lived workers, message counts."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from .dist_harness import run_ranks
from .models import build, latent


def _expect_error_everywhere(rank, world, case):
    import vaeshard

    vae = vaeshard.parallelize(build("wan21", (32, 24)), mode="auto")
    good = latent((1, 4, 2, 6, 8))
    if case == "4d":
        z, match = latent((1, 4, 6, 8)), "5-D"
    elif case == "channels":
        z, match = latent((1, 3, 2, 6, 8)), "4 channels"
    elif case == "one-rank-bad":  # only rank 1 passes a wrong latent: everyone must raise
        z, match = (latent((1, 4, 6, 8)) if rank == 1 else good), "rank"
    elif case == "shapes-differ":
        z, match = (latent((1, 4, 2, 6, 9)) if rank == 1 else good), "ranks disagree"
    elif case == "dtypes-differ":
        z, match = (good.double() if rank == 0 else good), "ranks disagree"
    elif case == "modes-differ":
        vaeshard.parallelize(vae, mode="tile" if rank == 0 else "auto")
        z, match = good, "ranks disagree"
    with pytest.raises(ValueError, match=match):
        vae.decode(z)
    # the group is still usable afterwards: nothing was left half-done
    vaeshard.parallelize(vae, mode="auto")
    assert vae.decode(good).sample.shape == (1, 3, 5, 48, 64)


@pytest.mark.parametrize("case", ["4d", "channels", "one-rank-bad", "shapes-differ", "dtypes-differ", "modes-differ"])
def test_bad_input_fails_on_every_rank(case):
    run_ranks(_expect_error_everywhere, 2, case, timeout=120)


def _not_in_group(rank, world):
    import torch.distributed as dist

    import vaeshard

    sub = dist.new_group([0, 1])
    vae = vaeshard.parallelize(build("wan21"), group=sub, mode="spatial_shard_width")
    z = latent((1, 4, 1, 4, 6))
    if rank == 2:
        with pytest.raises(ValueError, match="not a member"):
            vae.decode(z)
        return None
    with torch.no_grad():
        reference = vaeshard.unparallelize(build("wan21")).decode(z).sample
    out = vae.decode(z).sample
    assert (out - reference).abs().max() <= 1e-5
    return True


def test_rank_outside_group_is_refused_and_group_still_decodes():
    run_ranks(_not_in_group, 3, fresh=True)


def _long_lived(rank, world):
    import gc

    import vaeshard
    from vaeshard.runtime import spatial

    vae = build("wan21", (32, 24))
    keys, count = list(vae.state_dict()), sum(p.numel() for p in vae.parameters())
    plain = build("wan21", (32, 24))
    requests = [
        ("tile", (1, 4, 2, 10, 9)),
        ("spatial_shard_width", (1, 4, 2, 6, 11)),  # landscape
        ("spatial_shard_height", (1, 4, 3, 11, 5)),  # portrait
        ("tile", (1, 4, 2, 10, 9)),
        ("auto", (1, 4, 1, 3, 2)),  # small
        ("auto", (1, 4, 2, 12, 7)),
    ]
    tile_outputs = []
    for mode, shape in requests:
        z = latent(shape, seed=7)
        vaeshard.parallelize(vae, mode=mode)
        out = vae.decode(z).sample
        with torch.no_grad():
            if vaeshard.plan(vae, shape, world, mode).strategy == "tile":
                reference = plain.tiled_decode(z).sample
                assert torch.equal(out, reference)
                tile_outputs.append(out)
            else:
                reference = plain.decode(z).sample
                assert (out - reference).abs().max() <= 1e-5
    assert torch.equal(tile_outputs[0], tile_outputs[1])  # tile result unchanged after spatial requests
    assert list(vae.state_dict()) == keys and sum(p.numel() for p in vae.parameters()) == count

    # an exception in the middle of a sharded decode: every rank raises, nothing stays alive
    target = vae.decoder.up_blocks[1].resnets[0].conv1
    calls = {"n": 0}

    def fail_on_third_frame(module, args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure")

    handle = target.register_forward_pre_hook(fail_on_third_frame)
    vaeshard.parallelize(vae, mode="spatial_shard_height", timeout=5)
    with pytest.raises(Exception) as err:  # rank 0 raises the injected error, rank 1 a timeout
        vae.decode(latent((1, 4, 4, 8, 6)))
    handle.remove()
    assert spatial.current() is None
    assert all(c is None for c in vae._feat_map)  # the model's feature caches were released
    gc.collect()
    return type(err.value).__name__


def test_long_lived_group_alternates_modes_and_survives_failure():
    names = run_ranks(_long_lived, 2, timeout=200, fresh=True)
    assert names[0] == "RuntimeError"


def _count_messages(rank, world):
    import torch.distributed as dist

    import vaeshard
    from vaeshard.runtime import spatial

    vae = vaeshard.parallelize(build("wan21"), mode="spatial_shard_height")
    conv = vae.decoder.conv_in
    x = torch.randn(1, conv.in_channels, 1, 2, 5)
    counted = {"send": 0, "recv": 0, "batches": 0}
    real = dist.batch_isend_irecv

    def counting(ops):
        counted["batches"] += 1
        for op in ops:
            counted["send" if op.op is dist.isend else "recv"] += 1
        return real(ops)

    dist.batch_isend_irecv = counting
    try:
        comm = vaeshard.runtime.comm.Comm.for_group(dist.group.WORLD)
        with spatial.sharding(spatial.ShardContext(comm=comm, axis=spatial.HEIGHT, extents=[2] * world)):
            with torch.no_grad():
                conv(x)
    finally:
        dist.batch_isend_irecv = real
    return counted


@pytest.mark.parametrize("world", [3, 8])
def test_interior_rank_sends_two_and_receives_two_per_conv(world):
    counts = run_ranks(_count_messages, world)
    edge, interior = {"send": 1, "recv": 1, "batches": 1}, {"send": 2, "recv": 2, "batches": 1}
    assert counts[0] == edge and counts[-1] == edge
    assert all(c == interior for c in counts[1:-1])


def _layerwise_cast(vae):
    """diffusers' layerwise casting: weights stored in float8, cast up by a hook before each layer runs."""
    vae.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    return vae


@contextlib.contextmanager
def _warnings_logged():
    """The messages of the warnings vaeshard logs inside the block."""
    logger, warnings = logging.getLogger("vaeshard"), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger.addHandler(handler)
    try:
        yield warnings
    finally:
        logger.removeHandler(handler)


def _hooked_decodes(rank, world):
    """Layers whose forward a hook replaced (diffusers' layerwise casting: weights stored in float8,
    cast up by the hook before each layer runs): the sharded layers and the fast tier's blocks would
    bypass the hook, so vaeshard decodes such a VAE with diffusers' own layers and never shards it.
    Returns (strategy, fallback, equal to diffusers' tiled decode for `tile`, else to its decode with
    tiling off, the VAE's own setting, warnings logged) per mode."""
    import vaeshard

    vae, plain = _layerwise_cast(build("wan21", (32, 24))), _layerwise_cast(build("wan21", (32, 24)))
    z = latent((1, 4, 2, 6, 8))  # six tiles of the small tile size
    with torch.no_grad():
        tiled, untiled = plain.tiled_decode(z).sample, plain.decode(z).sample
    results = []
    with _warnings_logged() as warnings:
        for mode, exact in (
            ("spatial_shard_height", False),
            ("auto", False),
            ("auto", False),
            ("spatial_shard_height", True),
        ):
            vaeshard.parallelize(vae, mode=mode, exact=exact)
            warnings.clear()
            chosen = vaeshard.plan(vae, z.shape, world, mode)
            out = vae.decode(z).sample
            assert "replaced by a hook" in chosen.reason, chosen.reason
            want = tiled if chosen.strategy == "tile" else untiled
            results.append((chosen.strategy, chosen.fallback, torch.equal(out, want), list(warnings)))
    return results


def test_hooked_layers_are_never_sharded():
    # before: the fast tier raised from a float8 weight, and the exact tier's sharded decode ran
    # diffusers' layers through the hooks without the halo exchanges, silently (1.26 off diffusers'
    # decode at the shards' edges)
    for results in run_ranks(_hooked_decodes, 2, timeout=120, fresh=True):
        (forced, fell_back, forced_equal, forced_warnings), (auto, auto_fallback, auto_equal, _), third, exact = results
        assert (forced, fell_back, forced_equal) == ("tile", True, True), results[0]
        assert any("cannot run" in w and "hook" in w for w in forced_warnings), forced_warnings
        # auto keeps the VAE's own untiled decode: one rank runs it (tiles would change it)
        assert (auto, auto_fallback, auto_equal) == ("direct", False, True), results[1]
        assert third[3] == [], third  # (the exact tier's note is given once per VAE; auto falls back quietly)
        assert exact[:3] == ("tile", True, True), exact


def test_hooked_layers_decode_with_diffusers_layers_on_one_rank():
    """One process: the request runs directly, in the exact tier, so the result is diffusers' decode
    bit for bit (the fast tier would call the layers' computations without their casting hook), and
    a warning says so once."""
    import vaeshard

    vae, plain = _layerwise_cast(build("wan21")), _layerwise_cast(build("wan21"))
    z = latent((1, 4, 3, 4, 8))
    with torch.no_grad():
        ref = plain.decode(z).sample
    vaeshard.parallelize(vae)
    with _warnings_logged() as warnings:
        first, second = vae.decode(z).sample, vae.decode(z).sample
    assert torch.equal(first, ref) and torch.equal(second, ref)  # (before: a RuntimeError from a float8 weight)
    assert len(warnings) == 1 and "exact tier" in warnings[0] and "replaced by a hook" in warnings[0], warnings


def _hooks_differ(rank, world):
    import vaeshard

    vae = vaeshard.parallelize(build("wan21", (32, 24)), mode="auto")
    good = latent((1, 4, 2, 6, 8))
    if rank == 1:  # a wrapper of one's own around one layer, on one rank only
        conv = vae.decoder.conv_out
        conv.forward = conv.forward
    with pytest.raises(ValueError, match="layers hooked"):
        vae.decode(good)
    if rank == 1:
        del vae.decoder.conv_out.forward
    assert vae.decode(good).sample.shape == (1, 3, 5, 48, 64)  # the group is still usable


def test_ranks_hooked_differently_fail_on_every_rank():
    run_ranks(_hooks_differ, 2, timeout=120)


def test_each_request_sees_the_vae_as_it_is_now():
    """The modules a request walks are cached per VAE; a cast, a hook, a replaced layer or a deleted
    one after a request must still be seen by the next (runtime.swap.inventory)."""
    import vaeshard

    vae = vaeshard.parallelize(build("wan21"))
    z = latent((1, 4, 3, 4, 8))
    with torch.no_grad():
        first = vae.decode(z).sample
    vae.double()  # a cast in place: the same parameter objects, another dtype
    with pytest.raises(ValueError, match="parameters are float64"):
        vaeshard.check(vae, z)
    vae.float()
    conv = vae.decoder.conv_out
    conv.forward = conv.forward  # a hook added after a request
    assert "replaced by a hook" in vaeshard.plan(vae, z.shape).reason
    del conv.forward
    assert "replaced by a hook" not in vaeshard.plan(vae, z.shape).reason
    with pytest.raises(ValueError, match="parameters are float32"):
        vaeshard.check(vae, z.half())
    old = vae.decoder.conv_in
    vae.decoder.conv_in = torch.nn.Conv2d(1, 1, 1).half()  # a layer replaced: half is one of its dtypes now
    vaeshard.check(vae, z.half())
    vae.decoder.conv_in = old
    with torch.no_grad():
        again = vae.decode(z).sample
    assert torch.equal(again, first)
    with pytest.raises(ValueError, match="parameters are float32"):
        vaeshard.check(vae, z.half())
    blocks = vae.decoder.up_blocks[0]
    blocks.add_module("spare", torch.nn.Linear(1, 1).half())  # a module added to a container
    vaeshard.check(vae, z.half())
    del blocks.spare  # and deleted (no registration hook: the count of children tells)
    with pytest.raises(ValueError, match="parameters are float32"):
        vaeshard.check(vae, z.half())


def test_a_vae_walked_by_requests_can_still_be_freed():
    import gc
    import weakref

    from vaeshard.runtime.swap import inventory

    vae = build("wan21")
    inventory(vae)
    gone = weakref.ref(vae)
    del vae
    gc.collect()
    assert gone() is None
