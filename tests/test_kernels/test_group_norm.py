"""The fast tier's GroupNorm kernels (kernels/group_norm.py) against PyTorch's GroupNorm and SiLU,
in Triton's interpreter (fp32: the interpreter does not round bf16 as a GPU does; against float64, as
PyTorch's fp32 GroupNorm of a channels-last map on the CPU cancels digits where the mean is far from
zero): channels-last and channels-first maps of 3 to 5 dims, such a mean, writing
into a padded buffer's interior, the conditioning of CogVideoX's spatial norm; then the GroupNorm
families' decoders with their norms written into the next convolutions through the kernels, against
diffusers' decode (HunyuanVideo, Mochi, CogVideoX, AutoencoderKL). Outside the interpreter (CPU) the
same call runs PyTorch's steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .. import interpreter
from ..dist_harness import run_ranks

VALUES = """
import torch
import torch.nn.functional as F
from vaeshard.kernels import group_norm as gn, triton_support
assert triton_support.interpreting()
torch.manual_seed(0)
cases = [((2, 32, 3, 5, 7), 8, "3d"), ((1, 64, 9, 11), 32, "2d"), ((1, 16, 2, 4, 6), 4, None), ((2, 8, 37), 2, None)]
# 7.5 tiles of 32 voxels (128 channels): with every program reading up to 8 tiles, one reads all
cases.append(((1, 128, 6, 40), 32, "2d"))
# each case twice: one tile per program (these small maps' own choice), then as many as a large map
# takes (gn._BUSY_TILES at 1), a partial tile and tiles past the map's end among them
for (shape, groups, layout), busy in [(case, busy) for busy in (gn._BUSY_TILES, 1) for case in cases]:
    gn._BUSY_TILES = busy
    x = torch.randn(*shape) * 0.5 + 40.0  # far from zero: E[x^2] - E[x]^2 would lose every digit
    if layout == "3d":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    elif layout == "2d":
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1]), torch.randn(shape[1])
    assert gn.takes(x, groups), shape
    for silu in (False, True):
        # float64: PyTorch's own fp32 GroupNorm of a channels-last map on the CPU loses digits here
        want = F.group_norm(x.double(), groups, w.double(), b.double(), 1e-6)
        want = (F.silu(want) if silu else want).float()
        got = gn.group_norm(x, groups, w, b, 1e-6, silu)
        assert got.is_contiguous(memory_format=torch.channels_last_3d) or layout != "3d", shape
        assert (got - want).abs().max() <= 1e-4, (shape, silu, (got - want).abs().max())
        # into the interior of a larger buffer (the next convolution's padded input)
        buf = torch.full((shape[0], shape[1], *[d + 2 for d in shape[2:]]), float("nan"))
        view = buf[(slice(None), slice(None)) + tuple(slice(1, 1 + d) for d in shape[2:])]
        assert gn.group_norm(x, groups, w, b, 1e-6, silu, out=view).data_ptr() == view.data_ptr()
        assert (view - want).abs().max() <= 1e-4 and buf.isnan().sum() == buf.numel() - view.numel(), shape
# a convolution's bias added first (pre_bias), with one and with several tiles a program
for busy in (8192, 1):
    gn._BUSY_TILES = busy
    x = torch.randn(1, 128, 6, 40).contiguous(memory_format=torch.channels_last)
    pb, w, b = torch.randn(128) * 3, torch.randn(128), torch.randn(128)
    for silu in (False, True):
        want = F.group_norm((x + pb[:, None, None]).double(), 32, w.double(), b.double(), 1e-6)
        want = (F.silu(want) if silu else want).float()
        got = gn.group_norm(x, 32, w, b, 1e-6, silu, pre_bias=pb)
        assert (got - want).abs().max() <= 1e-4, (busy, silu, (got - want).abs().max())
# CogVideoX's conditioning: m and k at a half of the rows and a quarter of the columns
x = (torch.randn(1, 16, 3, 4, 8) * 2 + 1).contiguous(memory_format=torch.channels_last_3d)
m, k = torch.randn(1, 16, 3, 2, 2), torch.randn(1, 16, 3, 2, 2)
w, b = torch.randn(16), torch.randn(16)
def blocks(t):
    return t.repeat_interleave(2, dim=3).repeat_interleave(4, dim=4)
want = F.silu(F.group_norm(x, 4, w, b, 1e-6) * blocks(m) + blocks(k))
got = gn.group_norm(x, 4, w, b, 1e-6, True, conditioning=(m, k))
assert (got - want).abs().max() <= 2e-5, (got - want).abs().max()
print("ok")
"""

MODELS = """
import torch
import vaeshard
from vaeshard.kernels import group_norm, triton_support
from tests.models import build, latent
from tests.parity import CPU_FP32, assert_close
assert triton_support.interpreting()
applied = []
apply = group_norm._apply
group_norm._apply = lambda *args: applied.append(1) or apply(*args)
cases = (("hunyuanvideo", (3, 5, 6)), ("mochi", (3, 5, 7)), ("cogvideox", (5, 5, 6)), ("autoencoder_kl", (5, 6)))
for name, size in cases:
    vae = build(name)
    z = latent((1, vae.config.latent_channels, *size), seed=3)
    with torch.no_grad():
        want = vae.decode(z).sample
    vaeshard.parallelize(vae, fast=vaeshard.FastOptions(frames_per_step=1, norm_into_conv=True))
    applied.clear()
    with torch.no_grad():
        got = vae.decode(z).sample
    assert applied, name  # the norms went through the kernels
    assert_close(got, want, CPU_FP32, name)
print("ok")
"""


OFFSETS = """
import torch
import triton
import triton.language as tl
from vaeshard.kernels import triton_support, voxels
from vaeshard.kernels.voxels import offsets, voxel_block
assert triton_support.interpreting()

@triton.jit
def where(out_ptr, S, C, D1, D2, sn, sc, s0, s1, s2, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr):
    n, offs_c, i0, i1, i2, mask = voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
    at = offsets(n, offs_c, i0, i1, i2, sn, sc, s0, s1, s2)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    tl.store(out_ptr + (n * S + rows[:, None]) * C + tl.arange(0, BLOCK_C)[None, :], at, mask=mask)

# a channels-first map of 3 x 37 x 64 x 64 voxels and 16 channels whose voxels lie 2**26 apart is
# never built: only its element offsets are, by the kernels' addressing, and 15 channels of
# 3 * 37 * 64 * 64 voxels pass 2**31 (a HunyuanVideo map at 480p, 33 frames, 256 channels does)
N, C, D = 2, 16, (3, 5, 7)
S = D[0] * D[1] * D[2]
big = 2**24 * 9  # the channel stride
strides = (C * big, big, D[1] * D[2], D[2], 1)
shape = (N, C, *D)
meta = torch.empty_strided(shape, strides, device="meta")
assert voxels.wide(meta)
out = torch.full((N, S, C), -1, dtype=torch.int64)
where[(triton.cdiv(S, 32), N)](out, S, C, D[1], D[2], *strides, BLOCK_S=32, BLOCK_C=C, WIDE=voxels.wide(meta))
n, c, t, h, w = torch.meshgrid(*[torch.arange(d) for d in shape], indexing="ij")
want = n * strides[0] + c * strides[1] + t * strides[2] + h * strides[3] + w * strides[4]
want = want.permute(0, 2, 3, 4, 1).reshape(N, S, C)
assert torch.equal(out, want), (out - want).abs().max()
assert want.max() > 2**31
print("ok")
"""


OFFSETS_JOB = interpreter.script("group-norm-offsets", OFFSETS)
VALUES_JOB = interpreter.script("group-norm-values", VALUES)
MODELS_JOB = interpreter.script("group-norm-models", MODELS)


@pytest.mark.background(OFFSETS_JOB)
def test_wide_addressing_keeps_channel_offsets_past_2_31_in_the_interpreter():
    """In 64-bit mode (voxels.wide) the kernels' element offsets are exact where a channels-first
    map's channel stride times the channel passes 2**31 (found on the GPU by a HunyuanVideo decode;
    no tensor that large is built here: the offsets are stored, not loaded)."""
    run = interpreter.result(OFFSETS_JOB, timeout=120)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


@pytest.mark.background(VALUES_JOB)
def test_group_norm_kernels_match_pytorch_in_the_interpreter():
    run = interpreter.result(VALUES_JOB, timeout=240)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


@pytest.mark.background(MODELS_JOB)
def test_groupnorm_families_decode_through_the_kernels_in_the_interpreter():
    run = interpreter.result(MODELS_JOB, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


def test_outside_the_interpreter_group_norm_runs_pytorchs_steps():
    from vaeshard.kernels import group_norm as gn

    x = torch.randn(2, 12, 3, 4, 5)  # 12 channels: not a power of two either
    w, b = torch.randn(12), torch.randn(12)
    assert not gn.takes(x, 3)
    want = F.silu(F.group_norm(x, 3, w, b, 1e-5))
    assert torch.equal(gn.group_norm(x, 3, w, b, 1e-5, True), want)
    out = torch.empty(2, 12, 3, 6, 7)[:, :, :, 1:5, 1:6]
    assert gn.group_norm(x, 3, w, b, 1e-5, True, out=out).data_ptr() == out.data_ptr() and torch.equal(out, want)


def _sharded_through_the_kernels(rank, world):
    """In the interpreter (the environment the ranks were spawned with): HunyuanVideo's and CogVideoX's
    decoders sharded over the gloo ranks with their norms written into the convolutions, every
    GroupNorm's statistics made the whole map's by the kernels' one all-reduce, against diffusers'."""
    import vaeshard
    from vaeshard.kernels import group_norm, triton_support

    from ..models import build, latent
    from ..parity import CPU_FP32_GROUPNORM, assert_close, reference_from_rank0

    assert triton_support.interpreting()
    reduced = []
    scale_shift = group_norm._scale_shift
    group_norm._scale_shift = lambda *a: reduced.append(a[5] is not None) or scale_shift(*a)  # a[5]: reduce
    for name, size in (("hunyuanvideo", (2, 5, 7)), ("cogvideox", (3, 5, 7))):
        vae = build(name)
        z = latent((1, vae.config.latent_channels, *size), seed=4)
        reference = reference_from_rank0(rank, lambda vae=vae, z=z: vae.decode(z).sample)
        for mode in ("spatial_shard_height", "spatial_shard_width"):
            options = vaeshard.FastOptions(frames_per_step=1, norm_into_conv=True)
            vaeshard.parallelize(vae, mode, fast=options)
            reduced.clear()
            with torch.no_grad():
                out = vae.decode(z).sample
            assert reduced and all(reduced), (name, mode)
            assert_close(out, reference, CPU_FP32_GROUPNORM, f"{name} {mode}")
        vaeshard.unparallelize(vae)
    return True


def test_sharded_groupnorms_take_the_whole_maps_statistics_through_the_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # new ranks (fresh), spawned with it
    assert run_ranks(_sharded_through_the_kernels, 2, fresh=True) == [True, True]


def test_partials_kernel_compiles_for_hopper():
    """`_partials_kernel` reading one and several tiles a program, with a convolution's bias added as it
    reads (`pre_bias`) as `_apply_kernel` adds it, compiles for sm_90 (H100, H200) with
    Triton's own ptxas and no GPU, at Mochi's full-resolution width (what it computes: the interpreter
    tests above)."""
    import pytest

    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from vaeshard.kernels import group_norm

    kernel = group_norm._partials_kernel
    names = kernel.arg_names
    for blocks, pre_bias in ((1, False), (group_norm.PARTIAL_BLOCKS, True)):
        constants = dict(BLOCK_S=group_norm._tile(128), BLOCK_C=128, G=32, BLOCKS=blocks, PRE_BIAS=pre_bias)
        constants["WIDE"] = False
        types = {"x_ptr": "*bf16", "sum_ptr": "*fp32", "m2_ptr": "*fp32", "pb_ptr": "*bf16"}
        signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
        source = ASTSource(kernel, signature, constexprs={(names.index(c),): v for c, v in constants.items()})
        target = GPUTarget("cuda", 90, 32)
        cubin = triton_compile(source, target=target, options={"num_warps": group_norm.NUM_WARPS}).asm["cubin"]
        assert len(cubin) > 0, blocks
    kernel = group_norm._apply_kernel  # and the second pass adding the bias as it reads
    names = kernel.arg_names
    constants = dict(BLOCK_S=group_norm._tile(128), BLOCK_C=128, SILU=True, CONDITIONED=False, PRE_BIAS=True)
    constants["WIDE"] = False
    types = {n: "*bf16" for n in ("x_ptr", "y_ptr", "m_ptr", "k_ptr", "pb_ptr")} | {"a_ptr": "*fp32", "b_ptr": "*fp32"}
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
    source = ASTSource(kernel, signature, constexprs={(names.index(c),): v for c, v in constants.items()})
    cubin = triton_compile(source, target=target, options={"num_warps": group_norm.NUM_WARPS}).asm["cubin"]
    assert len(cubin) > 0
