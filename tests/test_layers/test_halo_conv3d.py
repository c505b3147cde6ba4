"""HaloConv3d (halo rows in place of a Conv3d's own spatial padding, in its padding mode) and the
whole-map noise slice, against the torch op / the single-process draw on the whole tensor."""

from __future__ import annotations

import torch

from ..dist_harness import run_ranks
from ..parity import CPU_FP32


def _sharded(rank, world):
    from vaeshard.layers.halo import HaloPaddedConv as HaloConv3d
    from vaeshard.layers.ltx_resnet import whole_map_noise
    from vaeshard.runtime import spatial, swap
    from vaeshard.runtime.comm import Comm

    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 3, 3, 8, 6, generator=g)
    checked = 0
    for dim, axis in ((3, spatial.HEIGHT), (4, spatial.WIDTH)):
        # 8 rows over 4 ranks: 2 each (strided too); 6 columns: 2, 2, 1, 1 (a one-column shard at the edge)
        extents = spatial.split_extents(x.shape[dim], world)
        start = sum(extents[:rank])
        local = x.narrow(dim, start, extents[rank])
        ctx = spatial.ShardContext(comm=Comm.for_group(torch.distributed.group.WORLD), axis=axis, extents=extents)
        for mode in ("zeros", "reflect", "replicate"):
            for stride in (1, 2):
                if stride == 2 and (mode != "zeros" or any(e % 2 for e in extents)):
                    continue  # strided: only on the even shards of a downsampling level
                conv = torch.nn.Conv3d(3, 4, 3, stride=(1, stride, stride), padding=(0, 1, 1), padding_mode=mode)
                whole = conv(x)
                swap.swap(conv, HaloConv3d)
                with torch.no_grad(), spatial.sharding(ctx):
                    out = conv(local)
                want = whole.narrow(dim, start // stride, out.shape[dim])
                assert out.shape == want.shape and (out - want).abs().max().item() <= CPU_FP32, (mode, axis)
                checked += 1
        feats = torch.empty(1, 4, 2, 8, 6)
        torch.manual_seed(3)
        expected = torch.randn(8, 6)[None]
        after = torch.rand(2)
        torch.manual_seed(3)
        with spatial.sharding(ctx):
            got = whole_map_noise(ctx, feats.narrow(dim, start, extents[rank]))
        assert torch.equal(got, expected.narrow(dim - 2, start, extents[rank]))
        assert torch.equal(torch.rand(2), after)  # the RNG advanced as by the whole draw
    return checked


def test_halo_conv3d_and_noise_slice_match_the_whole_tensor():
    # reflect at a one-column edge shard reads the neighbour's columns
    assert run_ranks(_sharded, 4) == [7] * 4
    assert run_ranks(_sharded, 2) == [7] * 2
