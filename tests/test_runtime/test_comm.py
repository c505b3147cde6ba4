"""comm.py without a process group: waiting rules, layouts, uneven splits."""

from __future__ import annotations

import time

import pytest
import torch

from vaeshard.runtime import comm, layout
from vaeshard.runtime.spatial import split_extents


class _Work:
    def __init__(self, result=True):
        self.calls, self.result = [], result

    def wait(self, timeout=None):
        self.calls.append(timeout)
        return self.result


class _PendingCollective:
    """A gloo collective that never completes: a timed wait raises as gloo's does, and it stays pending."""

    def __init__(self):
        self.calls = []

    def wait(self, timeout=None):
        self.calls.append(timeout.total_seconds())
        time.sleep(timeout.total_seconds())
        raise RuntimeError("Operation timed out!")

    def is_completed(self):
        return False


def test_nccl_waits_never_pass_a_timeout():
    # a timed wait on an NCCL work blocks the host until the collective ends: the GPU queue drains
    c = comm.Comm(group=None, rank=0, world=2, timeout=5.0, device=torch.device("cpu"))
    work = _Work()
    c._wait(work, "halo exchange")
    assert work.calls == [None]


def test_gloo_waits_are_bounded_and_report_the_timeout():
    # waited on in slices of ABORT_POLL_S (between them the group's abort key is checked), to the bound
    c = comm.Comm(group=None, rank=1, world=2, timeout=1.2, device=None)
    work = _PendingCollective()
    started = time.monotonic()
    with pytest.raises(comm.CommTimeout, match="within 1.2 s"):
        c._wait(work, "halo exchange")
    # slices of at most ABORT_POLL_S, the last cut to the bound, and the wait lasted the bound (a loaded
    # machine oversleeps a slice, which shortens the last one: no upper bound on time is asserted)
    assert work.calls[0] == comm.ABORT_POLL_S and all(0 < t <= comm.ABORT_POLL_S for t in work.calls)
    assert 2 <= len(work.calls) <= 3 and time.monotonic() - started >= 1.2 - 0.01


def test_a_gloo_wait_that_ends_in_time_takes_one_call():
    c = comm.Comm(group=None, rank=1, world=2, timeout=5.0, device=None)
    work = _Work(result=None)
    c._wait(work, "halo exchange")
    assert [t.total_seconds() for t in work.calls] == [comm.ABORT_POLL_S]


def test_halo_rows_keep_the_channels_last_layout():
    x = torch.randn(1, 8, 2, 5, 6).contiguous(memory_format=torch.channels_last_3d)
    assert layout.memory_format(x) is torch.channels_last_3d
    assert layout.memory_format(x.contiguous()) is torch.contiguous_format
    c = comm.Comm(group=None, rank=0, world=1)
    padded = c.halo_pad(x, 3, 1, 1, num_ranks=1)  # one rank: both edges are global, zeros
    assert padded.shape == (1, 8, 2, 7, 6)
    assert padded.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(padded[:, :, :, 1:-1], x) and not padded[:, :, :, 0].any() and not padded[:, :, :, -1].any()


@pytest.mark.parametrize("extent,ranks,expected", [(90, 4, [23, 23, 22, 22]), (9, 4, [3, 2, 2, 2]), (8, 8, [1] * 8)])
def test_split_extents_is_contiguous_and_near_even(extent, ranks, expected):
    assert split_extents(extent, ranks) == expected


def _halo_with_prefix(rank, world, dim, layout_name):
    """A buffer built in place (cached frames + shard), halo rows filled, equals cat-then-pad, bit for
    bit, on every rank: what a causal convolution's input buffer relies on."""
    import torch.distributed as dist

    layout = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last_3d}[layout_name]
    c = comm.Comm.for_group(dist.group.WORLD)
    extents = split_extents(7, world)  # uneven: 3, 2, 2 over 3 ranks
    g = torch.Generator().manual_seed(3)
    whole = torch.randn(1, 4, 3, 7, 5, generator=g) if dim == 3 else torch.randn(1, 4, 3, 5, 7, generator=g)
    cache = torch.randn(*whole.shape[:2], 2, *whole.shape[3:], generator=g)
    start = sum(extents[:rank])
    x = whole.narrow(dim, start, extents[rank]).contiguous(memory_format=layout)
    prefix = cache.narrow(dim, start, extents[rank]).contiguous(memory_format=layout)
    shape = list(x.shape)
    shape[2] += 2
    shape[dim] += 2
    buf = torch.empty(shape, memory_format=torch.channels_last_3d)
    core = buf.narrow(dim, 1, x.shape[dim])
    core[:, :, :2].copy_(prefix)
    core[:, :, 2:].copy_(x)
    got = c.fill_halo(buf, dim, 1, 1, world)
    assert got is buf
    want = c.halo_pad(torch.cat([prefix, x], dim=2), dim, 1, 1, world)  # the two-copy way
    full = torch.nn.functional.pad(torch.cat([cache, whole], dim=2), (1, 1, 0, 0) if dim == 4 else (0, 0, 1, 1))
    expected = full.narrow(dim, start, extents[rank] + 2)  # the unsharded zero-padded rows this rank needs
    assert got.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(got, want) and torch.equal(got, expected)
    assert c.halo_pad(x, dim, 0, 0, world) is x  # nothing to exchange
    return got.shape[dim]


@pytest.mark.parametrize("dim", [3, 4], ids=["height", "width"])
@pytest.mark.parametrize("layout_name", ["contiguous", "channels_last"])
def test_halo_filled_into_a_buffer_with_cached_frames_equals_cat_then_pad(dim, layout_name):
    from ..dist_harness import run_ranks

    assert run_ranks(_halo_with_prefix, 3, dim, layout_name) == [5, 4, 4]


def _uneven_halo(rank, world, before, after, num_ranks, dtype_name):
    """Rows before and after in any counts (a downsampler pads 0 before, 1 after), over all ranks of
    the group or the first few: every shard rank gets exactly the neighbours' rows, zeros at the edges."""
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    c = comm.Comm.for_group(dist.group.WORLD)
    whole = torch.randn(1, 3, 2, 4 * num_ranks, 5, generator=torch.Generator().manual_seed(5)).to(dtype)
    if rank >= num_ranks:
        return None  # not a shard rank: takes no part
    x = whole.narrow(3, 4 * rank, 4)
    got = c.halo_pad(x, 3, before, after, num_ranks)
    expected = torch.nn.functional.pad(whole, (0, 0, before, after)).narrow(3, 4 * rank, 4 + before + after)
    assert torch.equal(got, expected)
    return got.shape[3]


@pytest.mark.parametrize(
    "before,after,num_ranks,dtype_name", [(0, 1, 3, "float32"), (2, 1, 3, "bfloat16"), (1, 1, 2, "float32")]
)
def test_halo_rows_in_any_counts_come_from_the_neighbours(before, after, num_ranks, dtype_name):
    from ..dist_harness import run_ranks

    expected = [4 + before + after] * num_ranks + [None] * (3 - num_ranks)
    assert run_ranks(_uneven_halo, 3, before, after, num_ranks, dtype_name) == expected


def _assemble(rank, world, dim, to_all, extents):
    import torch.distributed as dist

    c = comm.Comm.for_group(dist.group.WORLD)
    whole = torch.randn(2, 3, 4, 6, 7, generator=torch.Generator().manual_seed(11)).narrow(dim, 0, sum(extents))
    start = sum(extents[:rank])
    mine = whole.narrow(dim, start, extents[rank]).clone()
    got = c.assemble_along(mine, dim, extents, to_all)
    if to_all or rank == 0:
        assert got.shape == whole.shape and torch.equal(got, whole) and got.is_contiguous()
        return "whole"
    assert got is None
    return None


@pytest.mark.parametrize("to_all", [True, False], ids=["to-all", "to-rank0"])
@pytest.mark.parametrize("dim,extents", [(3, [3, 2, 1]), (4, [2, 0, 3])], ids=["height-uneven", "width-empty-rank"])
def test_assemble_along_builds_the_whole_tensor_in_place(to_all, dim, extents):
    from ..dist_harness import run_ranks

    expected = ["whole"] * 3 if to_all else ["whole", None, None]
    assert run_ranks(_assemble, 3, dim, to_all, extents) == expected


def test_halo_rows_travel_in_the_buffers_order_of_dimensions():
    # channels-last buffers (the fast tier's) send their rows with the channels innermost, so packing
    # them is a plain copy; other buffers as they are; the receiver's view back is the same layout
    cl5 = torch.empty(1, 8, 3, 6, 5, memory_format=torch.channels_last_3d)
    cl4 = torch.empty(2, 8, 6, 5, memory_format=torch.channels_last)
    assert layout.exchange_order(cl5) == (0, 2, 3, 4, 1)
    assert layout.exchange_order(cl5[:, :, 1:]) == (0, 2, 3, 4, 1)  # a view of the buffer's later frames
    assert layout.exchange_order(cl4) == (0, 2, 3, 1)
    assert layout.exchange_order(torch.empty(1, 8, 3, 6, 5)) == (0, 1, 2, 3, 4)
    assert layout.exchange_order(torch.empty(1, 1, 3, 6, 5, memory_format=torch.channels_last_3d)) == (0, 1, 2, 3, 4)
    rows = torch.randn(1, 8, 3, 6, 5).contiguous(memory_format=torch.channels_last_3d).narrow(3, 4, 2)
    order = layout.exchange_order(rows)
    wire = rows.permute(order).contiguous()
    assert wire.is_contiguous() and list(wire.shape) == layout.permuted(rows.shape, order)
    back = wire.permute(layout.inverse(order))
    assert torch.equal(back, rows) and back.is_contiguous(memory_format=torch.channels_last_3d)
