"""The fast tier's causal convolutions reading their time padding where it lies (conv_kernel.Front):
where box_conv's kernel runs a causal 3x3x3 convolution, its input buffer holds only the new frames
and the kernel reads the two frames before each sample's first from the causal cache (zeros where
it has fewer), and an unsharded convolution whose input is already laid out for the kernel (the
head's) reads that input where it lies, no buffer at all. The decode (and the encode) is the same,
bit for bit, as with the cache copied in front of the frames, and within tolerance of diffusers'
own. On the CPU box_conv's kernel stands in as PyTorch computes its contract (tests/box_stand_in.py)."""

from __future__ import annotations

import pytest
import torch

from . import box_stand_in
from .dist_harness import run_ranks

MAX, MEAN = 5e-2, 2e-3  # the half-precision tolerance against diffusers' fp32 decode


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
    if sharded and parts:
        # in parts (max_layer_frames): given more frames, its convolution takes two new frames at a
        # time, in buffers of its own behind a copy of its cache (diffusers' own); given one, the
        # buffer its norm wrote into
        heads = [b for b in buffers if b[0] == 3]
        assert not any(head) and all(b[4] == "reserved" or (b[2] <= 2 and b[4] is False) for b in heads), heads
        assert any(b[4] is False for b in heads), heads
    elif sharded:
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


@pytest.mark.parametrize("settings", [None, {"max_layer_frames": 2}])
def test_sharded_decode_reads_the_causal_caches_where_they_lie(settings):
    # by height on two ranks: the caches hold their frames' halo rows (taken after the exchange), the
    # kernel reads them so, and only the new frames' halo rows are exchanged; in parts of two frames
    # each part's buffer, halo rows included, becomes the next cache
    for result in run_ranks(box_stand_in.decode_both_ways, 2, "spatial_shard_height", 1, settings, fresh=True,
                            timeout=240):
        _check(*result, sharded=True, parts=settings is not None)


def test_default_parts_keep_their_two_frame_buffers_as_the_caches(monkeypatch):
    """Above fast.PARTS_FROM_PIXELS, a residual block whose causal convolutions box_conv's kernel runs
    takes parts of two frames by default, and each part's buffer (two new frames, read with the
    cache where it lies) becomes its convolution's next cache instead of being copied into the old
    one. Below the threshold the blocks take all their frames. The decode is bit for bit the one
    that copies the buffers into the caches and the one without parts, and within tolerance of
    diffusers' fp32 decode. (On the GPU: BENCHMARKS.md, the parts.)"""
    import vaeshard
    from vaeshard import fast, shard
    from vaeshard.families import wan

    from .models import build, latent

    box_stand_in.install(monkeypatch.setattr, [])
    stores, buffers = [], []
    store = wan._store_cache

    def spy_store(feat_cache, idx, old, frames, owned=False):
        store(feat_cache, idx, old, frames, owned)
        stores.append((owned, frames.shape[2], frames.shape[-2] * frames.shape[-1], feat_cache[idx] is frames))

    monkeypatch.setattr(wan, "_store_cache", spy_store)
    input_buffer = shard.HaloCausalConv3d.input_buffer

    def spy_buffer(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
        buffers.append((new.shape[2], new.shape[-2] * new.shape[-1], front is not None))
        return buf, new, ready, front

    monkeypatch.setattr(shard.HaloCausalConv3d, "input_buffer", spy_buffer)
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

    monkeypatch.setattr(fast, "PARTS_FROM_PIXELS", 2048)
    parts = decode()
    kept = [s for s in stores if s[3]]
    assert kept and all(owned and frames == 2 for owned, frames, _, _ in kept), stores
    assert {pixels for _, _, pixels, _ in kept} >= {2048}, kept
    read = [(new, pixels) for new, pixels, reads in buffers if reads]
    assert max(new for new, pixels in read if pixels == 2048) == 2, read  # parts at the threshold
    assert max(new for new, pixels in read if pixels == 512) == 4, read  # below it whole
    monkeypatch.setattr(wan, "_whole_storage", lambda t: False)  # declined: the buffers copied into the caches
    copied = decode()
    assert not any(s[3] for s in stores), stores
    monkeypatch.setattr(fast, "PART_FRAMES", None)  # no parts by default
    whole = decode()
    assert max(new for new, pixels, reads in buffers if reads and pixels == 2048) == 4, buffers
    vaeshard.unparallelize(vae)
    assert torch.equal(parts, copied), "the buffers kept as caches changed the decode"
    assert torch.equal(parts, whole), "the parts changed the decode"
    err = (parts.float() - ref).abs()
    assert err.max() <= MAX and err.mean() <= MEAN, (err.max(), err.mean())


def _sharded_parts(rank, world):
    """One rank of a sharded fp16 decode with box_conv's stand-in and every frame size above the
    default parts' threshold: the most new frames a buffer read with its cache where it lies held."""
    from unittest import mock

    import vaeshard
    from vaeshard import fast, shard

    from .models import build, latent

    held = []
    input_buffer = shard.HaloCausalConv3d.input_buffer

    def spy(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
        if front is not None:
            held.append(new.shape[2])
        return buf, new, ready, front

    with (box_stand_in.installed([]), mock.patch.object(fast, "PARTS_FROM_PIXELS", 1),
          mock.patch.object(shard.HaloCausalConv3d, "input_buffer", spy)):
        vae = build("wan21").to(torch.float16)
        vaeshard.parallelize(vae, mode="spatial_shard_height")
        vae.decode(latent((1, 4, 3, 4, 8)).to(torch.float16))
        vaeshard.unparallelize(vae)
    return max(held)


def test_sharded_decodes_take_no_default_parts():
    # sharded, each part would add a halo exchange and host work (a rank's decode became host-bound:
    # BENCHMARKS.md), so without a max_layer_frames of the request's own the layers take all their frames
    assert run_ranks(_sharded_parts, 2, timeout=120) == [4, 4]
