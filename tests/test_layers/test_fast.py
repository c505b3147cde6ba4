"""The fast tier against diffusers, the exact tier bit for bit, and the Triton kernel on CPU."""

from __future__ import annotations

import contextlib
import itertools
import textwrap

import pytest
import torch

from .. import interpreter
from ..dist_harness import run_ranks
from ..models import build, latent
from ..parity import CPU_FP32 as TOL_CPU_FP32


@pytest.mark.parametrize("model", ["wan21", "wan22", "qwenimage"])
def test_direct_fast_tier_within_tolerance_and_exact_tier_bit_identical(model):
    import vaeshard

    vae = build(model)
    z = latent((1, 4, 3, 3, 3))  # (the tiers' bits and tolerance do not depend on the size)
    x = latent((1, 3, 5, 16, 32), seed=3).clamp(-1, 1)
    with torch.no_grad():
        ref = vae.decode(z).sample
        enc_ref = vae.encode(x).latent_dist.mean
    vaeshard.parallelize(vae, exact=True)
    assert torch.equal(vae.decode(z).sample, ref)
    assert torch.equal(vae.encode(x).latent_dist.mean, enc_ref)
    vaeshard.parallelize(vae)  # fast tier
    out = vae.decode(z).sample
    assert out.is_contiguous() and out.dtype == ref.dtype
    assert (out - ref).abs().max() <= TOL_CPU_FP32
    assert (vae.encode(x).latent_dist.mean - enc_ref).abs().max() <= TOL_CPU_FP32


def _sharded_tiers(rank, world, model, shape, mode):
    import vaeshard

    vae = build(model, (32, 24))
    z = latent(shape)
    with torch.no_grad():
        ref = vae.decode(z).sample
        tiled_ref = vae.tiled_decode(z).sample
    diffs = {}
    for exact in (True, False):
        vaeshard.parallelize(vae, mode=mode, exact=exact)
        diffs[exact] = (vae.decode(z).sample - ref).abs().max().item()
        vaeshard.parallelize(vae, mode="tile", exact=exact)
        assert torch.equal(vae.decode(z).sample, tiled_ref)  # tile is exact in both tiers
    assert max(diffs.values()) <= TOL_CPU_FP32, diffs
    return diffs


@pytest.mark.parametrize(
    "model,shape,mode,world",
    [
        ("wan21", (1, 4, 3, 7, 6), "spatial_shard_height", 2),
        ("wan22", (1, 4, 2, 5, 7), "spatial_shard_width", 3),
        # shards of 2, 1, 1 latent columns: residual blocks with a one-column shard exchange twice
        ("wan21", (1, 4, 2, 5, 4), "spatial_shard_width", 3),
    ],
)
def test_sharded_fast_tier_within_tolerance(model, shape, mode, world):
    run_ranks(_sharded_tiers, world, model, shape, mode)


def test_fast_tier_is_request_scoped():
    import vaeshard
    from vaeshard.layers import tier

    vae = vaeshard.parallelize(build("wan21"))
    vae.decode(latent((1, 4, 1, 3, 3)))
    assert not tier.enabled()
    plain = build("wan21")
    z = latent((1, 4, 2, 4, 4))
    with torch.no_grad():  # a swapped layer called outside a request runs diffusers' code
        assert torch.equal(vae.decoder.conv_in(z), plain.decoder.conv_in(z))


@pytest.mark.parametrize("exact,cudnn_benchmark", [(False, True), (True, True), (False, False)])
def test_cudnn_benchmark_mode_only_inside_fast_tier_requests(exact, cudnn_benchmark):
    # seen from a layer during the decode: on in the fast tier unless turned off, the caller's setting
    # in the exact tier; the caller's setting is back afterwards, also after a failed request
    import vaeshard

    with pytest.raises(TypeError, match="cudnn_benchmark must be True or False"):
        vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cudnn_benchmark="yes"))
    vae = vaeshard.parallelize(build("wan21"), exact=exact, fast=vaeshard.FastOptions(cudnn_benchmark=cudnn_benchmark))
    seen = []
    handle = vae.decoder.conv_in.register_forward_pre_hook(lambda m, a: seen.append(torch.backends.cudnn.benchmark))
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        vae.decode(latent((1, 4, 1, 3, 3)))
        assert seen and set(seen) == {not exact and cudnn_benchmark}
        assert torch.backends.cudnn.benchmark is False
        handle.remove()
        handle = vae.decoder.conv_in.register_forward_pre_hook(lambda m, a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            vae.decode(latent((1, 4, 1, 3, 3)))
        assert torch.backends.cudnn.benchmark is False
    finally:
        handle.remove()
        torch.backends.cudnn.benchmark = before


def test_residual_block_conv1_bias_moves_into_norm2_only_while_parallelized():
    import vaeshard
    from vaeshard.layers import norms

    vae = build("wan22")
    keys = sorted(vae.state_dict())
    blocks = [m for m in vae.modules() if type(m).__name__ == "WanResidualBlock"]
    assert blocks and all(b.conv1.bias is not None and b.conv1.bias.abs().sum() > 0 for b in blocks)
    vaeshard.parallelize(vae)
    assert all(norms.bias_moved(b.conv1) and not norms.bias_moved(b.conv2) for b in blocks)
    assert sorted(vae.state_dict()) == keys  # nothing registered
    z = latent((1, 4, 2, 4, 3))
    with torch.no_grad():  # the fast tier adds conv1's bias in norm2, so the result is still the decode
        plain = build("wan22").decode(z).sample
    assert (vae.decode(z).sample - plain).abs().max() <= TOL_CPU_FP32
    vaeshard.unparallelize(vae)
    assert not any(norms.bias_moved(b.conv1) or "_vaeshard_bias_from" in vars(b.norm2) for b in blocks)


@pytest.mark.parametrize(
    "model, mixin",
    [(model, mixin) for model in ("wan21", "wan22", "qwenimage") for mixin in ("FastResidualBlock", "FastUpsample")]
    + [("wan22", "FastResidualUpBlock")],
)
def test_fast_blocks_give_the_same_bits(monkeypatch, model, mixin):
    # the fast blocks only move less data: without them the fast tier computes the same values
    # (the upsamplers' convolution by phases computes otherwise: test_upsampling_by_phases)
    import vaeshard
    from vaeshard.families.wan import blocks as wan_blocks
    from vaeshard.layers import tier
    from vaeshard.runtime import swap

    monkeypatch.setattr(tier, "upsample_by_phases", lambda x: False)

    vae = vaeshard.parallelize(build(model))
    blocks = [m for m in vae.modules() if isinstance(m, getattr(wan_blocks, mixin))]
    assert blocks
    z, x = latent((1, 4, 3, 3, 3)), latent((1, 3, 5, 16, 32), seed=3).clamp(-1, 1)
    viewed, dup_up_views = [], wan_blocks._dup_up_views
    wan_blocks._dup_up_views = lambda *a: viewed.append(dup_up_views(*a)) or viewed[-1]
    try:
        with_blocks = vae.decode(z).sample, vae.encode(x).latent_dist.mean
    finally:
        wan_blocks._dup_up_views = dup_up_views
    if mixin == "FastResidualUpBlock":  # its shortcut added through views after the first decoder call
        assert viewed and all(v is not None for v in viewed), viewed
    for block in blocks:
        swap.unswap(block)
    without = vae.decode(z).sample, vae.encode(x).latent_dist.mean
    assert all(torch.equal(a, b) for a, b in zip(with_blocks, without))
    with torch.no_grad():
        plain = build(model).decode(z).sample
    assert (with_blocks[0] - plain).abs().max() <= TOL_CPU_FP32


@pytest.mark.parametrize(
    "cin, cout, ft, channels_last, viewable",
    [
        (16, 16, 2, True, True),  # Wan 2.2's 1024 -> 1024 in time and space: 8 repeats, every sub-voxel
        (16, 8, 1, True, True),
        (16, 8, 1, False, True),  # its 1024 -> 512 in space: 2 repeats, the columns
        (8, 8, 1, True, True),  # 4 repeats: rows and columns
        (16, 32, 2, True, False),  # 16 repeats over 8 sub-voxels: no view
    ],
)
def test_dup_up_shortcut_as_views(cin, cout, ft, channels_last, viewable):
    # Wan 2.2's duplicating shortcut (diffusers' DupUp3D) added into an output through views of its
    # input: the same bits as diffusers' `out + DupUp3D(x)`, in either memory layout; a duplication
    # that is no view is declined (diffusers' computation then runs)
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    from vaeshard.families.wan import blocks as wan_blocks

    shortcut = DupUp3D(cin, cout, factor_t=ft, factor_s=2)
    x = torch.randn(1, cin, 3, 4, 5).to(torch.bfloat16)
    out = torch.randn(1, cout, 3 * ft, 8, 10).to(torch.bfloat16)
    if channels_last:
        x, out = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x, out))
    want = out + shortcut(x)
    views = wan_blocks._dup_up_views(shortcut, out, x)
    assert (views is not None) == viewable
    if viewable:
        target, duplicated = views
        target.add_(duplicated)
        assert torch.equal(out, want)


@pytest.mark.parametrize("padding", [(1, 1, 1, 1, 2, 0), (0, 2, 1, 0, 1, 1), (1, 1, 1, 1, 0, 0)])
def test_replicate_padding_of_a_channels_last_map_is_pytorchs(padding):
    # a frame loop's causal convolution pads a channels-last input by copying it into a new buffer and
    # filling the padding in place (fast/causal_conv.py `_replicate_padded`): F.pad's values, channels-last
    import torch.nn.functional as F

    from vaeshard.fast import causal_conv

    x = torch.randn(2, 5, 3, 4, 6).contiguous(memory_format=torch.channels_last_3d)
    got = causal_conv._replicate_padded(x, padding)
    assert got.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(got, F.pad(x, padding, mode="replicate"))


@pytest.mark.parametrize("channels_last", [True, False])
def test_unpadded_causal_convolution_reads_its_input_where_it_lies(monkeypatch, channels_last):
    # a residual block's 1x1x1 shortcut (no padding at all) convolves its input as it lies, no input
    # buffer, where that is channels-last (the fast tier's layout); else through a buffer: the same
    # bits either way, and diffusers' own convolution's values
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    from vaeshard.layers import convs, tier
    from vaeshard.runtime import swap

    torch.manual_seed(0)
    conv = WanCausalConv3d(8, 4, 1).eval()
    x = torch.randn(1, 8, 3, 5, 6)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        want = conv(x)
    swap.swap(conv, convs.HaloCausalConv3d)
    buffers = []
    real = convs.HaloCausalConv3d.input_buffer
    monkeypatch.setattr(
        convs.HaloCausalConv3d, "input_buffer", lambda self, *a, **k: buffers.append(1) or real(self, *a, **k)
    )
    with torch.no_grad(), tier.active(tier.FastPlan()):
        got = conv(x)
    assert len(buffers) == (0 if channels_last else 1)
    monkeypatch.setattr(convs, "dense_channels_last", lambda t: False)  # through a buffer
    with torch.no_grad(), tier.active(tier.FastPlan()):
        buffered = conv(x)
    assert torch.equal(got, buffered) and torch.allclose(got, want, atol=1e-6)


def test_residual_block_output_takes_its_inputs_storage():
    # a block whose input has its output's layout returns the sum in the input's storage, so the
    # input its caller still references is not a third full-size tensor (bits: the tests above)
    import vaeshard

    vae = vaeshard.parallelize(build("wan21"))
    block = vae.decoder.mid_block.resnets[-1]  # identity shortcut; its output is the mid block's
    inputs, outputs = [], []
    block.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    vae.decoder.mid_block.register_forward_hook(lambda m, args, out: outputs.append(out))
    z = latent((1, 4, 2, 4, 3))
    vae.decode(z)
    assert len(inputs) == len(outputs) == 2
    assert all(out is x for x, out in zip(inputs, outputs))
    # a forward hook on the block itself sees the input: then the sum goes to a new tensor
    seen = []
    block.register_forward_hook(lambda m, args, out: seen.append(out is args[0]))
    vae.decode(z)
    assert seen == [False, False]


@pytest.mark.parametrize("where", ["residual block", "upsample", "head"])
def test_hooks_on_a_fast_blocks_layers_still_run(where):
    # offloading and debugging hooks sit on leaf layers: the block then runs diffusers' own forward
    import vaeshard

    vae = vaeshard.parallelize(build("wan21"))
    z = latent((1, 4, 2, 4, 3))
    plain = vae.decode(z).sample
    seen = []
    if where == "residual block":
        block = vae.decoder.up_blocks[0].resnets[0]
        first, second = block.conv1, block.norm2
    elif where == "upsample":
        block = next(m for m in vae.decoder.modules() if getattr(m, "mode", None) == "upsample3d")
        first, second = block.time_conv, block.resample[1]
    else:  # the decoder's head (wan_blocks.FastCoderHead): diffusers' forward, the same bits
        first, second = vae.decoder.norm_out, vae.decoder.conv_out
    handles = [
        first.register_forward_pre_hook(lambda m, a: seen.append("first")),
        second.register_forward_hook(lambda m, a, o: seen.append("second")),
    ]
    hooked = vae.decode(z).sample
    for handle in handles:
        handle.remove()
    assert "first" in seen and "second" in seen
    assert (hooked - plain).abs().max() <= TOL_CPU_FP32
    if where == "head":
        assert seen.count("second") == 2 and torch.equal(hooked, plain)  # (one call per latent frame)


def _sharded_block_bits(rank, world, model, shape, mode):
    from unittest import mock

    import vaeshard
    from vaeshard.families.wan import blocks as wan_blocks
    from vaeshard.layers import tier
    from vaeshard.runtime import swap
    from vaeshard.runtime.comm import Comm

    # (patched for this call only: the rank processes serve later tests; the upsamplers by phases
    # compute otherwise: test_upsampling_by_phases_sharded)
    exchanges, fill_halo = [], Comm.fill_halo
    possible, real = [], wan_blocks._one_exchange
    with (
        mock.patch.object(tier, "upsample_by_phases", lambda x: False),
        mock.patch.object(Comm, "fill_halo", lambda self, *a: exchanges.append(1) or fill_halo(self, *a)),
    ):
        vae = vaeshard.parallelize(build(model), mode=mode)
        z = latent(shape)
        one_exchange = vae.decode(z).sample  # residual blocks make one halo exchange each
        one = len(exchanges)
        with mock.patch.object(wan_blocks, "_one_exchange", lambda block, x: possible.append(real(block, x)) and False):
            with_blocks = vae.decode(z).sample  # two exchanges per block, where diffusers' forward makes them
            assert any(possible) and len(exchanges) - one == one + sum(possible)  # one exchange fewer per block
            mixins = (wan_blocks.FastUpsample, wan_blocks.FastResidualBlock) + (
                (wan_blocks.FastResidualUpBlock,) if model == "wan22" else ()
            )
            for mixin in mixins:  # one kind of block at a time back to diffusers' forward
                blocks = [m for m in vae.modules() if isinstance(m, mixin)]
                assert blocks
                for block in blocks:
                    swap.unswap(block)
                assert torch.equal(with_blocks, vae.decode(z).sample), mixin.__name__
    with torch.no_grad():
        plain = build(model).decode(z).sample
    # computing the rows conv2 needs in conv1 (a convolution over two more rows) may round otherwise
    return max((with_blocks - plain).abs().max().item(), (one_exchange - plain).abs().max().item())


@pytest.mark.parametrize(
    "model,shape,mode,world",
    [("wan21", (1, 4, 3, 7, 6), "spatial_shard_height", 2), ("wan22", (1, 4, 3, 5, 7), "spatial_shard_width", 3)],
)
def test_sharded_fast_blocks_give_the_same_bits(model, shape, mode, world):
    diffs = run_ranks(_sharded_block_bits, world, model, shape, mode)
    assert max(diffs) <= TOL_CPU_FP32


def _exchanged_frames(rank, world, model, shape, mode):
    import vaeshard
    from vaeshard.families.wan import blocks as wan_blocks
    from vaeshard.layers import convs

    vae = vaeshard.parallelize(build(model), mode=mode)
    blocks = [m for m in vae.modules() if isinstance(m, wan_blocks.FastResidualBlock)]
    in_blocks = {id(c) for b in blocks for c in (b.conv1, b.conv2)}
    seen, real = [], convs.HaloCausalConv3d.forward_buffer

    def recording(self, buf, with_bias=True, halo_rows=None, ready=0, *rest, **kwargs):
        seen.append((id(self) in in_blocks, buf.shape[2], ready, self._padding[4]))
        return real(self, buf, with_bias, halo_rows, ready, *rest, **kwargs)

    convs.HaloCausalConv3d.forward_buffer = recording
    try:
        z = latent(shape)
        out = vae.decode(z).sample
    finally:
        convs.HaloCausalConv3d.forward_buffer = real
    with torch.no_grad():
        plain = build(model).decode(z).sample
    block_calls = [(ready, tpad) for block, _, ready, tpad in seen if block]
    other_calls = [(ready, tpad) for block, _, ready, tpad in seen if not block and tpad]
    return block_calls, other_calls, (out - plain).abs().max().item()


def test_sharded_residual_blocks_exchange_only_new_frames():
    """The fast residual blocks keep their causal caches with the halo rows (taken after the
    exchange), so every halo exchange of their convolutions leaves the cached frames out; diffusers'
    own caches (the decoder's first convolution) are a shard's frames and are exchanged again."""
    for block_calls, other_calls, diff in run_ranks(
        _exchanged_frames, 2, "wan21", (1, 4, 3, 6, 5), "spatial_shard_width"
    ):
        assert block_calls and all(ready == tpad == 2 for ready, tpad in block_calls)
        assert any(ready == 0 for ready, _ in other_calls)  # the check can tell the two apart
        assert diff <= TOL_CPU_FP32


KERNEL_CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from vaeshard import tuning
    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import norms
    from vaeshard.layers import tier
    assert norm_kernels.triton is not None
    torch.manual_seed(0)
    for shape, channels_last, dtype in [((2, 24, 3, 5, 7), False, torch.float32),
                                        ((1, 40, 2, 6, 5), True, torch.float32),
                                        ((3, 16, 4, 6), True, torch.bfloat16),
                                        ((1, 96, 1, 3, 4), True, torch.bfloat16)]:
        x = torch.randn(shape) * 3
        x = (tier.to_channels_last(x) if channels_last else x).to(dtype)
        gamma = torch.rand(shape[1], *([1] * (len(shape) - 2))) + 0.5
        bias = torch.randn(shape[1], *([1] * (len(shape) - 2)))
        for b in (bias, 0.0):
            for silu in (True, False):
                xf = x.float()
                want = xf / xf.norm(dim=1, keepdim=True).clamp_min(1e-12) * gamma * 2.0
                want = want + (b if isinstance(b, torch.Tensor) else 0.0)
                want = F.silu(want) if silu else want
                b_dtype = b if not isinstance(b, torch.Tensor) else b.to(dtype)
                got = norm_kernels.rms_norm(x, gamma.to(dtype), b_dtype, 2.0, silu)
                assert got.dtype == dtype and got.stride() == x.stride(), (got.dtype, got.stride(), x.stride())
                tol = 1e-5 if dtype == torch.float32 else 2e-2 * want.abs().max().item()
                err = (got.float() - want).abs().max().item()
                assert err <= tol, (shape, channels_last, dtype, silu, err)
    # against diffusers' own module, in its dtype: the same roundings, so (almost) the same bits
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm
    for dtype in (torch.float32, torch.bfloat16):
        norm = WanRMS_norm(64, images=False)
        norm.gamma.data.uniform_(0.5, 1.5)
        norm = norm.to(dtype)
        x = tier.to_channels_last(torch.randn(1, 64, 2, 6, 10) * 4).to(dtype)
        want = F.silu(norm(x))
        got = norm_kernels.rms_norm(x, norm.gamma, norm.bias, norm.scale, silu=True)
        # (Triton's CPU interpreter casts fp32 -> bf16 by truncation, where GPUs round to nearest,
        # so bf16 bits are compared on the GPU by benchmarks/gpu_parity.py, not here.)
        err = (got.float() - want.float()).abs()
        bound = 1e-5 if dtype == torch.float32 else want.float().abs() * 2**-5 + 1e-3  # a few bf16 ulps
        assert bool((err <= bound).all()), (dtype, err.max().item())
    # Wan 2.2's duplicating shortcut added by one pass (norm_kernels.add_duplicated_): the bits of diffusers'
    # `out + DupUp3D(x)` (fp16 and fp32: the interpreter truncates to bf16), two samples, channel
    # counts past one channel block; other layouts are declined (the caller adds through views)
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D
    for dtype in (torch.float16, torch.float32):
        for cin, cout, ft in [(16, 16, 2), (16, 8, 1), (8, 8, 1), (200, 200, 2), (320, 160, 1)]:
            shortcut = DupUp3D(cin, cout, factor_t=ft, factor_s=2)
            x = tier.to_channels_last(torch.randn(2, cin, 3, 4, 5)).to(dtype)
            out = tier.to_channels_last(torch.randn(2, cout, 3 * ft, 8, 10)).to(dtype)
            want = out + shortcut(x)
            assert norm_kernels.add_duplicated_(out, x, ft, 2, shortcut.repeats)
            assert torch.equal(out, want), (dtype, cin, cout, ft)
    # HunyuanVideo 1.5's upsampler: the upsampled map and its channel-repeat shortcut in one pass
    # (d2s_shortcut.d2s_add): the bits of diffusers' forward given its convolution's output, space only
    # and time and space (the frames after the first), channel counts past one channel block
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15Upsample
    from vaeshard.kernels.d2s_shortcut import d2s_add
    for dtype in (torch.float16, torch.float32):
        for cin, cout, temporal in [(16, 16, True), (16, 8, True), (8, 8, False), (16, 8, False), (320, 160, False)]:
            up = HunyuanVideo15Upsample(cin, cout, add_temporal_upsample=temporal).to(dtype)
            x = tier.to_channels_last(torch.randn(2, cin, 3, 4, 5)).to(dtype)
            with torch.no_grad():
                want, h = up(x), tier.to_channels_last(up.conv(x))
            skip = 1 if temporal else 0  # (diffusers upsamples the first frame in space only)
            got = d2s_add(h[:, :, skip:], x[:, :, skip:], 2 if temporal else 1, 2)
            assert got is not None and got.is_contiguous(memory_format=torch.channels_last_3d)
            assert torch.equal(got, want[:, :, skip:]), (dtype, cin, cout, temporal)
    assert d2s_add(torch.zeros(1, 32, 2, 3, 3), torch.zeros(1, 8, 2, 3, 3), 2, 2) is None  # not channels-last
    # not channels-last
    assert not norm_kernels.add_duplicated_(torch.zeros(1, 8, 2, 4, 4), torch.zeros(1, 8, 1, 2, 2), 2, 2, 8)
    # a convolution's bias moved into the norm: the same as adding it first (fp32: no rounding between)
    x = tier.to_channels_last(torch.randn(1, 48, 2, 5, 6) * 2)
    gamma, pre = torch.rand(48, 1, 1, 1) + 0.5, torch.randn(48)
    got = norm_kernels.rms_norm(x, gamma, 0.0, 2.0, True, pre_bias=pre)
    want = norm_kernels.rms_norm(x + pre.reshape(1, -1, 1, 1, 1), gamma, 0.0, 2.0, True)
    assert (got - want).abs().max().item() <= 1e-6
    y = x.clone()
    assert norm_kernels.rms_norm(y, gamma, 0.0, 2.0, True, pre_bias=pre, out=y) is y and torch.equal(y, got)
    # into a strided view of a larger buffer (a convolution's input: leading frames, halo rows)
    for source in (x, x.contiguous()):
        buf = tier.to_channels_last(torch.zeros(1, 48, 4, 7, 6))
        view = buf[:, :, 2:, 1:-1]
        assert norm_kernels.rms_norm(source, gamma, 0.0, 2.0, True, pre_bias=pre, out=view) is view
        assert torch.equal(view, got) and not buf[:, :, :2].any()
        assert not buf[:, :, :, 0].any() and not buf[:, :, :, -1].any()
    # a convolution's bias and the residual, one pass: the same bits as PyTorch's two adds (fp32)
    for h_layout in (tier.to_channels_last, lambda t: t.contiguous()):
        out, res = tier.to_channels_last(torch.randn(1, 40, 3, 4, 5)), h_layout(torch.randn(1, 40, 3, 4, 5))
        b = torch.randn(40)
        assert norm_kernels.fused_bias_add_available(out)
        want = (out + b.reshape(1, -1, 1, 1, 1)) + res
        kept_out, kept_res = out.clone(), res.clone()
        assert norm_kernels.add_bias_and_residual_(out, b, res) is out and torch.equal(out, want)
        assert torch.equal(res, kept_res)
        # into the residual instead: the same bits there, the convolution's output left alone
        out = kept_out
        assert norm_kernels.add_bias_and_residual_(out, b, res, into_residual=True) is res and torch.equal(res, want)
        assert torch.equal(out, kept_out)
    # channels in three blocks of a power of two (48 = 3 x 16, as Wan's 96, 192, 384) against one
    # masked block of 64: the same values up to the order of the sum of squares
    blocks = norm_kernels._channel_blocks
    assert blocks(48) == (16, 3) and blocks(64) == (64, 1) and blocks(40) == (64, 1)
    assert norm_kernels._channel_blocks(24) == (32, 1) and norm_kernels._channel_blocks(96) == (32, 3)
    x48 = tier.to_channels_last(torch.randn(1, 48, 3, 5, 7) * 3)
    g48, b48, p48 = torch.rand(48, 1, 1, 1) + 0.5, torch.randn(48, 1, 1, 1), torch.randn(48)
    blocks = norm_kernels.rms_norm(x48, g48, b48, 2.0, True, pre_bias=p48)
    three = norm_kernels._channel_blocks
    norm_kernels._channel_blocks = lambda c: (64, 1)
    one = norm_kernels.rms_norm(x48, g48, b48, 2.0, True, pre_bias=p48)
    norm_kernels._channel_blocks = three
    assert (blocks - one).abs().max().item() <= 1e-6, (blocks - one).abs().max().item()
    # a convolution's bias added after it in one pass (conv_with_bias): the bits of PyTorch's own
    # two steps on CUDA (the convolution, then its bias pass), for 3-D and 2-D convolutions
    import torch.nn.functional as F
    xc = tier.to_channels_last(torch.randn(1, 24, 4, 6, 5))
    wc, bc = torch.randn(40, 24, 3, 3, 3) * 0.1, torch.randn(40)
    got = tier.conv_with_bias(F.conv3d, xc, wc, bc, 1, (0, 1, 1))
    assert torch.equal(got, F.conv3d(xc, wc, None, 1, (0, 1, 1)) + bc.reshape(1, -1, 1, 1, 1))
    assert (got - F.conv3d(xc, wc, bc, 1, (0, 1, 1))).abs().max().item() <= 1e-5
    x2 = torch.randn(3, 24, 6, 5).contiguous(memory_format=torch.channels_last)
    got = tier.conv_with_bias(F.conv2d, x2, wc[:, :, 0], bc, 1, 1)
    assert torch.equal(got, F.conv2d(x2, wc[:, :, 0], None, 1, 1) + bc.reshape(1, -1, 1, 1))
    strided = tier.to_channels_last(torch.randn(1, 48, 3, 9, 6))[:, :, 1:, 1:-1]
    want = strided + pre.reshape(1, -1, 1, 1, 1)
    assert norm_kernels.add_bias_(strided, pre) is strided and torch.equal(strided, want)
    # 64-bit index arithmetic (taken where offsets can pass 2**31; forced here): the same values
    narrow = (norm_kernels.rms_norm(x, gamma, 0.0, 2.0, True, pre_bias=pre),
              norm_kernels.add_bias_and_residual_(kept_out.clone(), b, res.clone()))
    narrow += (norm_kernels.add_bias_(kept_out.clone(), b),)
    norm_kernels._wide = lambda *tensors: True
    wide = (norm_kernels.rms_norm(x, gamma, 0.0, 2.0, True, pre_bias=pre),
            norm_kernels.add_bias_and_residual_(kept_out.clone(), b, res.clone()))
    wide += (norm_kernels.add_bias_(kept_out.clone(), b),)
    assert all(torch.equal(a, w) for a, w in zip(narrow, wide))
    print("kernel ok")
    """
)


def test_kernels_index_in_64_bits_only_where_offsets_can_pass_2_31():
    from vaeshard.kernels import norm as norm_kernels

    frames = torch.empty((1, 96, 6, 720, 1280), device="meta").contiguous(memory_format=torch.channels_last_3d)
    assert not norm_kernels._wide(frames, frames[:, :, 2:])  # a Wan 2.1 720p full-resolution buffer: 0.53 G elements
    assert norm_kernels._wide(torch.empty((4, 96, 6, 720, 1280), device="meta"))  # 2.1 G elements
    assert norm_kernels._wide(torch.empty(8, device="meta").as_strided((2, 4), (2**31, 1)))  # one far-apart stride


KERNEL_JOB = interpreter.script("fast-kernels", KERNEL_CHECK)


@pytest.mark.background(KERNEL_JOB)
def test_triton_rms_norm_kernel_through_the_interpreter():
    pytest.importorskip("triton")
    run = interpreter.result(KERNEL_JOB, timeout=300)
    assert run.returncode == 0 and "kernel ok" in run.stdout, run.stdout + run.stderr


MODEL_THROUGH_KERNELS = textwrap.dedent(
    """
    import torch
    import vaeshard
    from tests import interpreter
    interpreter.for_model_decodes()
    from tests.models import build, latent
    from vaeshard import tuning
    from vaeshard.kernels import norm as norm_kernels
    from vaeshard.layers import norms
    from vaeshard.layers import tier
    assert norm_kernels.fused_bias_add_available(torch.zeros(1))
    vae = build("wan21")
    z = latent((1, 4, 2, 4, 3))
    with torch.no_grad():
        ref = vae.decode(z).sample
    vaeshard.parallelize(vae)
    out = vae.decode(z).sample  # fused norms into conv buffers, conv2 bias + residual in one kernel
    err = (out - ref).abs().max().item()
    assert err <= 1e-5, err
    print("model ok", err)
    """
)
MODEL_JOB = interpreter.script("fast-model", MODEL_THROUGH_KERNELS)


@pytest.mark.background(MODEL_JOB)
def test_fast_tier_decode_through_the_triton_kernels_on_cpu():
    # the CUDA code path of the residual blocks (Triton kernels, conv2 without its bias), run by
    # Triton's CPU interpreter in fp32 against diffusers' decode
    pytest.importorskip("triton")
    run = interpreter.result(MODEL_JOB, timeout=300)
    assert run.returncode == 0 and "model ok" in run.stdout, run.stdout + run.stderr


def test_triton_kernels_compile_for_hopper():
    # the interpreter checks what the kernels compute; this checks that they compile for the GPUs
    # they run on (sm_90, H100/H200), with Triton's own ptxas, no GPU needed
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from vaeshard.kernels import norm as norm_kernels

    kernels = [
        (
            norm_kernels._rms_norm_silu_kernel,
            dict(HAS_BIAS=True, PRE_BIAS=True, SILU=True, BLOCK_S=64, BLOCK_C=128, CHUNKS=1),
        ),
        (
            norm_kernels._rms_norm_silu_kernel,
            dict(HAS_BIAS=False, PRE_BIAS=False, SILU=False, BLOCK_S=8, BLOCK_C=1024, CHUNKS=1),
        ),
        (
            norm_kernels._rms_norm_silu_kernel,
            dict(HAS_BIAS=False, PRE_BIAS=True, SILU=True, BLOCK_S=32, BLOCK_C=32, CHUNKS=3),
        ),
        (norm_kernels._bias_residual_kernel, dict(BLOCK_S=64, BLOCK_C=128, INTO_H=False, RESIDUAL=True)),
        (norm_kernels._bias_residual_kernel, dict(BLOCK_S=64, BLOCK_C=128, INTO_H=True, RESIDUAL=True)),
        (norm_kernels._bias_residual_kernel, dict(BLOCK_S=64, BLOCK_C=128, INTO_H=False, RESIDUAL=False)),
    ]
    for (kernel, constants), wide in itertools.product(kernels, (False, True)):  # 32- and 64-bit indexing
        constants = {**constants, "WIDE": wide}
        names = kernel.arg_names
        # Triton passes an int of 2**31 or more as i64; every int is below that where WIDE is off
        # (kernels/voxels.py `wide`), and some may be either way where it is on
        for ints in ("i32", "i64") if wide else ("i32",):
            types = {
                n: "*bf16"
                if n.endswith("_ptr")
                else "fp32"
                if n in ("scale", "eps")
                else "constexpr"
                if n in constants
                else ints
                for n in names
            }
            source = ASTSource(kernel, types, constexprs={(names.index(c),): v for c, v in constants.items()})
            compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32))
            assert len(compiled.asm["cubin"]) > 0
    # the upsampled maps' kernels (kernels/voxels.py `upsampled_block`: 64-bit voxel offsets always)
    from vaeshard.kernels import d2s_shortcut

    for kernel, constants in (
        (d2s_shortcut._d2s_add_kernel, dict(FT=2, FS=2, R=4, BLOCK_V=32, BLOCK_C=128)),
        (norm_kernels._add_duplicated_kernel, dict(FT=2, FS=2, PER=2, REPEATS=4, BLOCK_V=32, BLOCK_C=128)),
    ):
        names = kernel.arg_names
        for ints in ("i32", "i64"):
            types = {n: "*bf16" if n.endswith("_ptr") else "constexpr" if n in constants else ints for n in names}
            source = ASTSource(kernel, types, constexprs={(names.index(c),): v for c, v in constants.items()})
            assert len(triton_compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]) > 0


# --- frames per decoder step --------------------------------------------------------------------------


@contextlib.contextmanager
def _decoder_calls(vae):
    """The latent frames of each decoder call inside the block, recorded by a forward hook."""
    frames = []
    handle = vae.decoder.register_forward_hook(lambda module, inputs, output: frames.append(inputs[0].shape[2]))
    try:
        yield frames
    finally:
        handle.remove()


@pytest.mark.parametrize("per_step", [1, 2])
def test_causal_caches_are_overwritten_in_place(per_step):
    """From the third decoder call on, every causal cache is written into the tensor of the call
    before (diffusers makes a new tensor each call): the fast residual blocks' and upsamplers', and
    the decoder's first and last convolutions' (wan_blocks.FastCoderHead)."""
    import vaeshard

    vae = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(frames_per_step=per_step))
    z = latent((1, 4, 1 + 4 * per_step, 6, 5))
    states = []
    handle = vae.decoder.register_forward_hook(lambda module, inputs, output: states.append(list(vae._feat_map)))
    try:
        out = vae.decode(z).sample
    finally:
        handle.remove()
    with torch.no_grad():
        ref = build("wan21").decode(z).sample
    assert (out - ref).abs().max() <= TOL_CPU_FP32
    assert len(states) == 5
    for before, after in zip(states[1:], states[2:]):
        renewed = [i for i, (a, b) in enumerate(zip(before, after)) if a is not b]
        cached = [i for i, entry in enumerate(after) if isinstance(entry, torch.Tensor)]
        assert renewed == [], renewed
        assert len(cached) > 10


@pytest.mark.parametrize("model", ["wan21", "wan22", "qwenimage"])
def test_frames_per_step_direct(model):
    """One decoder call for the first latent frame, then calls of up to `frames_per_step` frames; every
    split gives diffusers' untiled decode within tolerance, and one frame per call gives the bits of
    diffusers' own loop running the fast tier's layers."""
    import vaeshard
    from vaeshard.layers import tier

    vae = build(model)
    z = latent((1, 4, 6, 3, 3))  # six frames: every split below; the frames' size does not matter
    with torch.no_grad():
        ref = vae.decode(z).sample
    vaeshard.parallelize(vae)
    with torch.no_grad(), tier.active(tier.FastPlan()):
        diffusers_loop = vae._decode(z, return_dict=False)[0]
    assert not torch.equal(diffusers_loop, ref)  # the fast tier's layers round otherwise: a real check below
    for per_step, calls in [(1, [1] * 6), (2, [1, 2, 2, 1]), (3, [1, 3, 2]), (8, [1, 5])]:
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(frames_per_step=per_step))
        with _decoder_calls(vae) as frames:
            out = vae.decode(z).sample
        assert frames == calls, (per_step, frames)
        assert out.shape == ref.shape and out.is_contiguous()
        assert (out - ref).abs().max() <= TOL_CPU_FP32, per_step
        if per_step == 1:
            assert torch.equal(out, diffusers_loop)
    # a one-frame latent (an image): the first call only
    image = latent((1, 4, 1, 3, 3), seed=5)
    with torch.no_grad():
        vaeshard.unparallelize(vae)
        image_ref = vae.decode(image).sample
    vaeshard.parallelize(vae, fast=vaeshard.FastOptions(frames_per_step=3))
    with _decoder_calls(vae) as frames:
        out = vae.decode(image).sample
    assert frames == [1] and out.shape == image_ref.shape
    assert (out - image_ref).abs().max() <= TOL_CPU_FP32


def test_frames_per_step_where_the_vaes_own_decode_runs():
    """Tiling of this latent, or the exact tier: the VAE's own decode runs (one frame per decoder
    call). A batch with slicing on is decoded a sample at a time, each in steps."""
    import vaeshard

    vae = build("wan21")
    z = latent((2, 4, 3, 6, 5))
    with torch.no_grad():
        untiled_ref = vae.decode(z).sample
    vae.enable_tiling(
        tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16, tile_sample_stride_width=16
    )
    with torch.no_grad():
        tiled_ref = vae.decode(z).sample
    assert not torch.equal(tiled_ref, untiled_ref)  # these tiles change the result: the tiling case is one
    for setup, exact, calls in [("tiling", False, None), ("plain", True, [1, 1, 1]), ("slicing", False, [1, 2, 1, 2])]:
        vae.use_tiling, vae.use_slicing = setup == "tiling", setup == "slicing"
        ref = {"tiling": tiled_ref, "plain": untiled_ref}.get(setup)  # (diffusers' decodes above)
        if ref is None:
            with torch.no_grad():
                ref = vae.decode(z).sample
        vaeshard.parallelize(vae, exact=exact, fast=vaeshard.FastOptions(frames_per_step=3))
        with _decoder_calls(vae) as frames:
            out = vae.decode(z).sample
        vaeshard.unparallelize(vae)
        if calls is None:  # tiles of 1-frame calls
            assert len(frames) > 3 and set(frames) == {1}, frames
        else:
            assert frames == calls, (setup, frames)
        assert (out - ref).abs().max() <= TOL_CPU_FP32, setup


def _sharded_frame_settings(rank, world, model, shape, mode):
    """frames_per_step and max_layer_frames on sharded ranks: decode, and for max_layer_frames encode."""
    import vaeshard

    vae = build(model, (32, 24))
    z = latent(shape)
    with torch.no_grad():
        ref = vae.decode(z).sample
    diffs = {}
    for per_step, layer_frames in [(2, None), (3, None), (1, 2)]:
        vaeshard.parallelize(
            vae, mode=mode, fast=vaeshard.FastOptions(frames_per_step=per_step, max_layer_frames=layer_frames)
        )
        with _decoder_calls(vae) as frames, _recorded_inputs() as record:
            out = vae.decode(z).sample
        assert frames[0] == 1 and max(frames) == min(per_step, shape[2] - 1), frames
        if layer_frames is not None:
            assert max(n for kind, n in record if kind == "causal") <= layer_frames
        diffs[(per_step, layer_frames)] = (out - ref).abs().max().item()
    assert max(diffs.values()) <= TOL_CPU_FP32, diffs
    # the encoder with max_layer_frames, sharded the same way
    x = latent((1, 3, 5, 32, 48), seed=3).clamp(-1, 1)
    vaeshard.unparallelize(vae)
    with torch.no_grad():
        enc_ref = vae.encode(x).latent_dist.mean
    vaeshard.parallelize(vae, mode=mode, fast=vaeshard.FastOptions(max_layer_frames=2))
    assert vaeshard.plan(vae, x.shape, world, mode, op="encode").strategy == mode
    enc_diff = (vae.encode(x).latent_dist.mean - enc_ref).abs().max().item()
    assert enc_diff <= TOL_CPU_FP32, enc_diff
    return diffs


@pytest.mark.parametrize(
    "model,shape,mode,world",
    [("wan21", (1, 4, 5, 7, 6), "spatial_shard_height", 2), ("wan22", (1, 4, 4, 5, 7), "spatial_shard_width", 3)],
)
def test_frame_settings_sharded(model, shape, mode, world):
    run_ranks(_sharded_frame_settings, world, model, shape, mode)


@pytest.mark.parametrize(
    "value,error",
    [
        (0, ValueError),
        (-2, ValueError),
        (True, TypeError),
        ("2", TypeError),
        (1.5, TypeError),
        ("Auto", TypeError),
        (None, TypeError),
    ],
)
def test_frames_per_step_is_validated(value, error):
    import vaeshard

    vae = build("wan21")
    with pytest.raises(error, match="frames_per_step"):
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(frames_per_step=value))
    assert not hasattr(vae, "_vaeshard")


def test_frames_per_step_auto_rule():
    """frames_per_step="auto" (the default): AUTO_STEP_FRAMES on CUDA for frames up to
    AUTO_STEP_MAX_PIXELS, else 1; 1 with max_layer_frames, on the CPU and outside the fast tier; a
    number is taken as it is. (The plan decides it from the output frame: latent pixels x 64.)"""
    import vaeshard
    from vaeshard import policy, tuning

    vae = build("wan21")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")

    def steps(latent_hw, device, **options):
        return policy.resolve_fast(
            vae, (1, 4, 5, *latent_hw), 1, "direct", vaeshard.FastOptions(**options), device=device
        ).frames_per_step

    small, large = (64, 64), (64, 65)  # 2^18 output pixels (tuning.AUTO_STEP_MAX_PIXELS), and more
    assert 64 * 64 * 64 == tuning.AUTO_STEP_MAX_PIXELS and tuning.AUTO_STEP_FRAMES > 1
    assert steps(small, cuda) == tuning.AUTO_STEP_FRAMES
    assert steps((30, 104), cuda) == tuning.AUTO_STEP_FRAMES  # Wan 2.1 480p, a rank of 2 (832 x 240)
    assert [steps(hw, cuda) for hw in (large, (45, 160), (60, 104))] == [1, 1, 1]
    assert steps(small, cpu) == 1
    assert steps(small, cuda, max_layer_frames=2) == 1
    assert steps(large, cpu, frames_per_step=3) == 3 and steps(small, cuda, frames_per_step=3) == 3
    # the exact tier, and no request at all: diffusers' one frame per call
    assert vaeshard.plan(vae, (1, 4, 5, *small), exact=True).fast is None
    from vaeshard.layers import tier

    assert tier.current() is None
    # a family measured faster with more frames per call at any size (tuning.AUTO_STEP_ANY_FRAME_FAMILIES)
    mochi = build("mochi")
    assert "mochi" in tuning.AUTO_STEP_ANY_FRAME_FAMILIES
    plan = policy.resolve_fast(mochi, (1, 4, 5, 64, 65), 1, "direct", vaeshard.FastOptions(), device=cuda)
    assert plan.frames_per_step == tuning.AUTO_STEP_FRAMES, plan.reasons
    assert "tuning.AUTO_STEP_ANY_FRAME_FAMILIES" in dict(plan.reasons)["frames_per_step"]
    on_cpu = policy.resolve_fast(mochi, (1, 4, 5, 64, 65), 1, "direct", vaeshard.FastOptions(), device=cpu)
    assert on_cpu.frames_per_step == 1


def _auto_steps_sharded(rank, world):
    """frames_per_step="auto" on sharded ranks of unequal rows: every rank takes the frames per step
    that the largest rank's output frames decide (the rule made to hold on the CPU here), so the
    ranks' decoder calls and halo exchanges pair up; the result is diffusers' decode within
    tolerance either way."""
    import vaeshard
    from vaeshard import tuning

    vae = build("wan21", (32, 24))
    z = latent((1, 4, 5, 7, 6))  # 7 latent rows: 4 on rank 0, 3 on rank 1
    with torch.no_grad():
        ref = vae.decode(z).sample
    largest = 4 * 6 * vae.spatial_compression_ratio**2
    devices, limit = tuning.AUTO_STEP_DEVICES, tuning.AUTO_STEP_MAX_PIXELS
    calls = []
    try:
        tuning.AUTO_STEP_DEVICES = ("cpu",)
        for threshold in (largest, largest - 1):  # the smaller rank's frames are below both
            tuning.AUTO_STEP_MAX_PIXELS = threshold
            vaeshard.parallelize(vae, mode="spatial_shard_height")
            with _decoder_calls(vae) as frames:
                out = vae.decode(z).sample
            assert (out - ref).abs().max() <= TOL_CPU_FP32, threshold
            calls.append(frames)
    finally:
        tuning.AUTO_STEP_DEVICES, tuning.AUTO_STEP_MAX_PIXELS = devices, limit  # (the rank processes serve later tests)
    return tuning.AUTO_STEP_FRAMES, calls


def test_frames_per_step_auto_sharded():
    for steps, calls in run_ranks(_auto_steps_sharded, 2):
        assert steps == 2 and calls == [[1, 2, 2], [1, 1, 1, 1, 1]], calls


# --- frames per layer ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _recorded_inputs():
    """Inside the block, the halo convolutions' input buffers record how many new frames (causal
    convolutions) or batch entries (2-D convolutions of upsampled frames) each one holds."""
    from vaeshard.layers import convs

    record = []
    causal, flat = convs.HaloCausalConv3d.input_buffer, convs.HaloConv2d.input_buffer

    def causal_buffer(self, like, cache_x, halo_rows=None, shape=None):
        buf, new, ready, front = causal(self, like, cache_x, halo_rows, shape)
        record.append(("causal", new.shape[2]))  # the new frames (not the cached / causal ones)
        return buf, new, ready, front

    def flat_buffer(self, like, shape=None):
        buf, core = flat(self, like, shape)
        record.append(("2d", buf.shape[0]))
        return buf, core

    convs.HaloCausalConv3d.input_buffer, convs.HaloConv2d.input_buffer = causal_buffer, flat_buffer
    try:
        yield record
    finally:
        convs.HaloCausalConv3d.input_buffer, convs.HaloConv2d.input_buffer = causal, flat


@pytest.mark.parametrize("model", ["wan21", "wan22", "qwenimage"])
def test_max_layer_frames_direct(model):
    """No convolution input holds more than `max_layer_frames` new frames (upsampled frames go one source
    frame at a time), where without it some hold 4; the values stay diffusers' untiled decode within
    tolerance, also with several latent frames per step."""
    import vaeshard

    vae = build(model)
    z = latent((1, 4, 5, 6, 5))
    with torch.no_grad():
        ref = vae.decode(z).sample
    for per_step, layer_frames in [(1, None), (1, 2), (1, 3), (2, 2)]:
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(frames_per_step=per_step, max_layer_frames=layer_frames))
        with _recorded_inputs() as record:
            out = vae.decode(z).sample
        causal = max(n for kind, n in record if kind == "causal")
        flat = max(n for kind, n in record if kind == "2d")
        if layer_frames is None:
            assert causal >= 4 * per_step and flat >= 4 * per_step, (causal, flat)
        else:
            assert causal <= layer_frames and flat <= 2, (layer_frames, causal, flat)
        assert (out - ref).abs().max() <= TOL_CPU_FP32, (per_step, layer_frames)


@pytest.mark.parametrize("model", ["wan21", "wan22"])
def test_max_layer_frames_encode(model):
    """The encoder's layers honour it too, except its stride-2 time convolutions, which cannot be cut
    at arbitrary frames and run whole: the moments stay diffusers' within tolerance."""
    import vaeshard

    vae = build(model)
    x = latent((1, 3, 9, 32, 48), seed=3).clamp(-1, 1)
    with torch.no_grad():
        ref = vae.encode(x).latent_dist.mean
    for layer_frames in (2, 3):
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(max_layer_frames=layer_frames))
        with _recorded_inputs() as record:
            out = vae.encode(x).latent_dist.mean
        assert any(kind == "causal" and n == layer_frames for kind, n in record)  # some layer was cut
        assert (out - ref).abs().max() <= TOL_CPU_FP32, layer_frames


@pytest.mark.parametrize("value,error", [(1, ValueError), (0, ValueError), (True, TypeError), ("2", TypeError)])
def test_max_layer_frames_is_validated(value, error):
    import vaeshard

    vae = build("wan21")
    with pytest.raises(error, match="max_layer_frames"):
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(max_layer_frames=value))
    assert not hasattr(vae, "_vaeshard")


def test_default_parts_above_the_frame_size(monkeypatch):
    """With max_layer_frames None, the upsamplers whose output frames hold at least
    tuning.PARTS_FROM_PIXELS pixels compute their phases on parts of two output frames; the residual
    blocks take parts only where box_conv's kernel runs their convolutions (not on the CPU: see
    test_causal_front), and the levels below the threshold take all their frames. A setting of the
    request's own (max_layer_frames=4) takes precedence. Values: diffusers' untiled decode within
    tolerance."""
    import vaeshard
    from vaeshard import tuning
    from vaeshard.kernels import phases as upsample

    vae = build("wan21")
    z = latent((1, 4, 3, 4, 8))  # output frames of 32 x 64 = 2048 pixels, 512 the level below
    with torch.no_grad():
        ref = vae.decode(z).sample
    phases = []
    by_phases = upsample.conv2d_by_phases

    def spy(src, weight, bias, halo=(0, 0), phases_weight=None, out=None, addend=None):
        phases.append((src.shape[0], 4 * src.shape[-2] * src.shape[-1]))
        return by_phases(src, weight, bias, halo, phases_weight, out, addend)

    monkeypatch.setattr(upsample, "conv2d_by_phases", spy)
    monkeypatch.setattr(tuning, "PARTS_FROM_PIXELS", 2048)
    for layer_frames in (None, 4):
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(max_layer_frames=layer_frames))
        phases.clear()
        with _recorded_inputs() as record:
            out = vae.decode(z).sample
        top = [n for n, pixels in phases if pixels == 2048]
        below = [n for n, pixels in phases if pixels == 512]
        assert top and below and max(below) == 4, phases  # the level below: whole
        assert max(top) == (2 if layer_frames is None else 4), (layer_frames, phases)
        assert max(n for kind, n in record if kind == "causal") == 4, record  # the blocks whole on CPU
        assert (out - ref).abs().max() <= TOL_CPU_FP32, layer_frames
    vaeshard.unparallelize(vae)
