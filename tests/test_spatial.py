"""Spatial-shard decode: equal to diffusers' untiled decode within 1e-5 (CPU fp32), on 2-4 gloo ranks."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from .dist_harness import run_ranks
from .models import build, latent
from .parity import CPU_FP32 as TOL_CPU_FP32
from .parity import reference_from_rank0


def _spatial_parity(rank, world, model, shape, mode):
    import vaeshard

    vae = build(model)
    z = latent(shape)
    with torch.no_grad():  # diffusers untiled, same weights
        reference = reference_from_rank0(rank, lambda: vae.decode(z).sample)
    vaeshard.parallelize(vae, mode=mode)
    assert vaeshard.plan(vae, z.shape, world, mode).strategy == mode
    out = vae.decode(z).sample
    assert out.shape == reference.shape
    assert reference.std() > 0.01
    diff = (out - reference).abs().max().item()
    assert diff <= TOL_CPU_FP32, diff
    return diff


SPATIAL_CASES = [
    # id, model, latent shape, world, mode
    ("h-2-uneven", "wan21", (1, 4, 3, 7, 6), 2, "spatial_shard_height"),
    ("w-2", "wan21", (1, 4, 3, 6, 8), 2, "spatial_shard_width"),
    ("h-3-one-frame", "wan21", (1, 4, 1, 8, 5), 3, "spatial_shard_height"),
    ("w-3-uneven", "wan21", (1, 4, 2, 5, 7), 3, "spatial_shard_width"),
    ("h-4-9rows", "wan21", (1, 4, 2, 9, 4), 4, "spatial_shard_height"),
    ("w-4-one-row-each", "wan21", (1, 4, 2, 3, 4), 4, "spatial_shard_width"),
    ("wan22-h-2", "wan22", (1, 4, 3, 5, 4), 2, "spatial_shard_height"),
    ("wan22-w-3", "wan22", (1, 4, 2, 4, 7), 3, "spatial_shard_width"),
    ("qwenimage-w-2", "qwenimage", (1, 4, 1, 6, 7), 2, "spatial_shard_width"),
]


@pytest.mark.parametrize("case", SPATIAL_CASES, ids=[c[0] for c in SPATIAL_CASES])
def test_spatial_decode_matches_untiled(case):
    _, model, shape, world, mode = case
    run_ranks(_spatial_parity, world, model, shape, mode)


def test_real_wan21_config_spatial_decode():
    run_ranks(_spatial_parity, 2, "wan21_real", (1, 16, 2, 4, 6), "spatial_shard_width", timeout=400)


def _spatial_encode_parity(rank, world, model, shape, mode):
    import vaeshard

    vae = build(model)
    x = latent(shape, seed=5).clamp(-1, 1)
    with torch.no_grad():
        reference = vae.encode(x).latent_dist  # diffusers untiled encode
    vaeshard.parallelize(vae, mode=mode)
    strategy = vaeshard.plan(vae, x.shape, world, mode, op="encode").strategy
    assert strategy.startswith("spatial_shard"), strategy
    dist = vae.encode(x).latent_dist
    assert reference.mean.std() > 1e-3
    for got, want in ((dist.mean, reference.mean), (dist.logvar, reference.logvar)):
        assert got.shape == want.shape
        diff = (got - want).abs().max().item()
        assert diff <= TOL_CPU_FP32, diff
    return strategy


ENCODE_CASES = [
    ("wan21-h-2", "wan21", (1, 3, 5, 40, 32), 2, "spatial_shard_height"),
    ("wan21-w-3-uneven", "wan21", (1, 3, 5, 24, 56), 3, "spatial_shard_width"),
    ("wan21-auto-4", "wan21", (1, 3, 1, 32, 48), 4, "auto"),
    ("wan22-h-2", "wan22", (1, 3, 5, 48, 32), 2, "spatial_shard_height"),
    ("qwenimage-w-2", "qwenimage", (1, 3, 1, 24, 40), 2, "spatial_shard_width"),
]


@pytest.mark.parametrize("case", ENCODE_CASES, ids=[c[0] for c in ENCODE_CASES])
def test_spatial_encode_matches_untiled(case):
    _, model, shape, world, mode = case
    run_ranks(_spatial_encode_parity, world, model, shape, mode)


def test_eight_ranks_uneven_height():
    # 11 latent rows over 8 ranks (2, 2, 2, 1, 1, 1, 1, 1): one-row shards whose halo is a whole shard
    diffs = run_ranks(_spatial_parity, 8, "wan21", (1, 4, 2, 11, 4), "spatial_shard_height", timeout=300)
    assert all(d <= TOL_CPU_FP32 for d in diffs)


# The benchmark subjects' latent heights, split as on 4- and 8-GPU machines: Wan 2.1 720p has 90 latent
# rows (4 ranks: 23, 23, 22, 22; 8 ranks: 12, 12, 11, ...), Wan 2.2 720p has 44 (8 ranks: 6, 6, 6, 6,
# 5, 5, 5, 5). Small channel counts and 2 latent columns keep them cheap; the split is the real one.
SUBJECT_SPLITS = [
    ("wan21-90-rows-4", "wan21", (1, 4, 2, 90, 2), 4),
    ("wan21-90-rows-8", "wan21", (1, 4, 2, 90, 2), 8),
    ("wan22-44-rows-8", "wan22", (1, 4, 2, 44, 2), 8),
]


@pytest.mark.parametrize("case", SUBJECT_SPLITS, ids=[c[0] for c in SUBJECT_SPLITS])
def test_subject_row_counts_split_unevenly(case):
    from vaeshard.runtime.spatial import split_extents

    _, model, shape, world = case
    extents = split_extents(shape[3], world)
    assert sum(extents) == shape[3] and max(extents) - min(extents) == 1  # uneven, balanced
    diffs = run_ranks(_spatial_parity, world, model, shape, "spatial_shard_height", timeout=300)
    assert len(diffs) == world and all(d <= TOL_CPU_FP32 for d in diffs)


@pytest.mark.parametrize("rows, cols", [(1, 0), (0, 1), (0, 0)])
def test_copy_frames_fills_the_buffer_core_only(rows, cols):
    # the frames between a buffer's halo rows (or columns), copied frame by frame where each frame
    # is one dense block (halo rows: height shards) and at once otherwise; nothing outside the core
    from vaeshard.layers import buffers as layer_buffers

    buf = torch.zeros(1, 8, 6, 7 + 2 * rows, 5 + 2 * cols).contiguous(memory_format=torch.channels_last_3d)
    core = buf[:, :, 2:, rows : buf.shape[3] - rows, cols : buf.shape[4] - cols]
    x = torch.randn(core.shape).contiguous(memory_format=torch.channels_last_3d)
    assert layer_buffers._dense(core.select(2, 0)) == (cols == 0)  # a frame between halo rows is one block
    layer_buffers.copy_frames(core, x, 2)
    assert torch.equal(core, x)
    outside = buf.clone()
    outside[:, :, 2:, rows : buf.shape[3] - rows, cols : buf.shape[4] - cols] = 0
    assert not outside.any()
    # 2-D frames along the batch axis (the upsamplers' sources), and another layout (a strided copy)
    frames = torch.zeros(4, 16, 7, 6).contiguous(memory_format=torch.channels_last)
    src = torch.randn(4, 16, 5, 6)  # contiguous: not laid out as the buffer's frames
    layer_buffers.copy_frames(frames.narrow(2, 1, 5), src, 0)
    assert torch.equal(frames[:, :, 1:6], src) and not frames[:, :, 0].any() and not frames[:, :, 6].any()


def _zero_columns_parity(rank, world, model, shape, mode, settings):
    # the fast tier with every 3x3x3 convolution's input buffer holding its column padding as zero
    # columns (on CUDA: where the Triton kernel's row tiles do not fit the rows, conv_kernel.
    # wants_zero_columns), convolved without padding columns: diffusers' untiled decode within 1e-5
    import vaeshard
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.layers import convs

    vae = build(model)
    z = latent(shape)
    with torch.no_grad():
        reference = vae.decode(z).sample
    buffers = []  # (buffer columns, new frames' columns, the buffer's first and last column all zero)
    input_buffer = convs.HaloCausalConv3d.input_buffer

    def spy(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = input_buffer(self, like, cache_x, halo_rows, shape)
        edges = not buf[..., 0].any() and not buf[..., -1].any()  # (before the caller writes the new frames)
        buffers.append((buf.shape[-1], new.shape[-1], edges))
        return buf, new, ready, front

    # (patched for this call only: the rank processes serve later tests)
    with (
        mock.patch.object(
            conv_kernel, "wants_zero_columns", lambda like, weight, width: tuple(weight.shape[2:]) == (3, 3, 3)
        ),
        mock.patch.object(convs.HaloCausalConv3d, "input_buffer", spy),
    ):
        vaeshard.parallelize(vae, mode=mode, fast=vaeshard.FastOptions(**settings))
        out = vae.decode(z).sample
    held = [b for b in buffers if b[0] == b[1] + 2]
    assert held and all(edges for _, _, edges in held), buffers
    diff = (out - reference).abs().max().item()
    assert diff <= TOL_CPU_FP32, diff
    return len(held), len(buffers)


@pytest.mark.parametrize(
    "world, mode, settings",
    [
        (1, "auto", {}),
        (2, "spatial_shard_height", {}),
        (1, "auto", {"frames_per_step": 2, "max_layer_frames": 2}),  # parts of frames, each part's cache before it
    ],
)
def test_zero_columns_decode_matches_untiled(world, mode, settings):
    # the caches taken from such buffers hold the zero columns too (copied whole into the next
    # decoder call's buffer); by height the halo rows are exchanged with them
    for held, total in run_ranks(_zero_columns_parity, world, "wan21", (1, 4, 3, 6, 10), mode, settings, fresh=True):
        assert held >= total // 2, (held, total)
