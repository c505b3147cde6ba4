"""The fast tier's producers (fast/producers.py): a norm + SiLU writing into the next convolution's
padded input buffer, the convolution filling its padding in place.

Each declaring family's tiny config with the producers forced on against diffusers' own decode (and
encode): HunyuanVideo 1.5 (RMS norms, frame loop, streamed), LTX-Video (an RMS norm on a channels-last
view; timestep-conditioned blocks not linked), LTX-2 (per-channel RMS norms, reflect padding, causal
per call), HunyuanVideo (GroupNorms), Mochi (per-frame GroupNorms in its frame loop), CogVideoX
(latent-conditioned SpatialNorm3Ds; caches handed by diffusers' frame batches) and Qwen-Image 2.1 (RMS
norms into the channels-first padded frames of its single-frame convolutions), direct and on two gloo
ranks, with the proof that the path ran: every declared convolution took its buffer. The padding a
buffer gets against F.pad of the same input; the norm kernels writing into a buffer's interior (both
layouts) in Triton's interpreter (fp32: the interpreter does not round to bf16 as a GPU does).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import vaeshard
from vaeshard.fast import producers

from .. import interpreter, models
from ..dist_harness import run_ranks
from ..family_parity import sample, streamed
from ..models import build, latent
from ..parity import CPU_FP32, CPU_FP32_GROUPNORM, assert_close, reference_from_rank0


def _forced(vae, mode="auto", per_step=1, on=True):
    options = vaeshard.FastOptions(frames_per_step=per_step, norm_into_conv=on)
    return vaeshard.parallelize(vae, mode, fast=options)


class _Spy:
    """Counts, while active, the causal convolutions that took a produced buffer (`producers.filled`
    gave one) and those that did not, and every F.pad call."""

    def __init__(self):
        self.took, self.missed, self.pads = Counter(), Counter(), 0

    def __enter__(self):
        filled, pad = producers.filled, F.pad

        def spy_filled(conv, x, **kwargs):
            whole = filled(conv, x, **kwargs)
            (self.took if whole is not None else self.missed)[id(conv)] += 1
            return whole

        def spy_pad(*args, **kwargs):
            self.pads += 1
            return pad(*args, **kwargs)

        self.saved = (filled, pad)
        producers.filled, F.pad = spy_filled, spy_pad
        return self

    def __exit__(self, *exc):
        producers.filled, F.pad = self.saved


def _linked_convs(vae) -> set[int]:
    return {id(producers.linked_conv(m)) for m in vae.modules() if producers.linked_conv(m) is not None}


def _forced_with_blocks_linked(vae, block: str, **options) -> set[int]:
    """`vae` with the producers forced on; the linked convolutions, checked to be two for each
    residual block of the diffusers class `block` and one for each of the two norm_outs."""
    _forced(vae, **options)
    linked = _linked_convs(vae)
    blocks = sum(type(m).__name__ == block for m in vae.modules())
    assert len(linked) == 2 * blocks + 2, (block, linked)
    return linked


def _diffusers(vae, x, op):
    with torch.no_grad():
        return vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters


def test_hunyuanvideo15_with_producers_matches_diffusers():
    vae = build("hunyuanvideo15")
    latents = {frames: latent((1, 4, frames, 5, 6), seed=frames) for frames in (1, 3, 4)}
    references = {frames: _diffusers(vae, z, "decode") for frames, z in latents.items()}
    x = sample((1, 3, 5, 16, 12))
    moments = _diffusers(vae, x, "encode")
    linked = None
    for frames, z in latents.items():
        for per_step in (1, 2):
            what = f"{frames} latent frames, {per_step} per step"
            linked = _forced_with_blocks_linked(vae, "HunyuanVideo15ResnetBlock", per_step=per_step)
            plan = vaeshard.plan(vae, z.shape)
            assert plan.fast.norm_into_conv and "norm into conv: on (set" in plan.explain(), plan.explain()
            with _Spy() as spy, torch.no_grad():
                out = vae.decode(z).sample
            assert_close(out, references[frames], CPU_FP32, what)
            # every declared convolution took its buffer, and only the others padded a copy
            assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked), what
            assert spy.pads == sum(spy.missed.values()), what
            assert torch.equal(torch.cat(streamed(vae, z), dim=2), out), what
    with _Spy() as spy, torch.no_grad():
        encoded = vae.encode(x).latent_dist.parameters
    assert_close(encoded, moments, CPU_FP32, "fast-tier encode")
    assert spy.took and not (set(spy.missed) & linked)
    _forced(vae, on=False)  # off: no buffer is produced, every convolution pads as before
    assert not vaeshard.plan(vae, latents[3].shape).fast.norm_into_conv
    with _Spy() as spy, torch.no_grad():
        assert_close(vae.decode(latents[3]).sample, references[3], CPU_FP32, "producers off")
    assert not spy.took and spy.pads == sum(spy.missed.values())


def test_a_hook_on_a_declared_layer_keeps_diffusers_path():
    """A forward hook that replaces the norm's output would get an unmarked tensor through SiLU
    twice: with one, that norm and its convolution run as diffusers does."""
    vae = build("hunyuanvideo15")
    z = latent((1, 4, 3, 5, 6), seed=3)
    reference = _diffusers(vae, z, "decode")
    _forced(vae, per_step=2)
    handle = vae.decoder.norm_out.register_forward_hook(lambda module, args, out: out.clone())
    try:
        with _Spy() as spy, torch.no_grad():
            out = vae.decode(z).sample
    finally:
        handle.remove()
    assert_close(out, reference, CPU_FP32, "a hook on norm_out")
    assert spy.took and spy.missed[id(vae.decoder.conv_out)] == 2  # (one call per chunk: frame 0, then 1-2)


def test_plan_says_why_the_producers_run_or_not(monkeypatch):
    vae = build("hunyuanvideo15")
    vaeshard.parallelize(vae)
    text = vaeshard.plan(vae, (1, 4, 3, 5, 6)).explain()
    assert "norm into conv: on (auto: hunyuanvideo15 is in tuning.NORM_INTO_CONV_BUFFER_FAMILIES" in text, text
    off = vaeshard.plan(vae, (1, 4, 3, 5, 6), fast=vaeshard.FastOptions(norm_into_conv=False)).explain()
    assert "norm into conv: off (set: " in off, off
    monkeypatch.setattr(vaeshard.tuning, "NORM_INTO_CONV_BUFFER_FAMILIES", ())
    text = vaeshard.plan(vae, (1, 4, 3, 5, 6)).explain()
    assert "norm into conv: off (auto: hunyuanvideo15 is not in tuning.NORM_INTO_CONV_BUFFER_FAMILIES" in text, text
    vaeshard.parallelize(vae, exact=True)  # the exact tier never produces
    assert vaeshard.plan(vae, (1, 4, 3, 5, 6), fast=vaeshard.FastOptions(norm_into_conv=True)).fast is None
    with pytest.raises(TypeError, match="norm_into_conv"):
        vaeshard.FastOptions(norm_into_conv="yes")


class _PadConv(torch.nn.Module):
    """A convolution that pads its input by an F.pad tuple in a mode, as the protocol asks."""

    def __init__(self, padding, mode, input_as_diffusers=True):
        super().__init__()
        self.conv = torch.nn.Conv3d(2, 2, 1)
        self.padding, self.mode = padding, mode
        self.input_as_diffusers = input_as_diffusers

    def producer_padding(self):
        return self.padding, self.mode, self.mode


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("mode", ["replicate", "zeros"])
def test_a_produced_buffer_is_padded_as_f_pad_pads(mode, channels_last):
    x = latent((2, 3, 4, 5, 6), seed=1)
    padding = (1, 2, 2, 1, 2, 0)
    conv = _PadConv(padding, mode)
    view = producers.interior(conv, x, channels_last=channels_last)
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    assert view.shape == x.shape and view._base.is_contiguous(memory_format=layout)
    view.copy_(x)
    expected = F.pad(x, padding, mode="replicate" if mode == "replicate" else "constant")
    assert torch.equal(producers.filled(conv, view), expected)
    # anything but that very view takes the convolution's own path
    assert producers.filled(conv, x) is None and producers.filled(conv, view.clone()) is None
    assert producers.filled(_PadConv(padding, mode), view) is None
    # a channels-first buffer only for a convolution that convolves what diffusers' own padding gives it
    assert producers.interior(_PadConv(padding, mode, input_as_diffusers=False), x, channels_last=False) is None


def _sharded_decodes_match(rank, vae, z, per_step=1, seed=None, tol=CPU_FP32) -> bool:
    """On this rank: both spatial modes with the producers forced on equal diffusers' decode (rank 0's)
    within `tol`, every declared convolution taking its buffer (`seed`: the injected noise's draws,
    reset before each)."""

    def decode():
        if seed is not None:
            torch.manual_seed(seed)
        return _diffusers(vae, z, "decode")

    reference = reference_from_rank0(rank, decode)
    for mode in ("spatial_shard_height", "spatial_shard_width"):
        _forced(vae, mode, per_step=per_step)
        linked = _linked_convs(vae)
        with _Spy() as spy:
            out = decode()
        assert_close(out, reference, tol, mode)
        assert spy.took and not (set(spy.missed) & linked), mode
    return True


def _sharded(rank, world):
    return _sharded_decodes_match(rank, build("hunyuanvideo15"), latent((1, 4, 4, 5, 7), seed=9), per_step=2)


def test_hunyuanvideo15_with_producers_sharded_matches_diffusers():
    assert run_ranks(_sharded, 2) == [True, True]


INTERIOR = """
import torch
from torch.nn.functional import normalize, silu
from vaeshard.kernels import norm, triton_support
assert triton_support.interpreting()
torch.manual_seed(0)
x = torch.randn(1, 12, 3, 5, 6).contiguous(memory_format=torch.channels_last_3d)
gamma, scale = torch.rand(12, 1, 1, 1) + 0.5, 12 ** 0.5
kinds = {  # each norm kind's kernel against diffusers' formula for it
    "Wan's RMS norm": (
        lambda out: norm.rms_norm(x, gamma, 0.0, scale, silu=True, out=out),
        silu(normalize(x, dim=1) * scale * gamma),
    ),
    "LTX-Video's RMSNorm on a channels-last view": (
        lambda out: norm.mean_rms_norm(x, 1e-8, silu=True, out=out),
        silu(x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-8)),
    ),
    "LTX-2's PerChannelRMSNorm": (
        lambda out: norm.per_channel_rms_norm(x, 1e-8, silu=True, out=out),
        silu(x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + 1e-8)),
    ),
}
layouts = [(name, torch.channels_last_3d) for name in kinds]
layouts.append(("Wan's RMS norm", torch.contiguous_format))  # a channels-first buffer (Qwen-Image 2.1's)
for name, layout in layouts:
    run, expected = kinds[name]
    buf = torch.full((1, 12, 5, 7, 8), 7.0).contiguous(memory_format=layout)
    interior = buf[:, :, 2:, 1:6, 1:7]
    assert norm._spatial_strides(interior) is not None  # the kernel, not the eager path, takes the view
    run(interior)
    err = (interior - expected).abs().max().item()
    untouched = buf.clone()
    untouched[:, :, 2:, 1:6, 1:7] = 7.0
    assert err < 1e-5, (name, layout, err)
    assert bool((untouched == 7.0).all()), name + ": the kernel wrote outside the interior"
print("ok")
"""


INTERIOR_JOB = interpreter.script("producers-interior", INTERIOR)


@pytest.mark.background(INTERIOR_JOB)
def test_norm_kernel_writes_into_a_buffers_interior_in_the_interpreter():
    run = interpreter.result(INTERIOR_JOB, timeout=240)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


def test_qwenimage21_with_producers_matches_diffusers():
    """Qwen-Image 2.1's RMS norms write into the channels-first zero-padded frames its single-frame
    convolutions convolve; the frame decoded without diffusers' feature cache."""
    vae = build("qwenimage21")
    z = latent((1, 4, 1, 5, 6), seed=22)
    x = sample((1, 4, 1, 16, 12))
    reference, moments = _diffusers(vae, z, "decode"), _diffusers(vae, x, "encode")
    linked = _forced_with_blocks_linked(vae, "QwenImage21ResidualBlock")
    with _Spy() as spy, torch.no_grad():
        out = vae.decode(z).sample
    assert_close(out, reference, CPU_FP32, "decode")
    decoder_linked = {c for c in linked if any(id(m) == c for m in vae.decoder.modules())}
    assert set(spy.took) == decoder_linked and not (set(spy.missed) & linked)
    unpadded = sum(not any(getattr(m, "_padding", (1,))) for m in vae.decoder.modules())  # 1x1 shortcuts
    assert spy.pads == sum(spy.missed.values()) + unpadded  # of the padded ones only conv_in pads a copy
    with _Spy() as spy, torch.no_grad():
        encoded = vae.encode(x).latent_dist.parameters
    assert_close(encoded, moments, CPU_FP32, "encode")
    assert spy.took and not (set(spy.missed) & linked)


def _qwenimage21_sharded(rank, world):
    return _sharded_decodes_match(rank, build("qwenimage21"), latent((1, 4, 1, 7, 6), seed=23))


def test_qwenimage21_with_producers_sharded_matches_diffusers():
    assert run_ranks(_qwenimage21_sharded, 2) == [True, True]


def _ltx():
    """LTX-Video's tiny config (every kind of its layers) without the timestep's scale and shift, so
    its norms feed their convolutions directly; one block still injects noise."""
    return models._tiny("ltx", timestep_conditioning=False, decoder_inject_noise=(True, False, False, False))


def test_ltx_with_producers_matches_diffusers():
    vae = _ltx()
    z = latent((1, 4, 2, 3, 4), seed=5)
    torch.manual_seed(11)
    reference = _diffusers(vae, z, "decode")
    x = sample((1, 3, 9, 64, 64))
    moments = _diffusers(vae, x, "encode")
    linked = _forced_with_blocks_linked(vae, "LTXVideoResnetBlock3d")
    assert "norm into conv: on (set" in vaeshard.plan(vae, z.shape).explain()
    torch.manual_seed(11)  # the injected noise's draws, as in diffusers' decode
    with _Spy() as spy, torch.no_grad():
        out = vae.decode(z).sample
    assert_close(out, reference, CPU_FP32, "decode")
    assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked)
    with _Spy() as spy, torch.no_grad():
        encoded = vae.encode(x).latent_dist.parameters
    assert_close(encoded, moments, CPU_FP32, "encode")
    assert spy.took and not (set(spy.missed) & linked)


def test_ltx_scaled_by_a_timestep_keeps_diffusers_path():
    """Where a block scales and shifts the norm's output by the timestep, its norms are not linked
    (NormIntoConv.unless) and the decode still matches."""
    vae = build("ltx")
    z = latent((1, 4, 2, 3, 4), seed=6)
    temb = torch.tensor([0.05])
    torch.manual_seed(12)
    with torch.no_grad():
        reference = vae.decode(z, temb).sample
    _forced(vae)
    decoder_links = {id(c) for c in (producers.linked_conv(m) for m in vae.decoder.modules()) if c is not None}
    assert not decoder_links
    torch.manual_seed(12)
    with torch.no_grad():
        assert_close(vae.decode(z, temb).sample, reference, CPU_FP32, "timestep-conditioned")


def _ltx_sharded(rank, world):
    return _sharded_decodes_match(rank, _ltx(), latent((1, 4, 2, 4, 5), seed=7), seed=13)


def test_ltx_with_producers_sharded_matches_diffusers():
    assert run_ranks(_ltx_sharded, 2) == [True, True]


def test_mochi_with_producers_matches_diffusers():
    """Mochi's per-frame GroupNorms write into the decoder's causal convolutions' buffers in its frame
    loop: direct (1 and 2 latent frames per call), streamed, a batch of two, each against diffusers'
    decode; the encoder's convolutions take no buffer (they run outside the loop)."""
    vae = build("mochi")
    cases = {(1, 4): latent((1, 4, 4, 5, 7), seed=11), (2, 3): latent((2, 4, 3, 4, 6), seed=12)}
    references = {key: _diffusers(vae, z, "decode") for key, z in cases.items()}
    for (batch, frames), z in cases.items():
        for per_step in (1, 2):
            what = f"batch {batch}, {frames} latent frames, {per_step} per step"
            _forced(vae, per_step=per_step)
            linked = _linked_convs(vae)
            resnets = sum(type(m).__name__ == "MochiResnetBlock3D" for m in vae.decoder.modules())
            assert len(linked) == 2 * resnets, linked  # the decoder's residual blocks' two each
            with _Spy() as spy, torch.no_grad():
                out = vae.decode(z).sample
            assert_close(out, references[(batch, frames)], CPU_FP32, what)
            assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked), what
            assert torch.equal(torch.cat(streamed(vae, z), dim=2), out), what


def _mochi_sharded(rank, world):
    z = latent((1, 4, 3, 5, 7), seed=14)
    return _sharded_decodes_match(rank, build("mochi"), z, per_step=2, tol=CPU_FP32_GROUPNORM)


def test_mochi_with_producers_sharded_matches_diffusers():
    assert run_ranks(_mochi_sharded, 2) == [True, True]


def test_hunyuanvideo_with_producers_matches_diffusers():
    """HunyuanVideo's GroupNorms write into their causal convolutions' buffers: decode and encode
    against diffusers' (whole-clip statistics, as nn.GroupNorm takes them)."""
    vae = build("hunyuanvideo")
    z = latent((1, 4, 3, 5, 6), seed=15)
    x = sample((1, 3, 5, 16, 24))
    reference, moments = _diffusers(vae, z, "decode"), _diffusers(vae, x, "encode")
    linked = _forced_with_blocks_linked(vae, "HunyuanVideoResnetBlockCausal3D")
    for op, x_in, want in (("decode", z, reference), ("encode", x, moments)):
        with _Spy() as spy:
            got = _diffusers(vae, x_in, op)
        assert_close(got, want, CPU_FP32, op)
        assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked), op


def _hunyuanvideo_sharded(rank, world):
    # statistics combined across ranks: the GroupNorm tolerance, as for its sharded decode without producers
    z = latent((1, 4, 2, 5, 7), seed=16)
    return _sharded_decodes_match(rank, build("hunyuanvideo"), z, tol=CPU_FP32_GROUPNORM)


def test_hunyuanvideo_with_producers_sharded_matches_diffusers():
    assert run_ranks(_hunyuanvideo_sharded, 2) == [True, True]


def test_cogvideox_with_producers_matches_diffusers(monkeypatch):
    """CogVideoX's SpatialNorm3Ds (decoder) and GroupNorms (encoder) write into their causal
    convolutions' buffers, whose front frames come from the cache diffusers hands each call: decode
    over two frame batches (the first odd), with and without diffusers' time chunks of its safe
    convolutions, and encode, against diffusers' own; the caches each convolution returns are what
    diffusers' would hold, or the second batch would differ."""
    from vaeshard.layers import halo

    vae = build("cogvideox")
    z = latent((1, 4, 5, 5, 6), seed=18)  # frame batches of 3 and 2 latent frames
    x = sample((1, 3, 17, 16, 24))  # of 9 and 8 sample frames
    reference, moments = _diffusers(vae, z, "decode"), _diffusers(vae, x, "encode")
    linked = _forced_with_blocks_linked(vae, "CogVideoXResnetBlock3D")
    for gib in (halo.SAFE_CONV_GIB, 1e-9):
        monkeypatch.setattr(halo, "SAFE_CONV_GIB", gib)
        for op, x_in, want in (("decode", z, reference), ("encode", x, moments)):
            with _Spy() as spy:
                got = _diffusers(vae, x_in, op)
            assert_close(got, want, CPU_FP32, f"{op}, chunks below {gib} GiB")
            assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked), op
            assert max(spy.took.values()) > 1, op  # (a second frame batch, handed its caches)


def _cogvideox_sharded(rank, world):
    z = latent((1, 4, 3, 5, 7), seed=19)
    return _sharded_decodes_match(rank, build("cogvideox"), z, tol=CPU_FP32_GROUPNORM)


def test_cogvideox_with_producers_sharded_matches_diffusers():
    assert run_ranks(_cogvideox_sharded, 2) == [True, True]


@pytest.mark.parametrize("model", ["autoencoder_kl", "flux2"])
def test_image_vaes_with_producers_match_diffusers(model):
    """AutoencoderKL's and FLUX.2's GroupNorms write silu(norm) into their 3x3 convolutions' channels-
    last input buffers (cuDNN pads them): the decode against diffusers'."""
    vae = build(model)
    z = latent((1, vae.config.latent_channels, 5, 6), seed=20)
    reference = _diffusers(vae, z, "decode")
    _forced(vae)
    linked = _linked_convs(vae)
    resnets = sum(type(m).__name__ == "ResnetBlock2D" for m in vae.decoder.modules())
    assert len(linked) == 2 * resnets + 1, linked  # each residual block's two, conv_norm_out's
    told = producers.told
    took: Counter = Counter()

    def spy(conv, x):
        ok = told(conv, x)
        took[id(conv)] += ok
        return ok

    producers.told = spy
    try:
        out = _diffusers(vae, z, "decode")
    finally:
        producers.told = told
    assert_close(out, reference, CPU_FP32, model)
    assert set(took) >= linked and all(took[c] for c in linked), "a declared convolution missed its buffer"


def _image_sharded(rank, world):
    vae = build("autoencoder_kl")
    z = latent((1, vae.config.latent_channels, 7, 6), seed=21)
    reference = reference_from_rank0(rank, lambda: _diffusers(vae, z, "decode"))
    for mode in ("spatial_shard_height", "spatial_shard_width"):
        _forced(vae, mode)
        assert_close(_diffusers(vae, z, "decode"), reference, CPU_FP32_GROUPNORM, mode)
    return True


def test_image_vae_with_producers_sharded_matches_diffusers():
    assert run_ranks(_image_sharded, 2) == [True, True]


def _ltx2(**overrides):
    """LTX-2's tiny config without the timestep's scale and shift; its decoder pads with reflection."""
    return models._tiny("ltx2", timestep_conditioning=False, **overrides)


@pytest.mark.parametrize("decoder_causal, causal", [(True, None), (False, False), (False, True)])
def test_ltx2_with_producers_matches_diffusers(decoder_causal, causal):
    """LTX-2's per-channel RMS norms write into its convolutions' buffers, which hold the frames either
    padding takes and convolve those of the call's own `causal` (diffusers: `causal or is_causal`)."""
    vae = _ltx2(decoder_causal=decoder_causal)
    z = latent((1, 4, 2, 3, 4), seed=17)
    kwargs = {} if causal is None else {"causal": causal}

    def decode():
        torch.manual_seed(18)
        with torch.no_grad():
            return vae.decode(z, **kwargs).sample

    reference = decode()
    linked = _forced_with_blocks_linked(vae, "LTX2VideoResnetBlock3d")
    with _Spy() as spy:
        out = decode()
    assert_close(out, reference, CPU_FP32, f"decoder_causal={decoder_causal}, causal={causal}")
    assert spy.took and set(spy.took) <= linked and not (set(spy.missed) & linked)


def test_ltx2_encode_with_producers_matches_diffusers():
    vae = _ltx2()
    x = sample((1, 3, 9, 64, 64))
    moments = _diffusers(vae, x, "encode")
    _forced(vae)
    with _Spy() as spy:
        encoded = _diffusers(vae, x, "encode")
    assert_close(encoded, moments, CPU_FP32, "encode")
    assert spy.took and not (set(spy.missed) & _linked_convs(vae))


def _ltx2_sharded(rank, world):
    return _sharded_decodes_match(rank, _ltx2(), latent((1, 4, 2, 4, 5), seed=19), seed=20)


def test_ltx2_with_producers_sharded_matches_diffusers():
    """Sharded: the halo rows from the neighbours, the reflection at the image's edges from a rank's own rows."""
    assert run_ranks(_ltx2_sharded, 2) == [True, True]


@pytest.mark.parametrize("name", ["ltx2", "mochi", "hunyuanvideo15"])
def test_produced_convolutions_add_their_bias_in_one_pass(monkeypatch, name):
    """Where the bias kernel runs (CUDA), a convolution that took its produced buffer leaves its bias
    out of PyTorch's call and adds it in one pass (layers/tier.py `conv_module`): every such
    convolution's bias goes through `add_bias_`, and the decode still equals diffusers'. Here the
    kernel's availability is granted on the CPU and `add_bias_` stood in by PyTorch's add, which
    rounds as the kernel does; the kernel's own values: tests/test_kernels. Mochi's and HunyuanVideo
    1.5's blocks leave conv1's bias to norm2 instead (fast/residual_blocks.py), which adds it as it
    reads: counted apart."""
    from vaeshard.layers import tier

    vae = _ltx2() if name == "ltx2" else build(name)
    z = latent((1, 4, 3, 4, 5), seed=23)
    torch.manual_seed(24)
    reference = _diffusers(vae, z, "decode")
    passes = []

    def add_bias_(x, bias):
        passes.append(tuple(x.shape))
        return x.add_(bias.reshape(1, -1, *([1] * (x.ndim - 2))))

    def add_bias_and_residual_(x, bias, residual, into_residual=False):  # (LTX's blocks: the test below)
        return add_bias_(x, bias).add_(residual)

    monkeypatch.setattr(tier, "fused_bias_add_available", lambda x: True)
    monkeypatch.setattr(tier, "add_bias_", add_bias_)
    monkeypatch.setattr(tier, "add_bias_and_residual_", add_bias_and_residual_)
    left = []
    conv_module = tier.conv_module

    def leaving(conv, x, padding, add_to=None, leave_bias=False):
        left.extend([tuple(x.shape)] * leave_bias)
        return conv_module(conv, x, padding, add_to=add_to, leave_bias=leave_bias)

    monkeypatch.setattr(tier, "conv_module", leaving)
    _forced(vae)
    torch.manual_seed(24)
    with _Spy() as spy, torch.no_grad():
        out = vae.decode(z).sample
    assert_close(out, reference, CPU_FP32, name)
    taken = sum(spy.took.values())
    assert taken and len(passes) + len(left) >= taken, (taken, passes, left)
    assert bool(left) == (name in ("mochi", "hunyuanvideo15")), left


_RESNETS = {
    "ltx": "ltxvideoresnet",
    "ltx2": "ltx2videoresnet",
    "mochi": "mochiresnet",
    "hunyuanvideo15": "hunyuanvideo15resnet",
}


@pytest.mark.parametrize("name, encodes", [("ltx", True), ("ltx2", True), ("mochi", False), ("hunyuanvideo15", True)])
def test_residual_blocks_add_their_input_in_the_bias_pass(monkeypatch, name, encodes):
    """In the fast tier a residual block whose second convolution took its produced buffer adds the
    block's input in that convolution's bias pass (layers/ltx_resnet.py, fast/residual_blocks.py:
    `add_bias_and_residual_`, stood in here by PyTorch's adds on the CPU as in the test above), and
    the decode (and the encode, where the encoder's convolutions take buffers) still equals
    diffusers'."""
    from vaeshard.layers import tier

    vae = {"ltx": _ltx, "ltx2": _ltx2}.get(name, lambda: build(name))()
    z = latent((1, 4, 3, 4, 5), seed=25)
    x = sample((1, 3, 9, 64, 64))
    torch.manual_seed(26)
    reference = _diffusers(vae, z, "decode")
    moments = _diffusers(vae, x, "encode")
    fused = []

    def add_bias_and_residual_(y, bias, residual, into_residual=False):
        fused.append(tuple(y.shape))
        return y.add_(bias.reshape(1, -1, 1, 1, 1)).add_(residual)

    monkeypatch.setattr(tier, "fused_bias_add_available", lambda x: True)
    monkeypatch.setattr(tier, "add_bias_", lambda y, bias: y.add_(bias.reshape(1, -1, 1, 1, 1)))
    monkeypatch.setattr(tier, "add_bias_and_residual_", add_bias_and_residual_)
    _forced(vae)
    blocks = [  # LTX's blocks that add noise after their second convolution add their input after it
        m
        for m in vae.decoder.modules()
        if type(m).__name__.lower().startswith(_RESNETS[name]) and getattr(m, "per_channel_scale2", None) is None
    ]
    calls = []
    hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in blocks]
    torch.manual_seed(26)
    with torch.no_grad():
        out = vae.decode(z).sample
    for hook in hooks:
        hook.remove()
    assert_close(out, reference, CPU_FP32, name)
    decoded = len(fused)
    # every call of every decoder block, whatever layout its input comes in (Mochi's up blocks hand
    # the next block a channels-last map, fast/depth_to_space.py; the head's output is sliced by frames)
    assert blocks and decoded == len(calls), (decoded, len(calls))
    with torch.no_grad():
        encoded = vae.encode(x).latent_dist.parameters
    assert_close(encoded, moments, CPU_FP32, name + " encode")
    assert (len(fused) > decoded) == encodes, (decoded, len(fused))
