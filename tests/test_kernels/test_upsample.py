"""The upsamplers' 3x3 convolution by phases (upsample.py) against the convolution of the upsampled
frames, alone and inside the decoders, one rank and sharded."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from .. import interpreter
from ..dist_harness import run_ranks
from ..models import build, latent
from ..parity import CPU_FP32 as TOL_CPU_FP32


def _upsampled_conv(x, weight, bias):
    return F.conv2d(F.interpolate(x, scale_factor=2, mode="nearest"), weight, bias, padding=1)


@pytest.mark.parametrize("rows, cols", [(3, 5), (4, 4), (1, 7), (6, 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_phases_give_the_convolution_of_the_upsampled_frames(rows, cols, with_bias):
    from vaeshard.kernels import phases as upsample

    g = torch.Generator().manual_seed(rows * 10 + cols)
    x = torch.randn(3, 8, rows, cols, generator=g, dtype=torch.float64)
    weight = torch.randn(6, 8, 3, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(6, generator=g, dtype=torch.float64) if with_bias else None
    want = _upsampled_conv(x, weight, bias)
    got = upsample.conv2d_by_phases(x, weight, bias)
    assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    # into frames of a larger tensor, as the decoder's parts write theirs
    out = torch.full((5, 6, 2 * rows, 2 * cols), float("nan"), dtype=torch.float64).contiguous(
        memory_format=torch.channels_last
    )
    assert upsample.conv2d_by_phases(x, weight, bias, out=out[1:4]).data_ptr() == out[1:4].data_ptr()
    assert (out[1:4] - want).abs().max() <= 1e-12 * want.abs().max() and out[0].isnan().all() and out[4].isnan().all()


@pytest.mark.parametrize("axis", [2, 3])
def test_phases_take_halo_rows_for_the_padding(axis):
    # a shard's source with one row (column) of its neighbours a side: the shard's part of the whole
    # frame's convolution; at a global edge the halo is zeros, the padding's value
    from vaeshard.kernels import phases as upsample

    g = torch.Generator().manual_seed(axis)
    whole = torch.randn(2, 8, 9, 10, generator=g, dtype=torch.float64)
    weight = torch.randn(4, 8, 3, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(4, generator=g, dtype=torch.float64)
    want = _upsampled_conv(whole, weight, bias)
    halo = (1, 0) if axis == 2 else (0, 1)
    padded = F.pad(whole, (1, 1, 0, 0) if axis == 3 else (0, 0, 1, 1))  # zero rows at the global edges
    for start, size in ((0, 4), (4, 3), (7, 2)):  # first, middle and last shard
        src = padded.narrow(axis, start, size + 2)
        got = upsample.conv2d_by_phases(src, weight, bias, halo)
        part = want.narrow(axis, 2 * start, 2 * size)
        assert got.shape == part.shape
        assert (got - part).abs().max() <= 1e-12 * want.abs().max()


def test_phases_round_like_the_convolution_they_replace():
    # in bf16 and fp32 the phases' weights are rounded sums of taps: their error against the fp64
    # result is of the size of the direct convolution's own (CPU arithmetic, seeded)
    from vaeshard.kernels import phases as upsample

    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 32, 6, 9, generator=g, dtype=torch.float64)
    weight = torch.randn(16, 32, 3, 3, generator=g, dtype=torch.float64) / 17
    bias = torch.randn(16, generator=g, dtype=torch.float64)
    want = _upsampled_conv(x, weight, bias)
    for dtype, scale in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
        direct = _upsampled_conv(x.to(dtype), weight.to(dtype), bias.to(dtype)).double()
        phased = upsample.conv2d_by_phases(x.to(dtype), weight.to(dtype), bias.to(dtype)).double()
        err_direct, err_phased = (direct - want).abs().max().item(), (phased - want).abs().max().item()
        assert err_phased <= max(2 * err_direct, scale * want.abs().max().item()), (dtype, err_phased, err_direct)
        assert err_phased > 0  # a real bf16/fp32 computation, not the fp64 one


def test_takes_only_3x3_stride_1_padding_1():
    from vaeshard.kernels import phases as upsample

    assert upsample.takes(torch.nn.Conv2d(4, 4, 3, padding=1))
    assert not upsample.takes(torch.nn.Conv2d(4, 4, 3, padding=0))
    assert not upsample.takes(torch.nn.Conv2d(4, 4, 1))
    assert not upsample.takes(torch.nn.Conv2d(4, 4, 3, padding=1, stride=2))
    assert not upsample.takes(torch.nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"))
    assert not upsample.takes(torch.nn.Conv2d(4, 4, 3, padding=1, groups=2))
    with pytest.raises(ValueError, match="3x3 weight"):
        upsample.conv2d_by_phases(torch.zeros(1, 4, 2, 2), torch.zeros(4, 4, 1, 1), None)


def test_phase_weight_is_kept_and_remade_when_the_weight_changes():
    import vaeshard
    from vaeshard.kernels import phases as upsample
    from vaeshard.kernels import weights

    conv = torch.nn.Conv2d(4, 6, 3, padding=1)
    first = upsample.cached_phase_weight(conv.weight)
    assert upsample.cached_phase_weight(conv.weight) is first
    with torch.no_grad():
        conv.weight.mul_(2)
    second = upsample.cached_phase_weight(conv.weight)
    assert second is not first and torch.allclose(second, 2 * first)
    vae = vaeshard.parallelize(build("wan21"))
    vae.decode(latent((1, 4, 2, 3, 3)))
    ups = [m.resample[1] for m in vae.modules() if hasattr(m, "resample") and m.mode.startswith("upsample")]
    assert ups and all(weights.holds(c.weight, "phases") for c in ups)
    vaeshard.unparallelize(vae)
    assert not any(weights.holds(c.weight, "phases") for c in ups)


def _recorded_phases(upsample):
    """The (source frames, halo) of each conv2d_by_phases call while the context is open."""
    calls, real = [], upsample.conv2d_by_phases

    def recording(src, weight, bias, halo=(0, 0), *args, **kwargs):
        calls.append((tuple(src.shape), halo))
        return real(src, weight, bias, halo, *args, **kwargs)

    return calls, real, recording


@pytest.mark.parametrize("model", ["wan21", "wan22", "qwenimage"])
@pytest.mark.parametrize("settings", [{}, {"max_layer_frames": 2}, {"frames_per_step": 2}])
def test_decoders_upsample_by_phases(monkeypatch, model, settings):
    import vaeshard
    from vaeshard.kernels import phases as upsample
    from vaeshard.layers import tier

    vae = build(model)
    z = latent((1, 4, 4, 2, 3))  # four frames (calls of 1, then 1 or 2); the phases do not depend on the size
    with torch.no_grad():
        ref = vae.decode(z).sample
    vaeshard.parallelize(vae, fast=vaeshard.FastOptions(**settings))
    calls, _, recording = _recorded_phases(upsample)
    monkeypatch.setattr(upsample, "conv2d_by_phases", recording)
    out = vae.decode(z).sample
    # every upsampler on every decoder call: the first call's frame alone, then the time
    # convolution's channel halves as two frames each (2 and 4 frames after one and two of them)
    frames = {shape[0] for shape, _ in calls}
    assert calls and all(halo == (0, 0) for _, halo in calls) and {1, 2} <= frames, calls
    assert (out - ref).abs().max() <= TOL_CPU_FP32
    monkeypatch.setattr(tier, "upsample_by_phases", lambda x: False)  # the upsampled frames, convolved
    before = len(calls)
    upsampled = vae.decode(z).sample
    assert len(calls) == before and (upsampled - ref).abs().max() <= TOL_CPU_FP32
    assert not torch.equal(out, upsampled)  # the phases' sums are other sums


def _sharded_phases(rank, world, model, shape, mode):
    import vaeshard
    from vaeshard.kernels import phases as upsample

    vae = build(model)
    z = latent(shape)
    with torch.no_grad():
        ref = vae.decode(z).sample
    vaeshard.parallelize(vae, mode=mode)
    calls, real, recording = _recorded_phases(upsample)
    upsample.conv2d_by_phases = recording  # (this rank process only)
    try:
        out = vae.decode(z).sample
    finally:
        upsample.conv2d_by_phases = real
    return calls, (out - ref).abs().max().item()


@pytest.mark.parametrize(
    "model,shape,mode,world,halo",
    [
        ("wan21", (1, 4, 3, 7, 6), "spatial_shard_height", 2, (1, 0)),
        ("wan22", (1, 4, 3, 5, 7), "spatial_shard_width", 3, (0, 1)),
    ],
)
def test_upsampling_by_phases_sharded(model, shape, mode, world, halo):
    for calls, err in run_ranks(_sharded_phases, world, model, shape, mode):
        assert calls and all(h == halo for _, h in calls), calls
        assert err <= TOL_CPU_FP32


INTERLEAVE_CHECK = textwrap.dedent(
    """
    import torch
    from vaeshard.kernels import phases as upsample
    assert upsample.triton is not None
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.float32):
        for cout, rows, cols in ((24, 5, 7), (130, 3, 4)):
            y = torch.randn(3, 4 * cout, rows + 1, cols + 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
            bias = torch.randn(cout, dtype=dtype)
            for b in (bias, None):
                out = torch.full((3, cout, 2 * rows, 2 * cols), float("nan"), dtype=dtype).contiguous(
                    memory_format=torch.channels_last)
                upsample.interleave_phases(y, b, out)  # the kernel, in the interpreter
                runs_on, upsample.runs_on = upsample.runs_on, lambda x: False
                want = upsample.interleave_phases(y, b, torch.empty_like(out))  # PyTorch's strided adds
                upsample.runs_on = runs_on
                assert torch.equal(out, want), (dtype, cout, b is None)
                assert not torch.equal(out[:, :, 0::2, 0::2], out[:, :, 1::2, 1::2])  # four phases, not one
    print("interleave ok")
    """
)


ADDEND_CHECK = textwrap.dedent(
    """
    import torch
    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import tier
    from vaeshard.kernels import phases as upsample
    torch.manual_seed(0)
    # the shortcut added as the phases are interleaved: the bits of the interleave, then
    # norm_kernels.add_duplicated_ (itself checked against diffusers' DupUp3D), at Wan 2.2's two kinds of up
    # block (time and space, 8 repeats; space only, 2 repeats), two samples, the output's frames
    # seen from an offset (a part of them, as max_layer_frames gives)
    for dtype in (torch.float16, torch.float32):
        for cin, cout, ft, repeats in ((16, 16, 2, 8), (16, 8, 1, 2)):
            n, t, h, w = 2, 2, 3, 5
            src = torch.randn(n, cin, t, h, w, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
            y = torch.randn(n * t * ft, 4 * cout, h + 1, w + 1, dtype=dtype)
            y = y.contiguous(memory_format=torch.channels_last)
            bias = torch.randn(cout, dtype=dtype)
            out = torch.empty(n * t * ft, cout, 2 * h, 2 * w, dtype=dtype).contiguous(memory_format=torch.channels_last)
            upsample.interleave_phases(y, bias, out)
            want = out.view(n, t * ft, cout, 2 * h, 2 * w).transpose(1, 2)
            assert norm_kernels.add_duplicated_(want, src, ft, 2, repeats)
            addend = upsample.Addend(src, ft, 2, repeats, frames=t * ft)
            assert upsample.takes_addend(out, addend)
            got = upsample.interleave_phases(y, bias, torch.empty_like(out), addend)
            assert torch.equal(got.view(n, t * ft, cout, 2 * h, 2 * w).transpose(1, 2), want), (dtype, cin, cout)
            part = torch.empty_like(out)[3:]
            upsample.interleave_phases(y[3:], bias, part, addend._replace(first=3))
            assert torch.equal(part, got[3:]), ("part", dtype, cin, cout)
            wrong = upsample.interleave_phases(y, bias, torch.empty_like(out), addend._replace(repeats=repeats // 2))
            assert not torch.equal(wrong, got)  # the channel map matters
    print("addend ok")
    """
)

DECODE_WITH_ADDEND = textwrap.dedent(
    """
    import torch
    import vaeshard
    from tests import interpreter
    interpreter.for_model_decodes()
    from tests.models import build, latent
    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import tier
    from vaeshard.kernels import phases as upsample
    from vaeshard.families.wan import blocks as wan_blocks
    added = []
    interleave = upsample.interleave_phases
    upsample.interleave_phases = lambda y, b, out, addend=None: (
        added.append(addend is not None) or interleave(y, b, out, addend))
    vae = build("wan22")
    z = latent((2, 4, 3, 2, 3))
    with torch.no_grad():
        ref = vae.decode(z).sample
    for settings in ({}, {"max_layer_frames": 2}):
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(**settings))
        added.clear()
        fused = vae.decode(z).sample
        assert any(added), added  # the up blocks' shortcut, after the first decoder call
        dup_addend, wan_blocks._dup_addend = wan_blocks._dup_addend, lambda *a: None
        added.clear()
        apart = vae.decode(z).sample
        wan_blocks._dup_addend = dup_addend
        assert not any(added)
        assert torch.equal(fused, apart), settings
        assert (fused - ref).abs().max() <= 1e-5
    print("decode ok")
    """
)


INTERLEAVE_JOB = interpreter.script("upsample-interleave", INTERLEAVE_CHECK)
ADDEND_JOB = interpreter.script("upsample-addend", ADDEND_CHECK)
DECODE_JOB = interpreter.script("upsample-decode", DECODE_WITH_ADDEND)


@pytest.mark.background(ADDEND_JOB, DECODE_JOB)
def test_interleave_kernel_adds_the_duplicating_shortcut():
    pytest.importorskip("triton")
    run = interpreter.result(ADDEND_JOB, timeout=400)
    assert run.returncode == 0 and "addend ok" in run.stdout, run.stdout + run.stderr
    run = interpreter.result(DECODE_JOB, timeout=400)
    assert run.returncode == 0 and "decode ok" in run.stdout, run.stdout + run.stderr


def test_addend_only_where_the_triton_pass_runs():
    from vaeshard.kernels import phases as upsample

    src = torch.zeros(1, 8, 2, 3, 3).contiguous(memory_format=torch.channels_last_3d)
    like = torch.zeros(4, 8, 6, 6)
    addend = upsample.Addend(src, 2, 2, 8, frames=4)
    assert not upsample.takes_addend(like, addend)  # CPU without the interpreter: the block adds it after
    with pytest.raises(ValueError, match="addend"):
        upsample.interleave_phases(torch.zeros(4, 32, 4, 4), None, torch.zeros(4, 8, 6, 6), addend)


@pytest.mark.background(INTERLEAVE_JOB)
def test_interleave_kernel_through_the_interpreter():
    pytest.importorskip("triton")
    run = interpreter.result(INTERLEAVE_JOB, timeout=400)
    assert run.returncode == 0 and "interleave ok" in run.stdout, run.stdout + run.stderr


def test_interleave_kernel_compiles_for_hopper():
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from vaeshard.kernels import phases as upsample

    kernel = upsample._interleave_kernel
    names = kernel.arg_names
    for has_bias, add in ((True, False), (False, False), (True, True)):
        constants = dict(HAS_BIAS=has_bias, ADD=add, FT=2, FS=2, PER=1, REPEATS=8, BLOCK_V=32, BLOCK_C=128)
        types = {n: "*bf16" if n.endswith("_ptr") else "constexpr" if n in constants else "i64" for n in names}
        source = ASTSource(kernel, types, constexprs={(names.index(c),): v for c, v in constants.items()})
        assert len(triton_compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]) > 0
