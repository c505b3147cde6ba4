"""comm.py without a process group: waiting rules, layouts, uneven splits."""

from __future__ import annotations

import pytest
import torch

from vaeshard import comm
from vaeshard.shard import split_extents


class _Work:
    def __init__(self, result=True):
        self.calls, self.result = [], result

    def wait(self, timeout=None):
        self.calls.append(timeout)
        return self.result


def test_nccl_waits_never_pass_a_timeout():
    # a timed wait on an NCCL work blocks the host until the collective ends: the GPU queue drains
    c = comm.Comm(group=None, rank=0, world=2, timeout=5.0, device=torch.device("cpu"))
    work = _Work()
    c._wait(work, "halo exchange")
    assert work.calls == [None]


def test_gloo_waits_are_bounded_and_report_the_timeout():
    c = comm.Comm(group=None, rank=1, world=2, timeout=5.0, device=None)
    work = _Work(result=False)
    with pytest.raises(comm.CommTimeout, match="within 5 s"):
        c._wait(work, "halo exchange")
    assert [t.total_seconds() for t in work.calls] == [5.0]


def test_halo_rows_keep_the_channels_last_layout():
    x = torch.randn(1, 8, 2, 5, 6).contiguous(memory_format=torch.channels_last_3d)
    assert comm._memory_format(x) is torch.channels_last_3d
    assert comm._memory_format(x.contiguous()) is torch.contiguous_format
    c = comm.Comm(group=None, rank=0, world=1)
    padded = c.halo_pad(x, 3, 1, 1, num_ranks=1)  # one rank: both edges are global, zeros
    assert padded.shape == (1, 8, 2, 7, 6)
    assert padded.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(padded[:, :, :, 1:-1], x) and not padded[:, :, :, 0].any() and not padded[:, :, :, -1].any()


@pytest.mark.parametrize("extent,ranks,expected", [(90, 4, [23, 23, 22, 22]), (9, 4, [3, 2, 2, 2]), (8, 8, [1] * 8)])
def test_split_extents_is_contiguous_and_near_even(extent, ranks, expected):
    assert split_extents(extent, ranks) == expected
