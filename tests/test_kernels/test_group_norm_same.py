"""kernels/group_norm_same.py, PyTorch's CUDA GroupNorm computed in PyTorch's order, in Triton's
interpreter against an emulation of ATen's kernel written here from its source (one float32 rounding
per operation; nvcc's fused multiply-adds as the interpreter computes them): each of the L = 512 (or 32) lanes'
Welford chain, the warp shuffle-down trees and the block's combination of the warps. The statistics
must match it bit for bit; a tree in another order must not (the test's own check that the order is
what it sees). On a GPU the same kernels are checked against PyTorch itself (`agrees`, before a
request uses them) and whole decodes against diffusers' by benchmarks/gpu_parity.py."""

from __future__ import annotations

import pytest

from .. import interpreter

VALUES = r"""
import numpy as np
import torch
import torch.nn.functional as F
from vaeshard.kernels import group_norm_same as same, triton_support
assert triton_support.interpreting()
f32 = np.float32


def fma(a, b, c):
    # nvcc's fused multiply-add rounds once; Triton's interpreter computes tl.fma as a * b + c in
    # float32, rounding the product first, and so does this emulation (the single rounding on a GPU is
    # what `agrees` checks there, against PyTorch itself)
    return f32(f32(a * b) + c)


def fold(acc, x):  # WelfordOps::reduce
    mean, m2, n = acc
    nn = f32(n + f32(1))
    delta = f32(x - mean)
    new_mean = f32(mean + f32(delta / nn))
    return new_mean, fma(delta, f32(x - new_mean), m2), nn


def combine(a, b):  # WelfordOps::combine
    if a[2] == 0:
        return b
    if b[2] == 0:
        return a
    delta = f32(b[0] - a[0])
    count = f32(a[2] + b[2])
    nb = f32(b[2] / count)
    return fma(delta, nb, a[0]), fma(f32(f32(delta * delta) * a[2]), nb, f32(a[1] + b[1])), count


def warp_reduce(states, order):  # cuda_utils::WarpReduce: lane i takes lane i + offset
    states = list(states)
    for off in order:
        states = [combine(states[i], states[i + off]) if i + off < 32 else states[i] for i in range(32)]
    return states[0]


def statistics(row, order=(16, 8, 4, 2, 1)):
    L = 512 if len(row) >= 512 else 32
    zero = (f32(0), f32(0), f32(0))
    lanes = []
    for t in range(L):
        acc = zero
        for x in row[t::L]:
            acc = fold(acc, f32(x))
        lanes.append(acc)
    if L == 32:
        final = warp_reduce(lanes, order)
    else:  # cuda_utils::BlockReduce
        warps = [warp_reduce(lanes[w * 32 : (w + 1) * 32], order) for w in range(16)]
        final = warp_reduce(warps + [zero] * 16, order)
    return final[0], f32(final[1] / final[2])


torch.manual_seed(0)
# rows of 1,320 (not a multiple of 512; lanes of 2 and 3 elements, fewer than the 8 a chain loads at
# once), of 35 (PyTorch's 32-thread block) and of 5,000 (10 elements a lane: a second group of 8, loaded
# ahead), 3- to 5-D, one with programs of fewer lanes. The whole norm in every variant on the first,
# with SiLU on the rest.
cases = (((2, 32, 11, 15), 4, 64), ((1, 16, 5, 7), 16, 64), ((1, 8, 2, 25, 50), 2, 64), ((1, 4, 5000), 4, 32))
assert same.WIDTH in (16, 32)  # the default width is among those checked against 8 below
same.WIDTH = 8  # (the interpreter's time grows with the width)
for shape, groups, lanes in cases:
    same.LANES = lanes
    x = torch.randn(*shape) * 3 + 0.5
    eps = 1e-6
    mean, rstd = same.statistics(x, groups, eps)
    rows = x.reshape(shape[0] * groups, -1).numpy()
    for r, row in enumerate(rows):
        m, var = statistics(row)
        assert mean[r].item() == m, (shape, r, mean[r].item(), m)
        # (the interpreter's rsqrt is NumPy's 1 / sqrt; a GPU's is its own approximation, as PyTorch's)
        assert rstd[r].item() == f32(1) / np.sqrt(f32(var + f32(eps))), (shape, r)
    # the other step widths (how many of each chain's elements are loaded ahead; the default among them)
    # fold the same elements in the same order (on the longest rows: several steps of each)
    for width in (16, 32) if shape == cases[-1][0] else ():
        same.WIDTH = width
        other = same.statistics(x, groups, eps)
        assert torch.equal(other[0], mean) and torch.equal(other[1], rstd), (shape, width)
    same.WIDTH = 8
    # a tree in another order gives other means (so the check above sees the order)
    if shape[0] * groups > 4:
        other = [statistics(row, order=(1, 2, 4, 8, 16))[0] for row in rows]
        assert any(o != mean[r].item() for r, o in enumerate(other)), shape
    # the whole norm: statistics folded with weight and bias, one rounding to the dtype, SiLU after it
    w, b = torch.randn(shape[1]), torch.randn(shape[1])
    combos = [(w, b, True)] + ([(w, b, False), (None, None, False), (None, None, True)] if shape == cases[0][0] else [])
    for weight, bias, silu in combos:
        want = F.group_norm(x, groups, weight, bias, eps)
        want = F.silu(want) if silu else want
        got = same.group_norm(x, groups, weight, bias, eps, silu=silu)
        assert got.shape == x.shape and got.dtype == x.dtype
        assert (got - want).abs().max() <= 2e-5, (shape, silu, (got - want).abs().max())
# CogVideoX's conditioning at the latent's rows and columns: each value of scale and shift stands for a
# block of 2 x 4 pixels of x (as nearest interpolation by powers of two repeats it), against PyTorch's
# product and sum with the maps interpolated to x's size
x = torch.randn(1, 8, 3, 6, 12) * 3 + 0.5
w, b = torch.randn(8), torch.randn(8)
scale, shift = torch.randn(1, 8, 3, 3, 3), torch.randn(1, 8, 3, 3, 3)
big = [F.interpolate(t, size=x.shape[2:]) for t in (scale, shift)]
want = F.silu(F.group_norm(x, 2, w, b, 1e-6) * big[0] + big[1])
got = same.group_norm(x, 2, w, b, 1e-6, silu=True, scale=scale, shift=shift)
assert (got - want).abs().max() <= 2e-5, (got - want).abs().max()
assert torch.equal(got, same.group_norm(x, 2, w, b, 1e-6, silu=True, scale=big[0], shift=big[1]))
for bad in (scale[..., :2], scale[:, :, :2], torch.randn(1, 8, 3, 4, 5)):  # not blocks of x
    try:
        same.group_norm(x, 2, w, b, 1e-6, silu=True, scale=bad, shift=bad)
        raise AssertionError(bad.shape)
    except ValueError:
        pass
# a pre_bias (the bias a convolution left out) is x plus it, rounded to x's dtype as PyTorch's bias
# pass rounds it, before the norm: in the statistics and in the apply pass (in fp32: the interpreter
# rounds fp32 to bf16 by truncation, not to nearest as a GPU does, so the bf16 rounding is `agrees`'
# "biased" check on the device)
x = torch.randn(1, 8, 3, 6, 12) * 3 + 0.5
pre = torch.randn(8) * 2
w, b = torch.randn(8), torch.randn(8)
biased = x + pre.reshape(1, -1, 1, 1, 1)
got = same.group_norm(x, 2, w, b, 1e-6, silu=True, pre_bias=pre)
assert torch.equal(got, same.group_norm(biased, 2, w, b, 1e-6, silu=True))
stats = same.statistics(x, 2, 1e-6, pre_bias=pre)
assert all(torch.equal(u, v) for u, v in zip(stats, same.statistics(biased, 2, 1e-6)))
assert (got - F.silu(F.group_norm(biased, 2, w, b, 1e-6))).abs().max() <= 2e-5
for bad in (pre[:4], pre.double()):  # not one value per channel in x's dtype
    try:
        same.group_norm(x, 2, w, b, 1e-6, silu=True, pre_bias=bad)
        raise AssertionError(bad)
    except ValueError:
        pass
# what the kernels take: contiguous maps of fp32, bf16 or fp16 whose channels divide into the groups
x = torch.randn(1, 8, 4, 4)
assert same.takes(x, 4) and same.takes(x.half(), 4)
assert not same.takes(x.contiguous(memory_format=torch.channels_last), 4)
assert not same.takes(x.double(), 4) and not same.takes(x, 3) and not same.takes(x[..., :3], 4)
# CPU tensors are never taken as PyTorch's: its CPU GroupNorm sums in another order
assert not same.agrees(torch.device("cpu"), torch.float32)
print("ok")
"""

# The layers that call the kernels, in a whole decode: AutoencoderKL's default request (diffusers' layers,
# its GroupNorms by these kernels, the resnets' SiLU fused into them and the SiLU module passing the
# result on), CogVideoX's on the CPU (the fast tier without norm_into_conv: its spatial norms'
# GroupNorms) and HunyuanVideo's exact tier (its fast tier counted off as on a GPU where it is slower:
# the resnets' norm + SiLU written into their causal convolutions' channels-first padded inputs, which
# the convolutions pad at the border and convolve as diffusers does), against diffusers' decode. The
# kernels' switch (tuning.GROUP_NORM_SAME_KERNELS) is turned on; their check against PyTorch (`agrees`)
# is for CUDA only, where it compares bits; here it is taken as passed, and the values are compared
# within CPU fp32's tolerance: the interpreter's statistics follow PyTorch's CUDA order, not its CPU one.
MODELS = """
import torch
import vaeshard
from vaeshard import tuning
from vaeshard.fast import producers
from vaeshard.kernels import group_norm_same
from vaeshard.layers import tier
from tests import interpreter
from tests.models import build, latent
from tests.parity import CPU_FP32, assert_close
interpreter.unsanitized()
tuning.GROUP_NORM_SAME_KERNELS = True
tuning.GROUP_NORM_SAME_MIN_ELEMENTS = 0  # (the tests' maps are small)
group_norm_same.agrees = lambda device, dtype, variant="plain": True
group_norm_same.WIDTH = 8  # (the interpreter's time grows with the width; the widths agree: VALUES)
calls = []  # each call's kind: SiLU or not, "biased" (given a pre_bias), "cond" or "blocks" (see below)
pres = []  # whether each call was given a pre_bias (the bias the convolution before the norm left out)
norm = group_norm_same.group_norm


def counted(*args, **kw):
    pres.append(kw.get("pre_bias") is not None)
    if kw.get("scale") is None:  # ("cond": with a scale and a shift; "blocks": at the latent's size)
        calls.append("biased" if pres[-1] else kw.get("silu", False))
    else:
        calls.append("cond" if kw["scale"].shape == args[0].shape else "blocks")
    return norm(*args, **kw)


group_norm_same.group_norm = counted
buffers = []  # the layouts of the produced padded inputs the convolutions ran on
fill = producers.filled
producers.filled = lambda *a, **kw: (lambda b: (b is None or buffers.append(b.is_contiguous()), b)[1])(fill(*a, **kw))
sums = []  # HunyuanVideo's residual adds in its convolutions' bias pass (fast/residual_blocks.py)
add_sum = tier.add_bias_and_residual_
tier.add_bias_and_residual_ = lambda *a, **kw: sums.append(1) or add_sum(*a, **kw)
tuning.NORM_INTO_CONV_ONLY_FAMILIES += ("hunyuanvideo",)
for name, size in (("autoencoder_kl", (5, 6)), ("cogvideox", (3, 5, 6)), ("hunyuanvideo", (2, 5, 6))):
    vae = build(name)
    z = latent((1, vae.config.latent_channels, *size), seed=3)
    with torch.no_grad():
        want = vae.decode(z).sample
    vaeshard.parallelize(vae)
    plan = vaeshard.plan(vae, z.shape)
    # (AutoencoderKL's fast tier runs only with norm_into_conv=True; CogVideoX's is off on a GPU only)
    assert plan.same_kernels if name != "cogvideox" else plan.fast is not None, (name, plan.explain())
    calls.clear()
    buffers.clear()
    sums.clear()
    with torch.no_grad():
        got = vae.decode(z).sample
    assert calls, name  # the norms went through the kernels
    # HunyuanVideo's resnets: conv2 (on its produced buffer) adds its bias and the residual in one pass
    resnets = sum(type(m).__name__.endswith("ResnetBlockCausal3D") for m in vae.decoder.modules())
    assert len(sums) == (resnets if name == "hunyuanvideo" else 0), (name, len(sums), resnets)
    if name != "cogvideox":
        assert True in calls and False in calls, calls  # resnets' norms with SiLU, the attention's without
    # HunyuanVideo's convolutions ran on channels-first buffers the norms wrote, one per norm with SiLU;
    # its norm2s added conv1's bias, which conv1 left out, as they read its output
    with_silu = calls.count(True) + calls.count("biased")
    assert buffers == ([True] * with_silu if name == "hunyuanvideo" else []), (name, buffers)
    assert calls.count("biased") == (resnets if name == "hunyuanvideo" else 0), (name, calls)
    assert_close(got, want, CPU_FP32, name)
    with torch.no_grad():  # maps smaller than GROUP_NORM_SAME_MIN_ELEMENTS: PyTorch's kernel
        tuning.GROUP_NORM_SAME_MIN_ELEMENTS = z.numel() * 10**6
        calls.clear()
        assert_close(vae.decode(z).sample, want, CPU_FP32, name)
        assert not calls, (name, calls)
        tuning.GROUP_NORM_SAME_MIN_ELEMENTS = 0
    with torch.no_grad():  # exact=True: diffusers' layers, bit for bit
        vaeshard.unparallelize(vae)
        vaeshard.parallelize(vae, exact=True)
        calls.clear()
        assert torch.equal(vae.decode(z).sample, want) and not calls, name
# CogVideoX in the exact tier (its fast tier counted off), against diffusers: the decoder's spatial norms
# with their product, sum and SiLU in the kernels' apply pass, the encoder's GroupNorms with SiLU, each
# into the new frames of its causal convolution's channels-first input, whose front frames (the cache
# diffusers' frame batches hand it, or the first frame) make the tensor diffusers' torch.cat makes;
# the convolutions pad space as diffusers' call does (cuDNN). The spatial norms' conditioning: the
# first time a shape is met at the map's size, as diffusers, and compared with the latent's size
# broadcast; once that agreed, at the latent's size (the kernels read each value for its block of pixels). Each
# resnet's residual is added in its conv2's bias pass, its conv1's bias by its norm2
# (fast/residual_blocks.py)
tuning.NORM_INTO_CONV_ONLY_FAMILIES += ("cogvideox",)
vae = build("cogvideox")
z = latent((1, vae.config.latent_channels, 3, 5, 6), seed=4)
x = torch.randn(1, 3, 5, 16, 24, generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    want = vae.decode(z).sample, vae.encode(x).latent_dist.parameters
vaeshard.parallelize(vae)
runs = (("decode", lambda: vae.decode(z).sample), ("encode", lambda: vae.encode(x).latent_dist.parameters))
producers._LATENT_CONDITIONING.clear()  # (the fast tier's requests above checked some shapes)
for op, run in runs:
    calls.clear()
    buffers.clear()
    sums.clear()
    pres.clear()
    with torch.no_grad():
        got = run()
    produced = sum(calls.count(k) for k in ((True, "biased") if op == "encode" else ("cond", "blocks")))
    assert produced and buffers == [True] * produced, (op, calls, buffers)
    # each resnet's conv2 (on its produced buffer) adds its bias and the residual in one pass, and its
    # norm2 adds conv1's bias, which conv1 left out
    coder = vae.encoder if op == "encode" else vae.decoder
    resnets = sum(type(m).__name__ == "CogVideoXResnetBlock3D" for m in coder.modules())
    assert len(sums) == resnets and pres.count(True) == resnets, (op, sums, pres)
    if op == "decode":  # each upsampled shape checked once at the map's size ("cond"), then as blocks
        checked = producers._LATENT_CONDITIONING
        assert checked and all(checked.values()) and "blocks" in calls, (checked, calls)
        assert calls.count("blocks") >= len(checked), calls  # (each checked shape met again)
    assert_close(got, want[op == "encode"], CPU_FP32, f"cogvideox {op}")
print("ok")
"""

VALUES_JOB = interpreter.script("group-norm-same-values", VALUES)
MODELS_JOB = interpreter.script("group-norm-same-models", MODELS)


@pytest.mark.background(VALUES_JOB)
def test_statistics_are_pytorchs_cuda_algorithm_bit_for_bit():
    done = interpreter.result(VALUES_JOB, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


@pytest.mark.background(MODELS_JOB)
def test_default_requests_decode_through_the_kernels_as_diffusers_does():
    done = interpreter.result(MODELS_JOB, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_each_variant_is_checked_once_and_a_disagreeing_one_leaves_the_others(monkeypatch):
    """`agrees` on a (stood-in) CUDA device: the fold is found from GroupNorm alone, then each variant
    (with SiLU; scaled and shifted; of x plus a bias) is checked once with that fold; one that
    disagrees turns off only itself."""
    import contextlib

    import torch

    from vaeshard.kernels import group_norm_same as same

    checked = []

    def check(device, dtype, rounded, variant="plain"):
        checked.append((rounded, variant))
        return not (variant == "plain" and not rounded) and variant != "scaled"  # the rounded fold; no scaled

    monkeypatch.setattr(same, "_check", check)
    monkeypatch.setattr(same, "_verdicts", {})
    monkeypatch.setattr(same, "_variant_verdicts", {})
    monkeypatch.setattr(same, "_key", lambda device, dtype: ("cuda", 0, dtype))
    monkeypatch.setattr(same, "_on", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    gpu, bf16 = torch.device("cuda", 0), torch.bfloat16
    assert same.agrees(gpu, bf16, "scaled") is False
    assert same.agrees(gpu, bf16, "plain") is True and same.agrees(gpu, bf16, "silu") is True
    assert checked == [(False, "plain"), (True, "plain"), (True, "scaled"), (True, "silu")]
    assert same.VARIANTS == ("plain", "silu", "scaled", "biased", "scaled-biased")
    assert [same.agrees(gpu, bf16, v) for v in same.VARIANTS] == [True, True, False, True, True]
    # (the variants not asked before, each checked once)
    assert checked[4:] == [(True, "biased"), (True, "scaled-biased")]
    with pytest.raises(ValueError, match="variant"):
        same.agrees(gpu, bf16, "cond")


def test_maps_pytorch_reads_channels_first_are_taken_as_its_copy_would_be():
    """PyTorch's GroupNorm reads a map that is not contiguous through a copy in the layout its strides
    suggest: the kernels take only maps whose copy is certainly channels-first (a frame-major view, as
    CogVideoX's upsamplers return), never a channels-last one, whose norm PyTorch sums in another order."""
    import torch
    from torch._prims_common import suggest_memory_format

    from vaeshard.layers.norms import _copied_channels_first

    frames_first = torch.randn(1, 5, 16, 10, 12).permute(0, 2, 1, 3, 4)  # (B, C, T, H, W) view, T outermost
    channels_last = torch.randn(1, 16, 5, 10, 12).contiguous(memory_format=torch.channels_last_3d)
    image_last = torch.randn(2, 8, 6, 7).contiguous(memory_format=torch.channels_last)
    for x in (frames_first, channels_last, image_last, torch.randn(1, 16, 5, 10, 12), torch.randn(2, 8, 6, 7)):
        # (PyTorch's own choice, from its Python mirror of suggest_memory_format)
        assert _copied_channels_first(x) == (suggest_memory_format(x) == torch.contiguous_format), x.stride()
