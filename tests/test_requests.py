"""Requests over a live gloo group: bad input fails on every rank, long-lived workers, message counts."""

from __future__ import annotations

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
    from vaeshard import shard

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
    assert shard.current() is None
    assert all(c is None for c in vae._feat_map)  # the model's feature caches were released
    gc.collect()
    return type(err.value).__name__


def test_long_lived_group_alternates_modes_and_survives_failure():
    names = run_ranks(_long_lived, 2, timeout=200, fresh=True)
    assert names[0] == "RuntimeError"


def _count_messages(rank, world):
    import torch.distributed as dist

    import vaeshard
    from vaeshard import shard

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
        comm = vaeshard.comm.Comm.for_group(dist.group.WORLD)
        with shard.sharding(shard.ShardContext(comm=comm, axis=shard.HEIGHT, extents=[2] * world)):
            with torch.no_grad():
                conv(x)
    finally:
        dist.batch_isend_irecv = real
    return counted


@pytest.mark.parametrize("world", [3, 8])
def test_interior_rank_sends_two_and_receives_two_per_conv(world):
    counts = run_ranks(_count_messages, world, fresh=world > 4)
    edge, interior = {"send": 1, "recv": 1, "batches": 1}, {"send": 2, "recv": 2, "batches": 1}
    assert counts[0] == edge and counts[-1] == edge
    assert all(c == interior for c in counts[1:-1])
