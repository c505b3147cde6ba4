"""The fast tier's causal convolutions reading their time padding where it lies (conv_kernel.Front):
where box_conv's kernel runs a causal 3x3x3 convolution, its input buffer holds only the new frames
and the kernel reads the two frames before each sample's first from the causal cache (zeros where
it has fewer); the head's norm writes into its convolution's buffer, and with `max_layer_frames`
the head's parts of the norm's output are read where they lie, no buffer at all (unsharded). The
decode (and the encode) is the same,
bit for bit, as with the cache copied in front of the frames, and within tolerance of diffusers'
own. On the CPU box_conv's kernel stands in as PyTorch computes its contract (tests/box_stand_in.py)."""

from __future__ import annotations

import pytest
import torch

from .. import box_stand_in
from ..dist_harness import run_ranks
from ..models import build
from ..parity import HALF_MAX as MAX
from ..parity import HALF_MEAN as MEAN


def _check(first, buffers, second, same, err_max, err_mean, sharded, parts=False):
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
    # the head's norm writes into its convolution's buffer (wan_blocks.FastCoderHead), which holds only the
    # new frames: the cache is read where it lies (sharded: taken from the buffer with its halo rows)
    heads = [b for b in buffers if b[0] == 3]
    if not parts:
        assert all(head) and len(heads) == len(head) and all(b[4] is True for b in heads), (head, heads)
    elif not sharded:
        # in parts (max_layer_frames), a call of more frames: the parts of the norm's output read
        # where they lie, no buffer; a call of one frame through the buffer
        assert all(head) and heads and len(heads) < len(head) and all(b[4] is True for b in heads), (head, heads)
    else:
        # sharded in parts: two new frames at a time in buffers of their own, the first behind the
        # cache read where it lies, the next behind a copy of the part before
        assert all(b[2] <= 2 for b in heads) and any(b[4] is False for b in heads), heads
        assert any(b[4] is True for b in heads), heads
    # declining the reads: every convolution's buffer holds its causal frames, the same output
    assert second and not any(c[1] for c in second)
    assert same, "the decode (or encode) reading the caches where they lie differs from the one copying them"
    assert err_max <= MAX and err_mean <= MEAN, (err_max, err_mean)


@pytest.mark.parametrize("samples, settings", [(1, {}), (2, {}), (1, {"frames_per_step": 2, "max_layer_frames": 2})])
def test_decode_reads_the_causal_caches_where_they_lie(samples, settings):
    _check(
        *box_stand_in.decode_both_ways(0, 1, "auto", samples, settings),
        sharded=False,
        parts="max_layer_frames" in settings,
    )


@pytest.mark.parametrize("settings", [None, {"max_layer_frames": 2}])
def test_sharded_decode_reads_the_causal_caches_where_they_lie(settings):
    # by height on two ranks: the caches hold their frames' halo rows (taken after the exchange), the
    # kernel reads them so, and only the new frames' halo rows are exchanged; in parts of two frames
    # each part's buffer, halo rows included, becomes the next cache
    for result in run_ranks(
        box_stand_in.decode_both_ways, 2, "spatial_shard_height", 1, settings, fresh=True, timeout=240
    ):
        _check(*result, sharded=True, parts=settings is not None)


def test_default_parts_keep_their_two_frame_buffers_as_the_caches(monkeypatch):
    """Above tuning.PARTS_FROM_PIXELS, a residual block whose causal convolutions box_conv's kernel runs
    takes parts of two frames by default, and each part's buffer (two new frames, read with the
    cache where it lies) becomes its convolution's next cache instead of being copied into the old
    one. Below the threshold the blocks take all their frames. The decode is bit for bit the one
    that copies the buffers into the caches and the one without parts, and within tolerance of
    diffusers' fp32 decode. (On the GPU: BENCHMARKS.md, the parts.)"""
    import vaeshard
    from vaeshard import tuning
    from vaeshard.layers import buffers as layer_buffers
    from vaeshard.layers import convs

    from ..models import build, latent

    box_stand_in.install(monkeypatch.setattr, [])
    stores, buffers = [], []
    store = layer_buffers.store_cache

    def spy_store(feat_cache, idx, old, frames, owned=False):
        store(feat_cache, idx, old, frames, owned)
        stores.append((owned, frames.shape[2], frames.shape[-2] * frames.shape[-1], feat_cache[idx] is frames))

    monkeypatch.setattr(layer_buffers, "store_cache", spy_store)
    input_buffer = convs.HaloCausalConv3d.input_buffer

    def spy_buffer(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
        if self.out_channels != 3:  # (the residual blocks' and upsamplers' convolutions; not the head's)
            buffers.append((new.shape[2], new.shape[-2] * new.shape[-1], front is not None))
        return buf, new, ready, front

    monkeypatch.setattr(convs.HaloCausalConv3d, "input_buffer", spy_buffer)
    vae = build("wan21")
    z = latent((1, 4, 3, 4, 8))  # output frames of 32 x 64 = 2048 pixels; the level below 512
    with torch.no_grad():
        ref = vae.decode(z).sample
    vae.to(torch.float16)
    vaeshard.parallelize(vae)
    zh = z.to(torch.float16)

    def decode():
        stores.clear()
        buffers.clear()
        return vae.decode(zh).sample

    monkeypatch.setattr(tuning, "PARTS_FROM_PIXELS", 2048)
    parts = decode()
    kept = [s for s in stores if s[3]]
    assert kept and all(owned and frames == 2 for owned, frames, _, _ in kept), stores
    assert {pixels for _, _, pixels, _ in kept} >= {2048}, kept
    read = [(new, pixels) for new, pixels, reads in buffers if reads]
    assert max(new for new, pixels in read if pixels == 2048) == 2, read  # parts at the threshold
    assert max(new for new, pixels in read if pixels == 512) == 4, read  # below it whole
    monkeypatch.setattr(
        layer_buffers, "_whole_storage", lambda t: False
    )  # declined: the buffers copied into the caches
    copied = decode()
    assert not any(s[3] for s in stores), stores
    monkeypatch.setattr(tuning, "PART_FRAMES", None)  # no parts by default
    whole = decode()
    assert max(new for new, pixels, reads in buffers if reads and pixels == 2048) == 4, buffers
    vaeshard.unparallelize(vae)
    assert torch.equal(parts, copied), "the buffers kept as caches changed the decode"
    assert torch.equal(parts, whole), "the parts changed the decode"
    err = (parts.float() - ref).abs()
    assert err.max() <= MAX and err.mean() <= MEAN, (err.max(), err.mean())


def test_sharded_default_parts_start_at_frames_of_their_own_threshold():
    # sharded, the parts' extra launches cost a rank's host, which paces it where its GPU work per
    # frame is small (docs/tuning.md: Wan 2.1 720p on 3 ranks): from SHARDED_PARTS_FROM_PIXELS there
    import vaeshard
    from vaeshard import policy, tuning

    assert tuning.SHARDED_PARTS_FROM_PIXELS > tuning.PARTS_FROM_PIXELS
    vae = build("wan21")

    def plan(sharded):
        strategy = "spatial_shard_height" if sharded else "direct"
        return policy.resolve_fast(vae, (1, 4, 3, 8, 8), 2 if sharded else 1, strategy, vaeshard.FastOptions())

    cases = [
        (False, tuning.PARTS_FROM_PIXELS, tuning.PART_FRAMES),
        (True, tuning.PARTS_FROM_PIXELS, None),
        (True, tuning.SHARDED_PARTS_FROM_PIXELS - 1, None),
        (True, tuning.SHARDED_PARTS_FROM_PIXELS, tuning.PART_FRAMES),
        (False, tuning.PARTS_FROM_PIXELS - 1, None),
    ]
    for sharded, pixels, want in cases:
        assert plan(sharded).layer_frames(pixels) == want, (sharded, pixels)
    assert plan(False).layer_frames(tuning.PARTS_FROM_PIXELS, lambda: False) is None  # a layer parts do not suit
    options = vaeshard.FastOptions(max_layer_frames=3)  # the request's own bound, whatever the frame
    assert policy.resolve_fast(vae, (1, 4, 3, 8, 8), 1, "direct", options).layer_frames(1) == 3


def _sharded_parts(rank, world, mode, shape=(1, 4, 3, 4, 9), threshold=1):
    """One rank of a sharded fp16 decode with box_conv's stand-in and every frame size above the
    default parts' threshold, then without the default parts (tuning.PART_FRAMES None), then diffusers'
    fp32 decode: (per decode with parts and without: the most new frames a residual block's buffer
    read with its cache where it lies held at the largest frames, the most frames an upsampler's
    convolution took at a time into them, the halo exchanges made), whether the two decodes are
    equal bit for bit, and the max and mean difference to diffusers'."""
    from unittest import mock

    import vaeshard
    from vaeshard import tuning
    from vaeshard.layers import convs, tier
    from vaeshard.runtime import graphs
    from vaeshard.runtime.comm import Comm

    from ..models import build, latent

    held, upsampled, exchanges, graphed = [], [], [], []
    input_buffer, neighbour_rows = convs.HaloCausalConv3d.input_buffer, Comm.neighbour_rows
    by_phases = convs.HaloConv2d.forward_by_phases

    def spy(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
        if front is not None:
            held.append((new.shape[-2] * new.shape[-1], new.shape[2]))
        return buf, new, ready, front

    def spy_phases(self, src, sub, limit=None, addend=None):
        frames = src.shape[0] * sub if limit is None else min(src.shape[0], max(1, limit // sub)) * sub
        upsampled.append((src.shape[-2] * src.shape[-1], frames))
        return by_phases(self, src, sub, limit, addend)

    steps = graphs.DecoderSteps

    def spy_steps(*args, **kwargs):  # the frame the request's plan decided its graphs by
        graphed.append(tier.current().frame_pixels)
        return steps(*args, **kwargs)

    def spy_exchange(self, *args):
        exchanges.append(1)
        return neighbour_rows(self, *args)

    z = latent(shape)
    results = []
    with (
        box_stand_in.installed([]),
        mock.patch.object(tuning, "PARTS_FROM_PIXELS", threshold),
        mock.patch.object(tuning, "SHARDED_PARTS_FROM_PIXELS", threshold),
        mock.patch.object(convs.HaloCausalConv3d, "input_buffer", spy),
        mock.patch.object(convs.HaloConv2d, "forward_by_phases", spy_phases),
        mock.patch.object(Comm, "neighbour_rows", spy_exchange),
        mock.patch.object(graphs, "DecoderSteps", spy_steps),
    ):
        vae = build("wan21").to(torch.float16)
        vaeshard.parallelize(vae, mode=mode)
        for part_frames in (tuning.PART_FRAMES, None):
            held.clear(), upsampled.clear(), exchanges.clear()
            with mock.patch.object(tuning, "PART_FRAMES", part_frames):
                out = vae.decode(z.to(torch.float16)).sample
            results.append((out, (max(held)[1], max(upsampled)[1], len(exchanges))))  # (the largest frames')
        vaeshard.unparallelize(vae)
    with torch.no_grad():
        ref = build("wan21").decode(z).sample
    (parts, seen_parts), (whole, seen_whole) = results
    err = (parts.float() - ref).abs()
    return seen_parts, seen_whole, torch.equal(parts, whole), err.max().item(), err.mean().item(), graphed


@pytest.mark.parametrize("mode, world", [("spatial_shard_height", 2), ("spatial_shard_width", 3)])
def test_sharded_decodes_take_default_parts_with_one_exchange(mode, world):
    """Sharded, the residual blocks and upsamplers above the threshold take the default parts of two
    frames and make one halo exchange for all of them: a block receives the raw rows of its input
    and each part norms its own halo rows from them (wan_blocks._edges); an upsampler receives its source's
    rows once and each part copies its own (HaloConv2d.forward_by_phases). The decode makes as many
    exchanges as without the parts, is the one without them bit for bit, and is within tolerance of
    diffusers' fp32 decode. By width on three ranks the middle one receives rows from both sides."""
    for seen_parts, seen_whole, same, err_max, err_mean, _ in run_ranks(_sharded_parts, world, mode, timeout=120):
        assert seen_parts[:2] == (2, 2) and seen_whole[:2] == (4, 4), (seen_parts, seen_whole)
        assert seen_parts[2] == seen_whole[2] > 0, (seen_parts, seen_whole)
        assert same, "the default parts changed the sharded decode"
        assert err_max <= MAX and err_mean <= MEAN, (err_max, err_mean)


def test_sharded_ranks_agree_on_the_parts_where_their_frames_differ():
    """Latent rows 3 and 2 on two ranks: at full resolution 24 x 64 and 16 x 64 pixels, the threshold
    between them. Every rank decides on the parts by the largest rank's frames, so both take them and
    their exchanges pair up (a block's exchange sends raw rows in parts, normed rows otherwise): the
    decode is the one without parts bit for bit. The CUDA graphs' "auto" is decided by the same frame
    size on both ranks too (the plan's frame_pixels)."""
    results = run_ranks(_sharded_parts, 2, "spatial_shard_height", (1, 4, 3, 5, 8), 24 * 64, timeout=120)
    for seen_parts, seen_whole, same, err_max, err_mean, _ in results:
        assert seen_parts[:2] == (2, 2) and seen_whole[:2] == (4, 4), (seen_parts, seen_whole)
        assert same, "the ranks' parts disagreed"
        assert err_max <= MAX and err_mean <= MEAN, (err_max, err_mean)
    asked = [result[-1] for result in results]
    assert asked[0] and asked[0] == asked[1] == [24 * 64] * len(asked[0]), asked
