"""The fast tier's causal convolutions reading their time padding where it lies (conv_kernel.Front):
where box_conv's kernel runs a causal 3x3x3 convolution, its input buffer holds only the new frames
and the kernel reads the two frames before each sample's first from the causal cache (zeros where
it has fewer), and an unsharded convolution whose input is already laid out for the kernel (the
head's) reads that input where it lies, no buffer at all. The decode (and the encode) is the same,
bit for bit, as with the cache copied in front of the frames, and within tolerance of diffusers'
own. On the CPU box_conv's kernel stands in as PyTorch computes its contract (tests/box_stand_in.py)."""

from __future__ import annotations

import pytest

from . import box_stand_in
from .dist_harness import run_ranks

MAX, MEAN = 5e-2, 2e-3  # the half-precision tolerance against diffusers' fp32 decode


def _check(first, buffers, second, same, err_max, err_mean, sharded):
    causal = [c for c in first if c[1]]
    # the time padding read where it lies: zero frames only (the first decoder call), and caches of
    # one frame (the second) and two (the later ones)
    assert {frames for _, _, frames, _ in causal} == {None, 1, 2}, causal
    # those convolutions' buffers hold only their new frames; the others (the time convolutions,
    # 3 x 1 x 1) the causal frames too
    read = [(new, frames) for _, _, new, frames, apart in buffers if apart is True]
    assert read and all(new == frames for new, frames in read), buffers
    assert all(frames == new + tpad for _, tpad, new, frames, apart in buffers if apart is False), buffers
    head = [c[1] for c in first if c[0] == 3]  # the head: 3 output channels (a call per decoder call or part)
    assert len(head) >= 3, first
    if sharded:
        # its cache is diffusers' own (no halo rows): copied into its buffer, which its norm wrote into
        # (HaloCausalConv3d.reserve: one per head call, none made after the norm)
        assert not any(head) and not [b for b in buffers if b[0] == 3 and b[4] != "reserved"], (head, buffers)
        assert len([b for b in buffers if b[0] == 3 and b[4] == "reserved"]) == len(head), (head, buffers)
    else:  # its input and its cache read where they lie: no buffer
        assert all(head) and not [b for b in buffers if b[0] == 3], (head, buffers)
    # declining the reads: every convolution's buffer holds its causal frames, the same output
    assert second and not any(c[1] for c in second)
    assert same, "the decode (or encode) reading the caches where they lie differs from the one copying them"
    assert err_max <= MAX and err_mean <= MEAN, (err_max, err_mean)


@pytest.mark.parametrize("samples, settings", [(1, {}), (2, {}), (1, {"frames_per_step": 2, "max_layer_frames": 2})])
def test_decode_reads_the_causal_caches_where_they_lie(samples, settings):
    _check(*box_stand_in.decode_both_ways(0, 1, "auto", samples, settings), sharded=False)


def test_sharded_decode_reads_the_causal_caches_where_they_lie():
    # by height on two ranks: the caches hold their frames' halo rows (taken after the exchange), the
    # kernel reads them so, and only the new frames' halo rows are exchanged
    for result in run_ranks(box_stand_in.decode_both_ways, 2, "spatial_shard_height", 1, None, fresh=True, timeout=240):
        _check(*result, sharded=True)
