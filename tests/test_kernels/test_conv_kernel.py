"""The fast tier's Triton convolution (conv_kernel.py): its values against PyTorch's convolution, run
by Triton's CPU interpreter; which convolutions it takes; that it compiles for Hopper."""

import os
import re
import subprocess
import tempfile
import textwrap

import pytest
import torch

from vaeshard.kernels import box_conv
from vaeshard.kernels import conv3d as conv_kernel

from .. import interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNEL_VALUES = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from tests import interpreter
    interpreter.unsanitized()
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.kernels import weights
    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import tier
    from vaeshard.kernels.conv3d import ConvPlan

    torch.manual_seed(0)
    cases = [  # (N, Cin, Cout, T, H, W, padding, plan)
        (1, 32, 24, 4, 3, 16, (0, 1, 1), ConvPlan(wrap=False, block_m=16, block_n=32)),  # rows, 24 of 32 channels
        (2, 32, 32, 5, 4, 32, (0, 1, 1), ConvPlan(wrap=False, block_m=16, block_n=32)),  # two samples, two tiles a row
        (1, 64, 16, 3, 4, 16, (0, 0, 1), ConvPlan(wrap=False, block_m=16, block_n=16)),  # height-sharded buffer
        (1, 32, 24, 4, 3, 13, (0, 1, 0), ConvPlan(wrap=True, block_m=16, block_n=32)),   # width-sharded: tiles wrap
        (2, 32, 40, 5, 5, 9, (0, 1, 0), ConvPlan(wrap=True, block_m=32, block_n=64)),    # last tile partly past the end
        (1, 32, 8, 3, 4, 6, (0, 0, 0), ConvPlan(wrap=True, block_m=16, block_n=16)),     # no padding at all
        # two channel tiles in one program (as 96 = 64 + 32): rows, and wrapping
        (1, 32, 48, 4, 3, 16, (0, 1, 1), ConvPlan(wrap=False, block_m=16, block_n=32, block_n2=16)),
        (2, 64, 24, 4, 3, 13, (0, 1, 0), ConvPlan(wrap=True, block_m=16, block_n=16, block_n2=8, block_k=64)),
    ]
    # fp16 only: Triton's interpreter multiplies bf16 matrices wrongly (tl.dot), so bf16, the same
    # kernel with another element type, is compared on the GPU by benchmarks/gpu_parity.py
    for n, cin, cout, t, h, w, padding, how in cases:
        for dtype in (torch.float16,):
            x = torch.randn(n, cin, t, h, w).to(dtype).contiguous(memory_format=torch.channels_last_3d)
            weight = (torch.randn(cout, cin, 3, 3, 3) / (27 * cin) ** 0.5).to(dtype)
            bias = torch.randn(cout).to(dtype)
            for b in (None, bias):
                want = F.conv3d(x.float(), weight.float(), None if b is None else b.float(), 1, padding)
                got = conv_kernel.conv3d(x, weight, b, padding, how)
                assert got.shape == want.shape and got.dtype == dtype, (got.shape, want.shape)
                assert got.is_contiguous(memory_format=torch.channels_last_3d)
                # one rounding of the fp32 sum: half an ulp (bounded by one)
                ulp = 2.0 ** -10
                err = (got.float() - want).abs()
                bound = want.abs() * ulp + 1e-3
                assert bool((err <= bound).all()), (n, cin, cout, t, h, w, padding, how, dtype, err.max().item())
                # no output left unwritten (torch.empty): the error bound holds at every voxel
                # added to a residual in place: (conv + bias) rounded, + residual rounded
                residual = torch.randn(want.shape).to(dtype).contiguous(memory_format=torch.channels_last_3d)
                into = residual.clone()
                got = conv_kernel.conv3d(x, weight, b, padding, how, add_to=into)
                assert got is into
                summed = want + residual.float()
                err = (got.float() - summed).abs()
                bound = (want.abs() + summed.abs()) * ulp + 2e-3
                assert bool((err <= bound).all()), ("add_to", n, cin, cout, padding, how, err.max().item())
                # the residual counts: the result is not the convolution alone
                assert (got.float() - want).abs().max() > 0.5
                if b is not None:
                    continue
                # the next RMS norm + SiLU computed as the result is stored (a residual block's
                # conv1, whose bias the norm adds: pre_bias), written into the new frames of a
                # larger buffer (the next convolution's input): what the norm kernel computes from
                # the stored result, up to the order of the sum of squares
                gamma = (torch.rand(cout) + 0.5).to(dtype)
                pre, norm_bias = torch.randn(cout).to(dtype), torch.randn(cout).to(dtype) * 0.1
                plain = conv_kernel.conv3d(x, weight, None, padding, how)
                for nb in (0.0, norm_bias):
                    norm = conv_kernel.NormEpilogue(gamma, nb, cout ** 0.5, pre_bias=pre)
                    normed = norm_kernels.rms_norm(plain, gamma, nb, cout ** 0.5, True, pre_bias=pre)
                    buf = torch.zeros(n, cout, want.shape[2] + 2, want.shape[3] + 2, want.shape[4] + 2,
                                      dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
                    out = buf[:, :, 2:, 1:-1, 1:-1]  # two cached frames in front, a halo row and column each side
                    if n > 1:  # there the samples' frames do not follow each other: refused
                        try:
                            conv_kernel.conv3d(x, weight, None, padding, how, norm=norm, out=out)
                        except ValueError as e:
                            assert "out must be" in str(e)
                        else:
                            raise AssertionError("conv3d took samples whose frames do not follow each other")
                        buf, out = None, torch.empty_like(plain)
                    got = conv_kernel.conv3d(x, weight, None, padding, how, norm=norm, out=out)
                    assert got is out
                    err = (got.float() - normed.float()).abs()
                    assert bool((err <= normed.float().abs() * 2.0 ** -8 + 1e-3).all()), ("norm", how, err.max().item())
                    assert (got == normed).float().mean().item() > 0.9, ("norm", how)
                    if buf is not None:  # nothing written outside the view
                        outside = buf.clone()
                        outside[:, :, 2:, 1:-1, 1:-1] = 0
                        assert not outside.any()
                    # and against the norm in fp32 from the stored convolution (a few fp16 roundings apart)
                    per_channel = lambda v: v.float().reshape(1, -1, 1, 1, 1)
                    ref = F.normalize(plain.float() + per_channel(pre), dim=1) * cout ** 0.5 * per_channel(gamma)
                    ref = F.silu(ref + (per_channel(nb) if isinstance(nb, torch.Tensor) else nb))
                    err = (got.float() - ref).abs()
                    assert bool((err <= ref.abs() * 2.0 ** -7 + 2e-3).all()), ("norm vs fp32", how, err.max().item())
    # add_to must have the output's shape, dtype and channels-last layout
    x = torch.randn(1, 32, 4, 3, 16).to(torch.float16).contiguous(memory_format=torch.channels_last_3d)
    weight = torch.randn(16, 32, 3, 3, 3).to(torch.float16)
    how = ConvPlan(wrap=False, block_m=16, block_n=16)
    for wrong in (torch.zeros(1, 16, 2, 3, 16, dtype=torch.float16),  # NCDHW
                  torch.zeros(1, 16, 3, 3, 16, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d),
                  torch.zeros(1, 16, 2, 3, 16).contiguous(memory_format=torch.channels_last_3d)):  # fp32
        try:
            conv_kernel.conv3d(x, weight, None, (0, 1, 1), how, add_to=wrong)
        except ValueError as e:
            assert "add_to" in str(e)
        else:
            raise AssertionError("conv3d took an add_to it cannot write")
    # the weight kept on the tensor: made once, made again after an in-place change
    weight = torch.randn(16, 32, 3, 3, 3)
    first = conv_kernel.cached_gemm_weight(weight)
    assert conv_kernel.cached_gemm_weight(weight) is first
    weight.mul_(2)
    again = conv_kernel.cached_gemm_weight(weight)
    assert again is not first and torch.equal(again, first * 2)
    with torch.inference_mode():  # no version counter: made each time, never kept
        frozen = torch.randn(16, 32, 3, 3, 3)
        assert torch.equal(conv_kernel.cached_gemm_weight(frozen), conv_kernel.gemm_weight_of(frozen))
        assert not weights.holds(frozen, "gemm")
    # unparallelize drops the kept copies
    conv = torch.nn.Conv3d(32, 16, 3)
    conv_kernel.cached_gemm_weight(conv.weight)
    assert weights.holds(conv.weight, "gemm")
    weights.forget(conv)
    assert not weights.holds(conv.weight, "gemm")
    # two samples of one frame each, added to (and written into) a tensor laid out as an upsampler
    # leaves its output after one frame: (N, C, H, W) channels-last frames seen as (N, C, 1, H, W),
    # whose one-frame axis has the channels' stride: samples are a sample stride apart
    x = torch.randn(2, 32, 3, 4, 16).half().contiguous(memory_format=torch.channels_last_3d)
    weight = (torch.randn(32, 32, 3, 3, 3) / (27 * 32) ** 0.5).half()
    how = ConvPlan(wrap=False, block_m=16, block_n=32)
    def one_frame_layout(t):
        return t[:, :, 0].contiguous(memory_format=torch.channels_last).unsqueeze(1).transpose(1, 2)
    residual = one_frame_layout(torch.randn(2, 32, 1, 4, 16).half())
    assert residual.stride(2) == 32 and residual.stride(0) == 32 * 4 * 16
    want = F.conv3d(x.float(), weight.float(), None, 1, (0, 1, 1))
    got = conv_kernel.conv3d(x, weight, None, (0, 1, 1), how, add_to=residual.clone())
    assert (got.float() - want - residual.float()).abs().max() <= 4e-3, "one-frame add_to"
    into = one_frame_layout(torch.zeros(2, 32, 1, 4, 16).half())
    got = conv_kernel.conv3d(x, weight, None, (0, 1, 1), how, out=into)
    assert got is into and (got.float() - want).abs().max() <= 4e-3, "one-frame out"
    print("conv kernel ok")
    """
)


VALUES_JOB = interpreter.script("conv-kernel-values", KERNEL_VALUES)


@pytest.mark.background(VALUES_JOB)
def test_conv_kernel_values_through_the_interpreter():
    pytest.importorskip("triton")
    run = interpreter.result(VALUES_JOB, timeout=280)
    assert run.returncode == 0 and "conv kernel ok" in run.stdout, run.stdout + run.stderr


MODEL_THROUGH_CONV_KERNEL = textwrap.dedent(
    """
    import torch
    import vaeshard
    from tests import interpreter
    interpreter.for_model_decodes()
    from tests.models import build, latent
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.kernels import weights

    # the test model's 32-channel 3x3x3 convolutions (Wan's 96 / 384 scaled down) on tiles small
    # enough for its rows
    conv_kernel.TILE = conv_kernel.ConvPlan(wrap=False, block_m=16, block_n=32)
    calls = []
    kernel = conv_kernel.conv3d
    from vaeshard.kernels import phases as upsample
    phased = []  # the upsamplers' convolutions by phases (their interleaving pass on the Triton kernel)
    by_phases, interleave = upsample.conv2d_by_phases, upsample._interleave_kernel
    upsample.conv2d_by_phases = lambda *a, **k: phased.append(a[0].shape) or by_phases(*a, **k)
    interleaved = []
    upsample._interleave_kernel = type("Recorded", (), {"__getitem__": lambda self, grid: (
        lambda *a, **k: interleaved.append(grid) or interleave[grid](*a, **k))})()
    added = []  # calls that added their result to a residual (the residual blocks' conv2)
    normed = []  # calls that computed the next norm as they stored (the residual blocks' conv1)
    wraps = []  # whether each call took the wrapping tiles
    conv_kernel.conv3d = lambda *a, **k: calls.append(a[0].shape) or wraps.append(a[4].wrap) or added.append(
        (a[6] if len(a) > 6 else k.get("add_to")) is not None) or normed.append(k.get("norm") is not None) or kernel(
        *a, **k)
    # the mid block's attention on the fast tier's own (attention.py)
    from vaeshard.kernels import attention
    attended = []
    own_attention = attention.attention
    attention.attention = lambda *a: attended.append(a[0].shape) or own_attention(*a)
    # fp16: the interpreter's bf16 matrix products are wrong (see KERNEL_VALUES)
    vae = build("wan21")
    z = latent((1, 4, 2, 2, 16))
    narrow = latent((1, 4, 2, 2, 6))  # rows of 24, 12 and 6 columns where the kernel runs: 16-voxel tiles fit none
    pair = latent((2, 4, 2, 2, 16), seed=5)  # two samples: after one frame an upsampler's output has
    # the channels' stride on its frame axis, and the next block adds into it (conv_kernel.frame_stride)
    with torch.no_grad():
        ref = vae.decode(z).sample
        ref_narrow = vae.decode(narrow).sample
        ref_pair = vae.decode(pair).sample
    vae.to(torch.float16)
    z = z.to(torch.float16)
    vaeshard.parallelize(vae)
    out = vae.decode(z).sample
    assert calls and not any(wraps), "the row tiles did not take the unsharded rows"
    assert any(normed), "the row tiles' conv1 did not compute norm2 in its epilogue"
    added.clear()
    got = vae.decode(pair.to(torch.float16)).sample
    assert any(added), "no residual added in the kernel's epilogue with two samples"
    for i in range(2):
        err = (got[i].float() - ref_pair[i]).abs()
        assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, ("pair", i, err.max().item(), err.mean().item())
    # where they do not fit, the buffers hold their padding as zero columns and the wrapping tiles
    # take them (tier.zero_columns; on one rank nothing else wraps)
    wraps.clear()
    got = vae.decode(narrow.to(torch.float16)).sample
    assert wraps and all(wraps), wraps
    err = (got.float() - ref_narrow).abs()
    assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, (err.max().item(), err.mean().item())
    assert calls, "no convolution ran on the Triton kernel"
    assert attended, "the attention did not run on the fast tier's own"
    assert any(added) and not all(added), "the residual blocks' conv2 did not add into the residual"
    assert any(normed) and not all(normed), "the residual blocks' conv1 did not compute norm2 in its epilogue"
    # every upsampler by phases, their interleaving pass on the Triton kernel
    assert phased and len(interleaved) == len(phased), (phased, interleaved)
    # max_layer_frames (the setting for the lowest peak): conv1's output is stored and the norm runs
    # after it, so only one convolution input is alive at a time
    vaeshard.parallelize(vae, fast=vaeshard.FastOptions(max_layer_frames=2))
    normed.clear()
    parts = vae.decode(z).sample
    assert normed and not any(normed), "max_layer_frames still computed norm2 in conv1's epilogue"
    err = (parts.float() - ref).abs()
    assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, (err.max().item(), err.mean().item())
    vaeshard.parallelize(vae)
    assert any(weights.holds(p, "gemm") for p in vae.parameters())
    err = (out.float() - ref).abs()
    assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, (err.max().item(), err.mean().item())
    vaeshard.parallelize(vae, fast=vaeshard.FastOptions(triton_convs=False))
    taken = len(calls)
    cudnn = vae.decode(z).sample
    assert len(calls) == taken, "triton_convs=False still ran the Triton convolution kernel"
    err = (cudnn.float() - ref).abs()
    assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, (err.max().item(), err.mean().item())
    # encoding takes the kernel too (the encoder's 32-channel blocks): against diffusers' fp32 encode
    x = torch.rand(1, 3, 5, 16, 128) * 2 - 1
    vaeshard.unparallelize(vae)
    vae.float()
    with torch.no_grad():
        want = vae.encode(x).latent_dist.mean
    vae.to(torch.float16)
    vaeshard.parallelize(vae)
    before = len(calls)
    got = vae.encode(x.to(torch.float16)).latent_dist.mean
    assert len(calls) > before, "the encoder's convolutions did not run on the Triton kernel"
    err = (got.float() - want).abs()
    assert err.max().item() <= 5e-2 and err.mean().item() <= 2e-3, (err.max().item(), err.mean().item())
    vaeshard.unparallelize(vae)  # leaves no kept weight copies behind
    assert not any(weights.holds(p, "gemm") for p in vae.parameters())
    print("model ok", taken)
    """
)


MODEL_JOB = interpreter.script("conv-kernel-model", MODEL_THROUGH_CONV_KERNEL)


@pytest.mark.background(MODEL_JOB)
def test_fast_tier_decode_and_encode_through_the_conv_kernel_on_cpu():
    # Wan's decoder (and encoder) with its 32-channel convolutions on the Triton kernel (the interpreter,
    # fp16), within the half-precision tolerance (tests/parity.py) of diffusers' fp32 decode (encode), rows the
    # row tiles do not fit taken by the wrapping tiles through zero columns, and none of them with
    # triton_convs=False
    pytest.importorskip("triton")
    run = interpreter.result(MODEL_JOB, timeout=280)
    assert run.returncode == 0 and "model ok" in run.stdout, run.stdout + run.stderr


# (height shards with one sample, row tiles with the norm epilogue, add nothing here: the direct decode
# above takes the row tiles with that epilogue, and the two-sample case below the height halo rows)
SHARDED_CASES = [("spatial_shard_width", True, 1), ("spatial_shard_height", False, 2)]


@pytest.fixture(scope="module")
def sharded_through_the_kernel():
    """The sharded decodes of SHARDED_CASES, every case on the same two fresh gloo ranks (one start of
    rank processes in Triton's interpreter for both): {(mode, samples): [each rank's result]}."""
    pytest.importorskip("triton")
    from ..conv_kernel_ranks import sharded_cases
    from ..dist_harness import run_ranks

    cases = [(mode, samples) for mode, _, samples in SHARDED_CASES]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")  # inherited by the fresh rank processes
        per_rank = run_ranks(sharded_cases, 2, cases, fresh=True, timeout=400)
    return {case: [results[case] for results in per_rank] for case in cases}


@pytest.mark.parametrize("mode, wrap, samples", SHARDED_CASES)
def test_sharded_decode_through_the_conv_kernel_on_cpu(sharded_through_the_kernel, mode, wrap, samples):
    # two gloo ranks running the Triton kernel in its interpreter (fp16): width shards take the
    # wrapping tiles, height shards the row tiles, the residual blocks' conv2 adds the residual in
    # the epilogue, their conv1 computes norm2 in its epilogue, the upsamplers compute their phases
    # from source frames with halo rows (columns) from the neighbours, the attention runs on the fast tier's own
    # (attention.py) with the rank's queries and the whole frame's keys, and the decode is within the
    # half-precision tolerance of diffusers' fp32 decode; with two samples in the request too (the
    # norm then runs after conv1: its epilogue writes one sample's frames), whose second sample the
    # kernels once stored into the first's where an output had one frame (triton_support.frame_stride)
    for calls, upsampled, attended, err_max, err_mean in sharded_through_the_kernel[(mode, samples)]:
        assert calls and all(w == wrap for w, _, _ in calls), calls
        # the mid block's attention: the rank's own query rows against the whole frame's keys
        assert attended and all(lq * 2 == lk for lq, lk in attended), attended
        # the upsamplers' phases read their source with one halo row (column) a side from the neighbour
        assert upsampled and all(halo == ((0, 1) if wrap else (1, 0)) for halo in upsampled), upsampled
        assert any(added for _, added, _ in calls), "no residual added in the kernel's epilogue"
        assert any(normed for _, _, normed in calls) == (samples == 1), "the norm in the kernel's epilogue"
        assert err_max <= 5e-2 and err_mean <= 2e-3, (err_max, err_mean)


def _x(shape, dtype=torch.bfloat16, channels_last=True):
    x = torch.zeros(shape, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last_3d) if channels_last else x


def _w(cout, cin, k=(3, 3, 3), dtype=torch.bfloat16):
    return torch.zeros((cout, cin, *k), dtype=dtype)


# `plan` reads only shapes, strides and the dtype: the decode-sized examples of the plan tests are
# meta tensors (no memory), so collecting this module allocates nothing large
def _shape_x(shape, dtype=torch.bfloat16, channels_last=True):
    x = torch.empty(shape, dtype=dtype, device="meta")
    return x.contiguous(memory_format=torch.channels_last_3d) if channels_last else x


def _shape_w(cout, cin, k=(3, 3, 3), dtype=torch.bfloat16):
    return torch.empty((cout, cin, *k), dtype=dtype, device="meta")


@pytest.mark.parametrize(
    "x, w, stride, padding, wrap",
    [
        (_shape_x((1, 96, 6, 720, 1280)), _shape_w(96, 96), 1, (0, 1, 1), False),  # Wan 2.1 720p, one GPU
        (_shape_x((1, 96, 6, 362, 1280)), _shape_w(96, 96), 1, (0, 0, 1), False),  # sharded by height
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96), 1, (0, 1, 0), True),  # sharded by width
        (_shape_x((1, 96, 6, 480, 418)), _shape_w(96, 96), 1, (0, 1, 0), True),  # 480p, sharded by width
        (_shape_x((1, 192, 6, 360, 640)), _shape_w(192, 192), 1, (0, 1, 1), False),  # half resolution, 720p
        (_shape_x((1, 192, 6, 182, 640)), _shape_w(192, 192), 1, (0, 0, 1), False),  # sharded by height
        (_shape_x((1, 192, 6, 360, 322)), _shape_w(192, 192), 1, (0, 1, 0), True),  # sharded by width
        (
            _shape_x((1, 32, 4, 8, 512), torch.float16),
            _shape_w(8, 32, dtype=torch.float16),
            (1, 1, 1),
            (0, 1, 1),
            False,
        ),
    ],
)
def test_plan_takes_the_measured_shapes(monkeypatch, x, w, stride, padding, wrap):
    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)  # meta tensors stand in for CUDA ones
    how = conv_kernel.plan(x, w, stride, padding, 1, 1)
    assert how is not None and how.wrap == wrap
    cout = w.shape[0]
    # the channel tiles cover the output channels; 3 x 2^k channels as two tiles with none idle
    assert how.block_n + how.block_n2 == cout if cout in (96, 192) else how.block_n >= cout and not how.block_n2
    assert x.shape[1] % how.block_k == 0 and (wrap or x.shape[4] % how.block_m == 0)


@pytest.mark.parametrize(
    "x, w, stride, padding, dilation, groups, why",
    [
        (
            _shape_x((1, 96, 6, 480, 832)),
            _shape_w(96, 96),
            1,
            (0, 1, 1),
            1,
            1,
            "rows not a multiple of the tile, padded",
        ),
        (
            _shape_x((1, 96, 6, 720, 1280), torch.float32),
            _shape_w(96, 96, dtype=torch.float32),
            1,
            (0, 1, 1),
            1,
            1,
            "fp32",
        ),
        (_shape_x((1, 384, 6, 180, 322)), _shape_w(384, 384), 1, (0, 1, 0), 1, 1, "384 output channels"),
        (
            _shape_x((1, 256, 6, 352, 640)),
            _shape_w(256, 256),
            1,
            (0, 1, 1),
            1,
            1,
            "256 output channels (Wan 2.2: no faster)",
        ),
        (
            _shape_x((1, 192, 6, 240, 416)),
            _shape_w(192, 192),
            1,
            (0, 1, 1),
            1,
            1,
            "rows of 416 for 128-voxel tiles, padded",
        ),
        (_shape_x((1, 96, 6, 720, 322)), _shape_w(192, 96), 1, (0, 1, 0), 1, 1, "96 input channels for 64 per step"),
        (
            _shape_x((1, 96, 6, 720, 642)),
            _shape_w(3, 96),
            1,
            (0, 1, 0),
            1,
            1,
            "3 output channels (TMA rows of 6 bytes)",
        ),
        (_shape_x((1, 16, 6, 720, 642)), _shape_w(96, 16), 1, (0, 1, 0), 1, 1, "16 input channels"),
        (
            _shape_x((1, 96, 6, 720, 642), channels_last=False),
            _shape_w(96, 96),
            1,
            (0, 1, 0),
            1,
            1,
            "not channels-last",
        ),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96), (1, 2, 2), (0, 1, 0), 1, 1, "stride 2"),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96), 1, (0, 1, 0), (1, 2, 2), 1, "dilation 2"),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(48, 48), 1, (0, 1, 0), 1, 2, "groups"),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96), 1, (1, 1, 0), 1, 1, "padded in time"),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96, (1, 3, 3)), 1, (0, 1, 0), 1, 1, "1x3x3 kernel"),
        (_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96, (3, 1, 1)), 1, (0, 0, 0), 1, 1, "3x1x1 kernel"),
    ],
)
def test_plan_leaves_the_rest_to_cudnn(monkeypatch, x, w, stride, padding, dilation, groups, why):
    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)
    assert conv_kernel.plan(x, w, stride, padding, dilation, groups) is None, why


@pytest.mark.parametrize(
    "cout, width, wants",
    [
        (96, 832, True),  # Wan 2.1 480p, one GPU or by height: 3.25 tiles of 256 a row
        (96, 1280, False),  # 720p: 5 tiles a row
        (192, 416, True),  # 480p at half resolution: 3.25 tiles of 128
        (192, 640, False),
        (384, 208, False),  # no tile for 384 channels: cuDNN pads
        (256, 330, False),  # nor for Wan 2.2's 256
    ],
)
def test_zero_columns_where_the_row_tiles_do_not_fit(monkeypatch, cout, width, wants):
    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)
    like = _shape_x((1, cout, 6, 4, width))
    assert conv_kernel.wants_zero_columns(like, _shape_w(cout, cout), width) == wants
    if wants:  # the buffer with its zero columns, convolved without column padding: the wrapping tiles
        buf = _shape_x((1, cout, 6, 4, width + 2))
        assert conv_kernel.plan(buf, _shape_w(cout, cout), 1, (0, 1, 0), 1, 1).wrap
    assert not conv_kernel.wants_zero_columns(like.float(), _shape_w(cout, cout, dtype=torch.float32), width)
    assert not conv_kernel.wants_zero_columns(like, _shape_w(cout, cout, (1, 3, 3)), width)


def test_plan_needs_cuda_or_the_interpreter():
    assert conv_kernel.plan(_shape_x((1, 96, 6, 720, 642)), _shape_w(96, 96), 1, (0, 1, 0), 1, 1) is None
    assert not conv_kernel.wants_zero_columns(_shape_x((1, 96, 6, 480, 832)), _shape_w(96, 96), 832)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize(
    "cout, epilogue", [(64, None), (96, None), (96, "add"), (192, "add"), (96, "norm"), (192, "norm")]
)
def test_conv_kernel_compiles_for_hopper(wrap, cout, epilogue):
    # TMA box loads and warp-group matrix multiplies are Hopper instructions: compiled for
    # sm_90 with Triton's own ptxas, no GPU needed, with the tiles `plan` picks (add: the residual
    # added in the epilogue, as the residual blocks' second convolutions do; norm: the next norm
    # computed in the epilogue, as their first convolutions do)
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    how = conv_kernel.TILES.get(cout, conv_kernel.TILE)._replace(wrap=wrap)
    bm, bn, bn2, bk = how.block_m, how.block_n, how.block_n2, how.block_k
    kernel = conv_kernel._conv3x3x3_kernel
    norm = epilogue == "norm"
    constants = dict(
        CIN=cout,
        COUT=cout,
        BM=bm,
        BN=bn,
        BN2=bn2,
        BK=bk,
        WRAP=wrap,
        HAS_BIAS=not norm,
        ADD=epilogue == "add",
        NORM=norm,
        NORM_BIAS=False,
        PRE_BIAS=norm,
        SILU=True,
        STAGES=how.stages,
    )
    box = f"1, {bm}, {bk}" if wrap else f"1, 1, {bm}, {bk}"
    types = {
        "xd": f"tensordesc<bf16[{box}]>",
        "wd": f"tensordesc<bf16[{bk}, {bn}]>",
        "yd": f"tensordesc<bf16[1, 1, {bm}, {bn}]>",
        "wd2": f"tensordesc<bf16[{bk}, {bn2 or bn}]>",
        "yd2": f"tensordesc<bf16[1, 1, {bm}, {bn2 or bn}]>",
        "y_ptr": "*bf16",
        "b_ptr": "*bf16",
        "g_ptr": "*bf16",
        "nb_ptr": "*bf16",
        "p_ptr": "*bf16",
        "scale": "fp32",
        "eps": "fp32",
    }
    names = kernel.arg_names
    types = {n: types.get(n, "constexpr" if n in constants else "i32") for n in names}
    source = ASTSource(kernel, types, constexprs={(names.index(c),): v for c, v in constants.items()})
    compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": how.num_warps})
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx


def test_conv_with_bias_takes_the_kernel_only_in_the_fast_tier_with_triton_convs(monkeypatch):
    import torch.nn.functional as F

    from vaeshard.layers import tier

    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)  # CPU tensors stand in for CUDA ones
    calls = []
    monkeypatch.setattr(
        conv_kernel,
        "conv3d",
        lambda x, w, b, padding, how, gemm=None, add_to=None, front=None: calls.append(how) or "kernel",
    )
    x = _x((1, 96, 4, 3, 642), torch.float16)
    w, b = _w(96, 96, dtype=torch.float16), torch.zeros(96, dtype=torch.float16)
    args = (1, (0, 1, 0), 1, 1)
    with tier.active(tier.FastPlan()):
        assert tier.conv_with_bias(F.conv3d, x, w, b, *args) == "kernel" and calls[-1].wrap
    with tier.active(tier.FastPlan(triton_convs=False)):
        assert isinstance(
            tier.conv_with_bias(
                F.conv3d, x[:, :, :, :, :8].contiguous(memory_format=torch.channels_last_3d), w, b, *args
            ),
            torch.Tensor,
        )
    with tier.active(None):  # the exact tier: PyTorch's convolution
        assert isinstance(
            tier.conv_with_bias(
                F.conv3d, x[:, :, :, :, :8].contiguous(memory_format=torch.channels_last_3d), w, b, *args
            ),
            torch.Tensor,
        )
    assert len(calls) == 1
    with (
        tier.active(tier.FastPlan()),
        pytest.raises(RuntimeError, match="bias type"),
    ):  # another dtype: PyTorch's own error
        tier.conv_with_bias(F.conv3d, x, w, b.float(), *args)
    assert len(calls) == 1


def test_conv_with_bias_adds_the_residual_in_the_epilogue_where_measured_faster(monkeypatch):
    # row tiles add `add_to` as they store (measured faster); wrapping 256-voxel tiles (96 channels)
    # leave it to the one-pass add after them (measured slower in their epilogue), which writes into
    # `add_to` all the same; wrapping 128-voxel ones (192 channels) add it themselves
    import torch.nn.functional as F

    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import tier

    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)
    seen = []

    def kernel(x, w, b, padding, how, gemm=None, add_to=None, front=None):
        seen.append((how.wrap, add_to is not None))
        return add_to if add_to is not None else torch.ones(conv_kernel.out_shape(x, w, padding), dtype=x.dtype)

    monkeypatch.setattr(conv_kernel, "conv3d", kernel)
    monkeypatch.setattr(norm_kernels, "add_bias_and_residual_", lambda y, b, r, into_residual=False: r.add_(y))
    w, b = _w(96, 96, dtype=torch.float16), torch.zeros(96, dtype=torch.float16)
    with tier.active(tier.FastPlan()):
        x = _x((1, 96, 4, 3, 512), torch.float16)  # rows
        r = torch.zeros(1, 96, 2, 3, 512, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        assert tier.conv_with_bias(F.conv3d, x, w, b, 1, (0, 1, 1), 1, 1, add_to=r) is r and seen[-1] == (False, True)
        x = _x((1, 96, 4, 3, 10), torch.float16)  # wrapping (no column padding)
        r = torch.zeros(1, 96, 2, 3, 8, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        assert tier.conv_with_bias(F.conv3d, x, w, b, 1, (0, 1, 0), 1, 1, add_to=r) is r and seen[-1] == (True, False)
        assert bool((r == 1).all())  # the kernel's output added into r after it
        w = _w(192, 192, dtype=torch.float16)
        x = _x((1, 192, 4, 3, 10), torch.float16)
        r = torch.zeros(1, 192, 2, 3, 8, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        assert tier.conv_with_bias(F.conv3d, x, w, None, 1, (0, 1, 0), 1, 1, add_to=r) is r and seen[-1] == (True, True)


def test_conv_with_bias_computes_the_next_norm_in_the_epilogue_where_the_kernel_runs(monkeypatch):
    # with `norm` and `out`: the kernel computes the norm as it stores where it runs the convolution;
    # elsewhere (a shape it leaves to cuDNN, triton_convs=False) the convolution, then the norm
    # into `out`, with the same values as the two steps by hand
    import torch.nn.functional as F

    from vaeshard.layers import tier

    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)  # (norm_kernels.rms_norm stays eager on CPU)
    seen = []

    def kernel(x, w, b, padding, how, gemm=None, add_to=None, norm=None, out=None, front=None):
        seen.append((how.wrap, norm))
        return out.fill_(1)

    monkeypatch.setattr(conv_kernel, "conv3d", kernel)
    gamma, pre = torch.rand(96, 1, 1, 1) + 0.5, torch.randn(96)  # gamma shaped as diffusers' norms hold it
    norm = conv_kernel.NormEpilogue(gamma.half(), 0.0, 96**0.5, pre_bias=pre.half())
    w = _w(96, 96, dtype=torch.float16)
    buf = torch.zeros(1, 96, 4, 3, 512, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
    with tier.active(tier.FastPlan()):
        x = _x((1, 96, 4, 3, 512), torch.float16)  # rows
        out = buf[:, :, 2:]
        assert tier.conv_with_bias(F.conv3d, x, w, None, 1, (0, 1, 1), 1, 1, norm=norm, out=out) is out
        assert seen[-1] == (False, norm) and bool((out == 1).all())
        x = _x((1, 96, 4, 3, 10), torch.float16)  # wrapping (no column padding)
        out = buf[:, :, 2:, :, :8]
        assert tier.conv_with_bias(F.conv3d, x, w, None, 1, (0, 1, 0), 1, 1, norm=norm, out=out) is out
        assert seen[-1] == (True, norm)
        with pytest.raises(ValueError, match="norm needs"):
            tier.conv_with_bias(F.conv3d, x, w, None, 1, (0, 1, 0), 1, 1, norm=norm)
        # a residual block takes that path for one sample (a causal input buffer holds a sample's
        # cached frames between the samples' new frames, so their frames do not follow each other)
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

        from vaeshard.layers import convs
        from vaeshard.runtime import swap

        conv = WanCausalConv3d(96, 96, 3, padding=1).half()
        swap.swap(conv, convs.HaloCausalConv3d)
        assert conv.norms_in_epilogue(_x((1, 96, 6, 3, 512), torch.float16))
        assert not conv.norms_in_epilogue(_x((2, 96, 6, 3, 512), torch.float16))
        assert conv.output_shape(_x((2, 96, 6, 3, 512), torch.float16)) == (2, 96, 4, 3, 512)
    calls = len(seen)
    x = torch.randn(1, 96, 4, 3, 8, dtype=torch.float64)
    w64 = torch.randn(96, 96, 3, 3, 3, dtype=torch.float64) / 50
    norm64 = conv_kernel.NormEpilogue(gamma.double(), 0.0, 96**0.5, pre_bias=pre.double())
    want = F.conv3d(x, w64, None, 1, (0, 1, 1)) + pre.double().reshape(1, -1, 1, 1, 1)
    want = F.silu(F.normalize(want, dim=1) * 96**0.5 * gamma.double().reshape(1, -1, 1, 1, 1))
    for settings in (dict(), dict(triton_convs=False)):  # fp64: no plan; triton_convs off
        out = torch.full((1, 96, 4, 3, 8), 7.0, dtype=torch.float64)[:, :, 2:]
        with tier.active(tier.FastPlan(**settings)):
            got = tier.conv_with_bias(F.conv3d, x, w64, None, 1, (0, 1, 1), 1, 1, norm=norm64, out=out)
        assert got is out and torch.allclose(out, want, rtol=1e-6, atol=1e-6)  # (the eager norm: fp32)
    assert len(seen) == calls


@pytest.fixture
def hopper(monkeypatch):
    # meta tensors stand in for CUDA ones on a Hopper GPU, with a Triton whose Gluon compiles box_conv
    monkeypatch.setattr(conv_kernel, "runs_on", lambda x: True)
    monkeypatch.setattr(box_conv, "_on_hopper", lambda x: True)
    monkeypatch.setattr(box_conv, "available", lambda: True)
    monkeypatch.setattr(box_conv, "ROUTED", True)


def test_the_route_leaves_the_box_kernel_out_while_it_is_not_routed(hopper, monkeypatch):
    # box_conv.ROUTED off (its race under a second process on the GPU): on Hopper with a Gluon that
    # compiles it, Wan's 96- and 192-channel convolutions and its head go to the Triton kernel or cuDNN
    monkeypatch.setattr(box_conv, "ROUTED", False)
    for cout, cin in ((96, 96), (192, 192), (3, 96)):
        assert not box_conv.runs(_shape_x((1, cin, 6, 720, 1280)), _shape_w(cout, cin))
    how = conv_kernel.plan(_shape_x((1, 96, 6, 720, 1280)), _shape_w(96, 96), 1, (0, 1, 1), 1, 1)
    assert how is not None and not how.box
    assert conv_kernel.plan(_shape_x((1, 96, 6, 720, 1280)), _shape_w(3, 96), 1, (0, 1, 1), 1, 1) is None
    assert conv_kernel.wants_zero_columns(_shape_x((1, 96, 6, 4, 832)), _shape_w(96, 96), 832)


@pytest.mark.parametrize(
    "x, padding",
    [
        (_shape_x((1, 96, 6, 720, 1280)), (0, 1, 1)),  # Wan 2.1 720p, one GPU
        (_shape_x((1, 96, 6, 362, 1280)), (0, 0, 1)),  # sharded by height
        (_shape_x((1, 96, 6, 720, 642)), (0, 1, 0)),  # sharded by width
        (_shape_x((1, 96, 6, 480, 832)), (0, 1, 1)),  # 480p: rows no row tile fits, padded
        (_shape_x((1, 96, 6, 242, 832)), (0, 0, 1)),  # 480p by height
        (_shape_x((1, 96, 6, 480, 834)), (0, 1, 0)),  # a buffer that holds zero columns
    ],
)
def test_plan_takes_the_box_kernel_for_96_channels_on_hopper(hopper, x, padding):
    how = conv_kernel.plan(x, _shape_w(96, 96), 1, padding, 1, 1)
    assert how is not None and how.box
    assert conv_kernel.adds_in_epilogue(how) and not conv_kernel.norms_in_epilogue(how)  # (measured)


@pytest.mark.parametrize(
    "x, padding",
    [
        (_shape_x((1, 192, 6, 360, 640)), (0, 1, 1)),  # Wan 2.1 720p's half resolution, one GPU
        (_shape_x((1, 192, 6, 182, 640)), (0, 0, 1)),  # sharded by height
        (_shape_x((1, 192, 6, 360, 322)), (0, 1, 0)),  # sharded by width
        (_shape_x((1, 192, 6, 240, 416)), (0, 1, 1)),  # 480p: rows no row tile of the Triton kernel fits
    ],
)
def test_plan_takes_the_box_kernel_for_192_channels_on_hopper(hopper, x, padding):
    how = conv_kernel.plan(x, _shape_w(192, 192), 1, padding, 1, 1)
    assert how is not None and how.box
    assert box_conv.PLANS[192].block_n + box_conv.PLANS[192].block_n2 == 192  # one channel tile: all of them


@pytest.mark.parametrize(
    "x, padding", [(_shape_x((1, 96, 6, 720, 1280)), (0, 1, 1)), (_shape_x((1, 96, 6, 362, 1280)), (0, 0, 1))]
)
def test_plan_takes_the_box_kernel_for_the_head(hopper, monkeypatch, x, padding):
    # Wan's 96 -> 3 head: box_conv's one accumulator on Hopper (the Triton kernel's TMA rows of 3
    # channels are not 16-byte aligned: cuDNN elsewhere)
    how = conv_kernel.plan(x, _shape_w(3, 96), 1, padding, 1, 1)
    assert how is not None and how.box and box_conv.PLANS[3].block_n2 == 0
    monkeypatch.setattr(box_conv, "available", lambda: False)
    assert conv_kernel.plan(x, _shape_w(3, 96), 1, padding, 1, 1) is None


def test_plan_keeps_the_triton_kernel_elsewhere(hopper, monkeypatch):
    # 96 and 192 channels where box_conv cannot run: the Triton kernel where its tiles fit, cuDNN
    # where they do not; 384 channels (slower than cuDNN in box_conv's tilings): cuDNN
    assert conv_kernel.plan(_shape_x((1, 384, 4, 180, 320)), _shape_w(384, 384), 1, (0, 1, 1), 1, 1) is None
    assert not box_conv.runs(_shape_x((1, 384, 4, 180, 320)), _shape_w(384, 384))
    assert conv_kernel.plan(_shape_x((1, 96, 6, 720, 1280)), _shape_w(96, 96, (1, 3, 3)), 1, (0, 1, 1), 1, 1) is None
    for off in ("available", "_on_hopper"):
        with monkeypatch.context() as m:
            m.setattr(box_conv, off, lambda *a: False)
            how = conv_kernel.plan(_shape_x((1, 96, 6, 720, 1280)), _shape_w(96, 96), 1, (0, 1, 1), 1, 1)
            assert how is not None and not how.box
            assert conv_kernel.plan(_shape_x((1, 96, 6, 480, 832)), _shape_w(96, 96), 1, (0, 1, 1), 1, 1) is None
            how = conv_kernel.plan(_shape_x((1, 192, 6, 360, 640)), _shape_w(192, 192), 1, (0, 1, 1), 1, 1)
            assert how is not None and not how.box
    x = _shape_x((1, 96, 6, 720, 1280))
    assert not box_conv.runs(x.float(), _shape_w(96, 96, dtype=torch.float32))
    assert not box_conv.runs(_shape_x((1, 16, 6, 720, 1280)), _shape_w(96, 16))  # 16 input channels: no step of 32


def test_no_zero_columns_where_the_box_kernel_runs(hopper, monkeypatch):
    # box_conv takes rows of any width (the box's zero fill pads them): no zero columns at 96 or 192
    # channels; without it the Triton kernel's wrapping tiles want them
    assert not conv_kernel.wants_zero_columns(_shape_x((1, 96, 6, 4, 832)), _shape_w(96, 96), 832)
    assert not conv_kernel.wants_zero_columns(_shape_x((1, 192, 6, 4, 416)), _shape_w(192, 192), 416)
    monkeypatch.setattr(box_conv, "available", lambda: False)
    assert conv_kernel.wants_zero_columns(_shape_x((1, 96, 6, 4, 832)), _shape_w(96, 96), 832)
    assert conv_kernel.wants_zero_columns(_shape_x((1, 192, 6, 4, 416)), _shape_w(192, 192), 416)


def test_conv3d_hands_a_box_plan_to_box_conv(monkeypatch):
    # conv_kernel.conv3d with a box plan: the output made or checked as for the Triton kernel, then
    # box_conv.conv3d with the padding, the weight in its layout and the epilogue
    calls = []
    monkeypatch.setattr(box_conv, "conv3d", lambda *a, **k: calls.append((a, k)) or a[4])
    how = conv_kernel.TILES[96]._replace(box=True)
    x = torch.randn(1, 96, 4, 5, 7).to(torch.float16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(96, 96, 3, 3, 3).to(torch.float16)
    y = conv_kernel.conv3d(x, w, None, (0, 1, 1), how)
    assert y.shape == (1, 96, 2, 5, 7) and y.is_contiguous(memory_format=torch.channels_last_3d)
    ((args, _),) = calls
    assert args[3] == (0, 1, 1) and args[4] is y and torch.equal(args[5], box_conv.box_weight_of(w)) and not args[6]
    assert args[5].shape == (96, 27 * 96) and torch.equal(args[5][5, 96 * 13 + 7], w[5, 7, 1, 1, 1])
    residual = torch.randn(1, 96, 2, 5, 5).to(torch.float16).contiguous(memory_format=torch.channels_last_3d)
    assert conv_kernel.conv3d(x, w, None, (0, 1, 0), how, add_to=residual) is residual and calls[-1][0][6]
    gamma = torch.ones(96, dtype=torch.float16)
    out = torch.empty(1, 96, 2, 5, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
    conv_kernel.conv3d(x, w, None, (0, 1, 1), how, norm=conv_kernel.NormEpilogue(gamma, 0.0, 2.0), out=out)
    norm = calls[-1][0][7]
    assert norm.bias is None and norm.gamma is gamma and norm.scale == 2.0
    with pytest.raises(ValueError, match="bias is a tensor or 0"):
        conv_kernel.conv3d(x, w, None, (0, 1, 1), how, norm=conv_kernel.NormEpilogue(gamma, 0.5, 2.0), out=out)


def test_conv3d_rejects_a_weight_in_the_other_kernels_layout(monkeypatch):
    # box_conv's weight layout (Cout, 27 Cin) is the transpose of the Triton kernel's: a prepared
    # weight in the wrong one is refused, not read as the right one
    monkeypatch.setattr(box_conv, "conv3d", lambda *a, **k: a[4])
    x = torch.randn(1, 96, 4, 5, 7).to(torch.float16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(96, 96, 3, 3, 3).to(torch.float16)
    box, triton_plan = conv_kernel.TILES[96]._replace(box=True), conv_kernel.TILES[96]
    with pytest.raises(ValueError, match="kernel_weight"):
        conv_kernel.conv3d(x, w, None, (0, 1, 1), box, conv_kernel.gemm_weight_of(w))
    with pytest.raises(ValueError, match="kernel_weight"):
        conv_kernel.conv3d(x, w, None, (0, 1, 1), triton_plan, box_conv.box_weight_of(w))
    conv_kernel.conv3d(x, w, None, (0, 1, 1), box, conv_kernel.cached_weight_for(box, w))  # the right one: taken


def _box_cin(cout: int) -> int:
    """The input channels of Wan's layer with `cout` output channels (the head: 96 -> 3)."""
    return 96 if cout == 3 else cout


@pytest.mark.parametrize(
    "cout, epilogue, how",
    [
        (96, None, None),
        (96, "add", None),
        (96, "norm", None),
        (192, None, None),
        (192, "add", None),
        (192, "norm", None),
        (192, None, box_conv.PLAN),
        (256, "add", box_conv.BoxPlan(block_n=64, block_n2=64, stages=3)),
        (3, None, None),
        (96, "add", box_conv.BoxPlan()),
        (96, None, box_conv.PLAN._replace(a_regs=True)),
    ],
)
def test_box_kernel_compiles_for_hopper(cout, epilogue, how):
    # the warp-specialised Gluon kernel, compiled for sm_90 with Triton's own ptxas (no GPU): TMA
    # copies, warp-group multiplies, the producer warp's register budget, and the shared memory of
    # its slots within the 227 KB a program may hold; 96 and 192 channels with each epilogue in
    # PLANS' tilings, and channel tiles of a patch spread over programs (benchmarks/conv_kernel.py
    # --box-sweep's other tilings)
    pytest.importorskip("triton")
    assert box_conv.available()
    how = how or box_conv.PLANS[cout]
    cin = _box_cin(cout)
    compiled = box_conv.compile_for_hopper(how, cin=cin, cout=cout, add=epilogue == "add", norm=epilogue == "norm")
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
    assert compiled.metadata.shared <= 227 * 1024
    # the output patch leaves by TMA stores where the plan asks for them (not with the norm epilogue)
    assert ("cp.async.bulk.tensor.4d.global.shared" in ptx) == (how.tma_out and epilogue != "norm")


@pytest.mark.parametrize("cout", [96, 192, 3])
def test_box_kernel_compiles_reading_the_causal_cache(cout):
    # conv3d's `causal`: the producer copies a box of a frame before the sample's first from the
    # cache's descriptor and the others from the input's (two more box copies in its code), in
    # PLANS' tilings and their shared memory; the multiplies are not serialised (ptxas note C7514)
    pytest.importorskip("triton")
    from triton.backends.nvidia.compiler import get_ptxas

    how, cin, add = box_conv.PLANS[cout], _box_cin(cout), cout != 3
    plain = box_conv.compile_for_hopper(how, cin=cin, cout=cout, add=add)
    causal = box_conv.compile_for_hopper(how, cin=cin, cout=cout, add=add, causal=True)
    # a box copy into shared memory: `.shared::cluster` from Triton 3.6, `.shared::cta` from 3.7
    load = re.compile(r"cp\.async\.bulk\.tensor\.4d\.shared::(?:cluster|cta)\.global")
    assert len(load.findall(causal.asm["ptx"])) == len(load.findall(plain.asm["ptx"])) + 2
    assert causal.metadata.shared <= 227 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(causal.asm["ptx"])
        notes = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert notes.returncode == 0 and "C7514" not in notes.stderr, notes.stderr[-500:]


@pytest.mark.parametrize("cout", [96, 3])
def test_box_kernel_fences_its_barriers_after_init_and_invalidates_them(cout):
    # PTX's rules for mbarriers: the initialisation is made visible to the async proxy (the TMA
    # copies that complete the barriers' transactions) by a proxy fence before the partitions start,
    # and every barrier is invalidated before its shared memory serves anything else (the next
    # program on the multiprocessor, of this kernel or another); in PLANS' tilings (3 and 4 slots)
    pytest.importorskip("triton")
    how = box_conv.PLANS[cout]
    lines = box_conv.compile_for_hopper(how, _box_cin(cout), cout, add=cout != 3, causal=True).asm["ptx"].splitlines()
    inits = [i for i, line in enumerate(lines) if "mbarrier.init" in line]
    assert len(inits) == 2 * how.stages + 1  # ready and empty per slot, and the residual's
    start = next(i for i in range(inits[-1], len(lines)) if re.search(r"\bbarrier\.sync\s+1;", lines[i]))
    assert any("fence.proxy.async" in line for line in lines[inits[-1] : start])
    assert sum("mbarrier.inval" in line for line in lines) == len(inits)


def _sass(compiled) -> list[str]:
    """The kernel's SASS instructions, in order (Triton's own ptxas and cuobjdump; no GPU)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(compiled.asm["ptx"])
        subprocess.run([ptxas, "--gpu-name=sm_90a", src, "-o", cubin], check=True, capture_output=True, timeout=120)
        dump = subprocess.run(
            [os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", cubin],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    return [
        line.split("*/", 1)[1].split(";")[0].strip()
        for line in dump.splitlines()
        if line.strip().startswith("/*") and "*/" in line
    ]


@pytest.mark.parametrize("cout", [96, 192])
def test_box_kernel_rows_in_registers_wait_for_their_multiplies(cout):
    # with the input rows in registers (a_regs), a warp-group multiply reads its registers while it
    # runs: each view's rows may be loaded again only once the previous step's multiplies of that
    # view are done, so every register load of the main loop follows a wait on the multiplies (PTX
    # makes rewriting them earlier undefined; ptxas does not insert the wait itself)
    pytest.importorskip("triton")
    how = box_conv.PLANS[cout]._replace(a_regs=True)
    sass = _sass(box_conv.compile_for_hopper(how, _box_cin(cout), cout, add=True))
    last = max(i for i, ins in enumerate(sass) if "HGMMA" in ins)
    loads = [i for i in range(last) if sass[i].startswith("LDSM")]  # (the epilogue's come after)
    assert len(loads) >= 3  # (the three views' rows)
    for i in loads:  # a wait between the multiply before it (or the loop's start) and the load
        before = [j for j in range(i) if "HGMMA" in sass[j]]
        since = sass[before[-1] if before else 0 : i]
        assert any("WARPGROUP.DEPBAR" in ins for ins in since), (i, sass[i])


@pytest.mark.parametrize("cout", [96, 192, 3])
def test_box_kernel_multiplies_are_not_serialised(cout):
    # ptxas serialises every warp-group multiply of a kernel whose epilogue reads the accumulators'
    # registers in place (its note C7514: before the epilogue moved them, every convolution without a
    # bias, the ones whose bias the next norm adds); none of the epilogues may do that
    pytest.importorskip("triton")
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    cin = _box_cin(cout)
    for bias, add, norm in [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (True, True, False),
        (False, False, True),
    ]:
        ptx = box_conv.compile_for_hopper(box_conv.PLANS[cout], cin, cout, add=add, norm=norm, bias=bias).asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            notes = subprocess.run(
                [ptxas, "-v", "--gpu-name=sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
                capture_output=True,
                text=True,
                timeout=120,
            )
        assert notes.returncode == 0 and "Used" in notes.stderr, notes.stderr[-500:]
        assert "C7514" not in notes.stderr, (bias, add, norm)


def test_box_kernel_unavailable_warns_once(monkeypatch):
    # a Triton whose Gluon does not compile the kernel: not available, one warning, the Triton
    # kernel's plans instead
    def fails(*a, **k):
        raise RuntimeError("error encountered during parsing")

    monkeypatch.setattr(box_conv, "compile_for_hopper", fails)
    box_conv._compiles.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="does not compile with Triton"):
            assert not box_conv.available()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not box_conv.available()  # decided once per process
    finally:
        box_conv._compiles.cache_clear()


@pytest.mark.parametrize("tma_out", [True, False])
def test_box_conv_steps_samples_of_one_frame_by_their_own_stride(monkeypatch, tma_out):
    # an output of one frame per sample whose frame axis has another stride (an upsampler's output
    # after one frame, seen as (N, C, 1, H, W)): the kernel steps from sample to sample by the sample
    # stride, in its store arguments and in the TMA stores' descriptor (the launch is recorded, not run)
    launched = _recorded_box_launches(monkeypatch)
    x = torch.randn(2, 96, 3, 16, 16).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(96, 96, 3, 3, 3).to(torch.bfloat16)
    out = torch.empty(2, 96, 16, 16, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    out = out.unsqueeze(1).transpose(1, 2)  # (2, 96, 1, 16, 16), frame stride 96
    assert out.stride(2) == 96 and conv_kernel.takes_out(out, out.shape, out.dtype)
    box_conv.conv3d(x, w, None, (0, 1, 1), out, box_conv.box_weight_of(w), how=box_conv.PLAN._replace(tma_out=tma_out))
    (args,) = launched
    assert (args["SF"], args["SR"], args["SC"]) == (out.stride(0), out.stride(3), out.stride(4))  # the store's strides
    if tma_out:
        assert list(args["od"].strides)[0] == out.stride(0)  # the output's descriptor


def _recorded_box_launches(monkeypatch) -> list[dict]:
    """box_conv's kernel launches recorded (by argument name), not run; 4 SMs."""
    names, launched = box_conv.box_conv_kernel.arg_names, []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append({**dict(zip(names, args)), **kw})

    monkeypatch.setattr(box_conv, "box_conv_kernel", Kernel())
    monkeypatch.setattr(box_conv, "_multiprocessors", lambda device: 4)
    return launched


@pytest.mark.parametrize("frames", [2, 1, 0])
def test_box_conv_reads_the_time_padding_from_the_cache(monkeypatch, frames):
    # causal: the input holds only the new frames and the kernel reads the two frames before each
    # sample's first from the cache (its last `frames`; zeros before them): a descriptor of the
    # cache's frames, the count of them, as many output frames as new ones (the launch is recorded)
    launched = _recorded_box_launches(monkeypatch)
    x = torch.randn(2, 96, 3, 16, 24).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(96, 96, 3, 3, 3).to(torch.bfloat16)
    cache = (
        torch.randn(2, 96, frames, 16, 24).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
        if frames
        else None
    )
    out = torch.empty(2, 96, 3, 16, 24, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    box_conv.conv3d(x, w, None, (0, 1, 1), out, box_conv.box_weight_of(w), causal=True, cache=cache)
    (args,) = launched
    assert args["CAUSAL"] and args["Tc"] == frames and args["Tin"] == args["Tout"] == 3
    if frames:
        assert list(args["cd"].shape) == list(args["cd2"].shape) == [2 * frames, 16, 24, 96]
        assert args["cd"].base.data_ptr() == cache.data_ptr() and list(args["cd"].block_shape) == [1, 16, 16, 32]
        assert list(args["cd2"].block_shape) == [1, 2, 16, 32]
    else:  # (the input's descriptors stand in, read only past their frames: the zero fill)
        assert args["cd"] is args["xd"] and args["cd2"] is args["xd2"]
    box_conv.conv3d(x, w, None, (0, 1, 1), out[:, :, :1], box_conv.box_weight_of(w))
    assert not launched[-1]["CAUSAL"] and launched[-1]["Tin"] == 3 and launched[-1]["Tout"] == 1


def test_box_conv_refuses_a_norm_over_several_channel_tiles():
    # the norm in the epilogue needs every channel of a voxel in one program: a tiling that spreads
    # them over channel tiles is refused before anything is launched
    x = torch.empty(1, 192, 4, 8, 8, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.empty(192, 192, 3, 3, 3, dtype=torch.bfloat16)
    out = torch.empty(1, 192, 2, 8, 8, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    norm = conv_kernel.NormEpilogue(torch.ones(192, dtype=torch.bfloat16), None, 1.0)
    with pytest.raises(ValueError, match="one tile holds every channel"):
        box_conv.conv3d(x, w, None, (0, 1, 1), out, box_conv.box_weight_of(w), norm=norm, how=box_conv.PLAN)
