"""Reliability, measured: bad input fails on every rank before any decode work, a fault on one rank makes
every rank raise within the timeout, long-lived workers neither drift nor leak, and two groups work side
by side. Every test records what it saw (messages, times, memory) for docs/reliability.md through
tests/reliability_report.py (`python -m tests.reliability_report` regenerates the document).

The soak runs VAESHARD_SOAK measured requests (default 60 in CI; the documented full run uses 240).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import queue as queue_mod
import random
import re
import shutil
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from . import reliability_report as report
from .dist_harness import run_ranks
from .models import build, latent
from .test_cli.test_serve import REPORT_IDS as SERVICE_IDS
from .test_cli.test_serve_faults import REPORT_IDS as SERVICE_FAULT_IDS
from .test_cli.test_serve_http import REPORT_IDS as HTTP_IDS
from .test_runtime.test_agreement import REPORT_IDS as ARRIVAL_IDS

SOAK_REQUESTS = int(os.environ.get("VAESHARD_SOAK", "60"))
FAULT_TIMEOUT_S = 3.0  # vaeshard's timeout= in the fault tests: every rank must raise within about this
FAULT_SLACK_S = 3.0  # allowed on top of it (process scheduling on a loaded 2-core CI machine)
FAULT_GROUP_TIMEOUT_S = 5.0  # the faulting groups' own timeout, which ends a collective left pending
REQUEST_TIMEOUT_S = 30.0  # timeout= everywhere else: a regression fails the test instead of hanging it
GOOD = (1, 4, 1, 2, 2)  # a tiny valid Wan latent: after each bad input the group must still decode it


# --- bad input ---------------------------------------------------------------------------------------

# id, what is passed, where it is refused, exception, message pattern ({rank: pattern} where ranks differ)
BAD_INPUTS: list[tuple[str, str, str, str, object]] = [
    (
        "mode-invalid",
        "parallelize(vae, mode='rows')",
        "parallelize",
        "ValueError",
        r"unknown mode 'rows': valid modes are tile, auto, spatial_shard_height, spatial_shard_width",
    ),
    (
        "output-invalid",
        "parallelize(vae, output='rank1')",
        "parallelize",
        "ValueError",
        r"unknown output 'rank1': valid values are all, rank0",
    ),
    ("size-invalid", "parallelize(vae, size=0)", "parallelize", "ValueError", r"size must be at least 1"),
    ("timeout-invalid", "parallelize(vae, timeout=-1)", "parallelize", "ValueError", r"timeout must be a positive"),
    (
        "fast-not-options",
        "parallelize(vae, fast={'frames_per_step': 2})",
        "parallelize",
        "TypeError",
        r"fast must be a vaeshard.FastOptions, got dict",
    ),
    (
        "size-larger-than-group",
        "parallelize(vae, size=3) on a 2-rank group",
        "parallelize",
        "ValueError",
        r"size=3 is larger than the process group \(2 ranks\).*pass size <= 2",
    ),
    (
        "no-family",
        "parallelize(torch.nn.Linear(2, 2))",
        "parallelize",
        "ValueError",
        r"does not support Linear: supported VAE classes are AutoencoderKLWan",
    ),
    (
        "spatial-mode-no-spatial-family",
        "mode='spatial_shard_height' for a family that declares no spatial support",
        "parallelize",
        "ValueError",
        r"needs spatial sharding, which .* does not support: use mode='tile'",
    ),
    (
        "install-refused",
        "a Wan VAE with a strided, padded Conv2d in its decoder (cannot be halo-sharded)",
        "parallelize (VAE left unchanged)",
        "ValueError",
        r"cannot shard .*use mode='tile'",
    ),
    (
        "latent-ndim",
        "4-D latent to AutoencoderKLWan",
        "request agreement",
        "ValueError",
        r"expects a 5-D latent in layout \(B, C, T, H, W\), got 4-D",
    ),
    (
        "latent-ndim-image",
        "5-D latent to AutoencoderKL",
        "request agreement",
        "ValueError",
        r"expects a 4-D latent in layout \(B, C, H, W\), got 5-D",
    ),
    (
        "latent-channels",
        "3-channel latent to a 4-channel Wan VAE",
        "request agreement",
        "ValueError",
        r"expects a latent with 4 channels \(its latent channels, C in \(B, C, T, H, W\)\), got 3",
    ),
    (
        "latent-channels-image",
        "3-channel latent to a 4-channel AutoencoderKL",
        "request agreement",
        "ValueError",
        r"expects a latent with 4 channels \(its latent channels, C in \(B, C, H, W\)\), got 3",
    ),
    (
        "not-a-tensor",
        "a nested list instead of a tensor",
        "request agreement",
        "TypeError",
        r"expects the latent as a torch.Tensor, got list",
    ),
    (
        "integer-dtype",
        "an int64 latent",
        "request agreement",
        "TypeError",
        r"expects a floating-point latent, got torch.int64",
    ),
    (
        "dtype-vs-vae",
        "a float64 latent to a float32 VAE (on every rank)",
        "request agreement",
        "ValueError",
        r"got a float64 latent, but the VAE's parameters are float32: cast it with .to\(torch.float32\)",
    ),
    (
        "device-vs-vae",
        "a latent on the meta device to a VAE on cpu",
        "request agreement",
        "ValueError",
        r"got a latent on meta, but the VAE's parameters are on cpu: move it with .to\('cpu'\)",
    ),
    ("zero-sized-axis", "latent of shape (1, 4, 0, 6, 8)", "request agreement", "ValueError", r"an axis of size 0"),
    (
        "nan-on-one-rank",
        "one NaN in rank 1's latent only",
        "request agreement",
        "ValueError",
        {0: r"decode input is invalid on rank\(s\) \[1\] \(NaN or Inf values", 1: r"with 1 NaN and 0 Inf values"},
    ),
    (
        "inf-every-rank",
        "+Inf in the latent on every rank",
        "request agreement",
        "ValueError",
        r"with 0 NaN and 2 Inf values",
    ),
    ("encode-nan", "NaN in the sample to encode", "request agreement", "ValueError", r"encode got a sample with 3 NaN"),
    (
        "shapes-differ",
        "latent width 8 on rank 0, 9 on rank 1",
        "request agreement",
        "ValueError",
        r"ranks disagree on the decode request .*\(1, 4, 2, 6, 8\).*\(1, 4, 2, 6, 9\)",
    ),
    (
        "dtypes-differ",
        "float64 latent on rank 0, float32 on rank 1",
        "request agreement",
        "ValueError",
        r"ranks disagree on the decode request .*float64.*float32",
    ),
    (
        "modes-differ",
        "mode tile on rank 0, auto on rank 1",
        "request agreement",
        "ValueError",
        r"ranks disagree on the decode request .*mode tile.*mode auto",
    ),
    (
        "outputs-differ",
        "output all on rank 0, rank0 on rank 1",
        "request agreement",
        "ValueError",
        r"ranks disagree on the decode request .*output all.*output rank0",
    ),
    (
        "weights-differ",
        "verify_weights(vae), one weight of decoder.conv_in changed on rank 1",
        "verify_weights",
        "ValueError",
        r"verify: parameter 'decoder.conv_in.weight' differs between ranks \(rank\(s\) \[1\] differ",
    ),
    (
        "not-in-group",
        "decode on rank 1, outside the VAE's group {0}",
        "that rank, before any collective",
        "ValueError",
        {1: r"not a member of the group the VAE was parallelized on"},
    ),
]


def _module_classes(vae):
    return {name: type(m) for name, m in vae.named_modules()}


def _bad_case(case, rank, ctx):
    """Make the bad call of `case` on this rank (it is expected to raise)."""

    import torch.distributed as dist

    import vaeshard
    import vaeshard.api as parallel_mod
    from vaeshard.families.wan import FAMILY as WAN

    wan, image, fresh = ctx["wan"], ctx["image"], ctx["fresh"]
    z = latent((1, 4, 2, 6, 8))
    auto = dict(mode="auto", timeout=REQUEST_TIMEOUT_S)
    if case == "mode-invalid":
        vaeshard.parallelize(fresh, mode="rows")
    elif case == "output-invalid":
        vaeshard.parallelize(fresh, output="rank1")
    elif case == "size-invalid":
        vaeshard.parallelize(fresh, size=0)
    elif case == "timeout-invalid":
        vaeshard.parallelize(fresh, timeout=-1)
    elif case == "fast-not-options":
        vaeshard.parallelize(fresh, fast={"frames_per_step": 2})
    elif case == "size-larger-than-group":
        vaeshard.parallelize(fresh, size=3)
    elif case == "no-family":
        vaeshard.parallelize(torch.nn.Linear(2, 2))
    elif case == "spatial-mode-no-spatial-family":
        # a family that declares no spatial support (every real family has it), for a class of its own
        no_spatial = type(
            "NoSpatial", (type(WAN),), {"name": "no_spatial", "spatial_decode": False, "spatial_encode": False}
        )()
        real = parallel_mod.family_for
        parallel_mod.family_for = lambda vae: no_spatial
        try:
            vaeshard.parallelize(type("SomeVideoVAE", (torch.nn.Module,), {})(), mode="spatial_shard_height")
        finally:
            parallel_mod.family_for = real
    elif case == "install-refused":
        odd = ctx["odd"]
        vaeshard.parallelize(odd, mode="spatial_shard_height")
    elif case == "latent-ndim":
        vaeshard.parallelize(wan, **auto).decode(latent((1, 4, 6, 8)))
    elif case == "latent-ndim-image":
        vaeshard.parallelize(image, **auto).decode(latent((1, 4, 1, 6, 8)))
    elif case == "latent-channels":
        vaeshard.parallelize(wan, **auto).decode(latent((1, 3, 2, 6, 8)))
    elif case == "latent-channels-image":
        vaeshard.parallelize(image, **auto).decode(latent((1, 3, 6, 8)))
    elif case == "not-a-tensor":
        vaeshard.parallelize(wan, **auto).decode(z.tolist())
    elif case == "integer-dtype":
        vaeshard.parallelize(wan, **auto).decode(z.long())
    elif case == "dtype-vs-vae":
        vaeshard.parallelize(wan, **auto).decode(z.double())
    elif case == "device-vs-vae":
        vaeshard.parallelize(wan, **auto).decode(z.to("meta"))
    elif case == "zero-sized-axis":
        vaeshard.parallelize(wan, **auto).decode(latent((1, 4, 0, 6, 8)))
    elif case == "nan-on-one-rank":
        if rank == 1:
            z[0, 2, 1, 3, 4] = float("nan")
        vaeshard.parallelize(wan, **auto).decode(z)
    elif case == "inf-every-rank":
        z[0, 0, 0, 0, :2] = float("inf")
        vaeshard.parallelize(wan, **auto).decode(z)
    elif case == "encode-nan":
        x = latent((1, 3, 1, 32, 16)).clamp(-1, 1)
        x[0, :, 0, 5, 5] = float("nan")
        vaeshard.parallelize(wan, **auto).encode(x)
    elif case == "shapes-differ":
        vaeshard.parallelize(wan, **auto).decode(latent((1, 4, 2, 6, 9)) if rank == 1 else z)
    elif case == "dtypes-differ":
        vaeshard.parallelize(wan, **auto).decode(z.double() if rank == 0 else z)
    elif case == "modes-differ":
        vaeshard.parallelize(wan, mode="tile" if rank == 0 else "auto", timeout=REQUEST_TIMEOUT_S).decode(z)
    elif case == "outputs-differ":
        vaeshard.parallelize(wan, output="all" if rank == 0 else "rank0", **auto).decode(z)
    elif case == "weights-differ":
        other = build("wan21", (32, 24))
        if rank == 1:
            with torch.no_grad():
                other.decoder.conv_in.weight[0, 0, 0, 0, 0] += 1e-3
        vaeshard.verify_weights(vaeshard.parallelize(other, **auto))
    elif case == "not-in-group":
        solo = dist.new_group([0])
        vae = vaeshard.parallelize(build("wan21", (32, 24)), group=solo, **auto)
        vae.decode(latent(GOOD))  # rank 0: a group of one decodes alone; rank 1: refused
    else:
        raise KeyError(case)


def _bad_inputs(rank, world):
    import vaeshard

    wan = vaeshard.parallelize(build("wan21", (32, 24)), mode="auto", timeout=REQUEST_TIMEOUT_S)
    image = vaeshard.parallelize(build("autoencoder_kl"), mode="auto", timeout=REQUEST_TIMEOUT_S)
    plain = build("wan21", (32, 24))
    with torch.no_grad():
        good_reference = plain.decode(latent(GOOD)).sample
    calls = {"n": 0}

    def count(module, args):
        calls["n"] += 1

    for vae in (wan, image):
        for part in (vae.decoder, vae.encoder):
            part.register_forward_pre_hook(count)

    outcomes = {}
    for case, *_ in BAD_INPUTS:
        fresh = build("wan21", (32, 24))
        odd = build("wan21", (32, 24))
        odd.decoder.add_module("odd", torch.nn.Conv2d(4, 4, 3, stride=2, padding=1))
        ctx = {"wan": wan, "image": image, "fresh": fresh, "odd": odd}
        watched = fresh if case != "install-refused" else odd
        before = (_module_classes(watched), "decode" in watched.__dict__, hasattr(watched, "_vaeshard"))
        calls["n"] = 0
        start = time.perf_counter()
        try:
            _bad_case(case, rank, ctx)
            kind, message = "none", "returned normally"
        except Exception as exc:  # noqa: BLE001 - the outcome is the subject of the test
            kind, message = type(exc).__name__, str(exc)
        seconds = time.perf_counter() - start
        work = calls["n"]
        unchanged = before == (_module_classes(watched), "decode" in watched.__dict__, hasattr(watched, "_vaeshard"))
        # the group is still usable afterwards: nothing was left half-done on any rank
        out = vaeshard.parallelize(wan, mode="auto", timeout=REQUEST_TIMEOUT_S).decode(latent(GOOD)).sample
        after_ok = bool((out - good_reference).abs().max() <= 1e-5)
        outcomes[case] = {
            "type": kind,
            "message": message,
            "seconds": seconds,
            "work": work,
            "unchanged": unchanged,
            "after_ok": after_ok,
        }
    return outcomes


def test_bad_input_fails_on_every_rank_before_any_work():
    results = run_ranks(_bad_inputs, 2, timeout=200)
    problems = []
    for case, what, where, expected, pattern in BAD_INPUTS:
        per_rank = [results[r][case] for r in range(2)]
        patterns = pattern if isinstance(pattern, dict) else {0: pattern, 1: pattern}
        for r, outcome in enumerate(per_rank):
            if r not in patterns:  # this rank's call is valid (not-in-group: rank 0 decodes alone)
                if outcome["type"] != "none":
                    problems.append(f"{case}: rank {r} raised {outcome['type']}: {outcome['message']}")
                continue
            if outcome["type"] != expected or not re.search(patterns[r], outcome["message"]):
                problems.append(f"{case}: rank {r} raised {outcome['type']}: {outcome['message']!r}")
            if outcome["work"]:
                problems.append(f"{case}: rank {r} ran {outcome['work']} decoder/encoder calls before raising")
        for r, outcome in enumerate(per_rank):
            if not outcome["unchanged"]:
                problems.append(f"{case}: rank {r}: parallelize left the VAE changed")
            if not outcome["after_ok"]:
                problems.append(f"{case}: rank {r}: the group did not decode correctly afterwards")
        raised = [r for r in range(2) if r in patterns]
        messages = [per_rank[r]["message"] for r in raised]
        message = (
            messages[0] if len(set(messages)) == 1 else "; ".join(f"rank {r}: {m}" for r, m in zip(raised, messages))
        )
        report.record(
            "bad-input",
            case,
            what=what,
            where=where,
            raised=f"{expected} on rank{'s' if len(raised) > 1 else ''} {', '.join(map(str, raised))}"
            + ("" if len(raised) == 2 else " (rank 0 decodes alone)"),
            message=message,
            time=f"{max(per_rank[r]['seconds'] for r in raised) * 1e3:.1f} ms",
            work=sum(per_rank[r]["work"] for r in raised),
        )
    assert not problems, "\n".join(problems)


def test_size_larger_than_group_is_refused_at_first_request_when_the_group_was_unknown():
    import vaeshard

    # no process group yet when parallelize runs: the size is checked at the request (world size 1 here)
    vae = vaeshard.parallelize(build("wan21", (32, 24)), size=2)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"size=2 is larger than the process group \(1 rank\)") as err:
        vae.decode(latent(GOOD))
    report.record(
        "bad-input",
        "size-larger-than-group-late",
        what="parallelize(vae, size=2) before the group exists, then decode",
        where="first request",
        raised="ValueError (in a 1-process job here; every rank alike)",
        message=str(err.value),
        time=f"{(time.perf_counter() - start) * 1e3:.1f} ms",
        work=0,
    )


# --- unusual input that must work --------------------------------------------------------------------

# id, what, model, mode, op (the input itself: _unusual_input)
MUST_WORK = [
    ("strided-view-tile", "every other latent column (a strided view), tile", "wan21", "tile", "decode"),
    (
        "transposed-height",
        "a transposed latent (H and W strides swapped), spatial height",
        "wan21",
        "spatial_shard_height",
        "decode",
    ),
    ("channels-last-3d-width", "channels_last_3d latent, spatial width", "wan21", "spatial_shard_width", "decode"),
    (
        "channels-last-image-width",
        "channels_last AutoencoderKL latent, spatial width",
        "autoencoder_kl",
        "spatial_shard_width",
        "decode",
    ),
    ("channels-last-image-tile", "channels_last AutoencoderKL latent, tile", "autoencoder_kl", "tile", "decode"),
    (
        "expanded-batch-image-height",
        "batch of 2 expanded from 1 (stride 0), spatial height",
        "autoencoder_kl",
        "spatial_shard_height",
        "decode",
    ),
    (
        "channels-last-encode-tile",
        "channels_last AutoencoderKL sample, tile encode",
        "autoencoder_kl",
        "tile",
        "encode",
    ),
    (
        "verify-equal-weights",
        "verify_weights(vae) with the same weights on every rank, then auto",
        "wan21",
        "auto",
        "decode",
    ),
]


def _unusual_input(case):
    if case == "strided-view-tile":
        return latent((1, 4, 1, 5, 12))[..., ::2]
    if case == "transposed-height":
        return latent((1, 4, 1, 3, 6)).transpose(-1, -2)
    if case == "channels-last-3d-width":
        return latent((1, 4, 1, 3, 7)).contiguous(memory_format=torch.channels_last_3d)
    if case == "channels-last-image-width":
        return latent((1, 4, 6, 10)).contiguous(memory_format=torch.channels_last)
    if case == "channels-last-image-tile":
        return latent((1, 4, 20, 14)).contiguous(memory_format=torch.channels_last)
    if case == "expanded-batch-image-height":
        return latent((1, 4, 10, 6)).expand(2, -1, -1, -1)
    if case == "channels-last-encode-tile":
        return latent((1, 3, 40, 36)).clamp(-1, 1).contiguous(memory_format=torch.channels_last)
    return latent((1, 4, 1, 3, 4))


def _must_work(rank, world):
    import vaeshard

    out = {}
    for case, _, model, mode, op in MUST_WORK:
        tile = (32, 24) if model == "wan21" else None
        vae = vaeshard.parallelize(build(model, tile), mode=mode, timeout=REQUEST_TIMEOUT_S)
        if case == "verify-equal-weights":
            vaeshard.verify_weights(vae)  # the same weights everywhere: returns, on every rank
        ref_vae = build(model, tile)
        x = _unusual_input(case)
        assert not x.is_contiguous() or case == "verify-equal-weights"
        strategy = vaeshard.plan(vae, x.shape, world, mode, op=op).strategy
        exact = strategy == "tile"

        def diffusers(inp, op=op, ref_vae=ref_vae, exact=exact):
            with torch.no_grad():
                if op == "decode":
                    return ref_vae.tiled_decode(inp).sample if exact else ref_vae.decode(inp).sample
                ref_vae.use_tiling = exact
                return ref_vae._encode(inp)

        got = vae.decode(x).sample if op == "decode" else vae.encode(x).latent_dist.parameters
        same_tensor, contiguous_copy = diffusers(x), diffusers(x.contiguous())
        assert same_tensor.std() > 1e-3  # real values
        diff = (got - same_tensor).abs().max().item()
        # diffusers' own result depends on the layout by a few ulps (other conv kernels); vaeshard makes
        # the input contiguous, so tile stays bit-identical to diffusers on the contiguous copy
        assert diff <= 1e-5, (case, strategy, diff)
        if exact:
            assert torch.equal(got, contiguous_copy), case
        else:
            assert (got - contiguous_copy).abs().max().item() <= 1e-5, case
        out[case] = (strategy, diff, exact)
    return out


def test_non_contiguous_and_channels_last_input_decodes_like_diffusers():
    results = run_ranks(_must_work, 2, timeout=200)
    for case, what, *_ in MUST_WORK:
        strategy, diff, exact = results[0][case]
        worst = max(results[r][case][1] for r in range(2))
        op = "encode" if "encode" in case else "decode"
        reference = (
            f"diffusers' tiled {op} of the same tensor (<= 1e-5) and of its contiguous copy (torch.equal)"
            if exact
            else f"diffusers' untiled {op} of the same tensor and of its contiguous copy (<= 1e-5)"
        )
        report.record("must-work", case, what=what, strategy=strategy, reference=reference, diff=f"{worst:.1e}")


# --- faults ------------------------------------------------------------------------------------------

FAULTS = [
    (
        "exception-spatial-decode",
        "RuntimeError raised on rank 1 at its 3rd latent frame, Wan spatial_shard_height decode",
    ),
    ("exception-tile-decode", "RuntimeError raised on rank 1 in its 3rd decoder call, Wan tile decode"),
    (
        "exception-image-spatial-decode",
        "RuntimeError raised on rank 1 in the mid-block, AutoencoderKL spatial_shard_width decode",
    ),
    ("rank-skips-request", "rank 1 never calls decode (Wan, auto)"),
    ("rank-dies-spatial-decode", "rank 1 killed (os._exit) at its 3rd latent frame, Wan spatial_shard_height decode"),
]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc), so RSS shows what is still in use."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _fault_setup(case):
    """(vae, mode, latent, module to hook, the call of it that faults) for a fault case.

    Wan decodes frame by frame, so its decoder's 3rd call is the 3rd latent frame (or, in tile mode,
    a frame of the rank's 2nd tile); AutoencoderKL's mid-block runs once per decode.
    """
    if case in ("exception-spatial-decode", "rank-dies-spatial-decode"):
        vae = build("wan21", (32, 24))
        return vae, "spatial_shard_height", latent((1, 4, 4, 8, 6)), vae.decoder, 3
    if case == "exception-tile-decode":
        vae = build("wan21", (32, 24))
        return vae, "tile", latent((1, 4, 2, 10, 9)), vae.decoder, 3
    if case == "exception-image-spatial-decode":
        vae = build("autoencoder_kl")
        return vae, "spatial_shard_width", latent((1, 4, 8, 10)), vae.decoder.mid_block, 1
    vae = build("wan21", (32, 24))
    return vae, "auto", latent((1, 4, 2, 6, 8)), vae.decoder, 1


def _one_fault(rank, case, group, on_fault):
    """Run the faulting request of `case` on this rank; returns what this rank observed."""
    import vaeshard
    from vaeshard.runtime import spatial

    vae, mode, z, hooked, at_call = _fault_setup(case)
    vaeshard.parallelize(vae, mode=mode, group=group, timeout=FAULT_TIMEOUT_S)
    calls, armed = {"n": 0}, {"on": False}

    def hook(module, args):
        if not armed["on"]:
            return
        calls["n"] += 1
        if rank == 1 and calls["n"] == at_call:
            on_fault(case)

    handle = hooked.register_forward_pre_hook(hook)
    vae.decode(z)  # the same request once, healthy: allocator pools and lazy state exist before measuring
    armed["on"] = True
    gc.collect()
    rss_before, tensors_before = _rss_bytes(), _live_tensors()
    outcome = {"type": "none", "message": "returned normally", "raised_at": None, "started_at": time.time()}
    try:
        if not (case == "rank-skips-request" and rank == 1):
            vae.decode(z)
    except Exception as exc:  # noqa: BLE001 - the outcome is the subject of the test
        outcome.update(type=type(exc).__name__, message=str(exc), raised_at=time.time())
        del exc
    handle.remove()
    gc.collect()
    feat = getattr(vae, "_feat_map", None)
    outcome.update(
        caches_released=feat is None or all(c is None for c in feat),
        no_shard_context=spatial.current() is None,
        rss_delta=_rss_bytes() - rss_before,
        tensors_delta=_live_tensors() - tensors_before,
    )
    _trim_heap()
    outcome["rss_delta_trimmed"] = _rss_bytes() - rss_before
    return outcome


def _raise_fault(case):
    _FAULT_TIMES[case] = time.time()
    raise RuntimeError(f"injected fault ({case}) on rank 1")


_FAULT_TIMES: dict[str, float] = {}


def _faults_in_one_job(rank, world):
    """Each fault on a group of its own: a failed collective leaves its group unusable, not the others.

    The collective a rank timed out in stays pending inside gloo, holding its buffers, until the group's
    own timeout (FAULT_GROUP_TIMEOUT_S here) ends it; the job checks that everything is released then.
    """
    import torch.distributed as dist

    sync = dist.new_group([0, 1])  # healthy throughout: lines the ranks up before each case
    for model, z in (("wan21", latent((1, 4, 1, 4, 4))), ("autoencoder_kl", latent((1, 4, 8, 8)))):
        with torch.no_grad():  # what building and running a model creates once per process
            build(model).decode(z)
    gc.collect()
    baseline = _live_tensors()
    results = {}
    for case, _ in FAULTS:
        if case.startswith("rank-dies"):
            continue
        dist.barrier(group=sync)
        group = dist.new_group([0, 1], timeout=timedelta(seconds=FAULT_GROUP_TIMEOUT_S))
        results[case] = _one_fault(rank, case, group, _raise_fault)
    for case, outcome in results.items():  # rank-skips-request: the fault is the moment rank 0 started waiting
        outcome["fault_at"] = outcome["started_at"] if case == "rank-skips-request" else _FAULT_TIMES.get(case)
    dist.barrier(group=sync)
    time.sleep(FAULT_GROUP_TIMEOUT_S - FAULT_TIMEOUT_S + 1)  # the last pending collective ends
    gc.collect()
    return {"cases": results, "tensors_left": _live_tensors() - baseline}


def _die(case, path):
    Path(path).write_text(repr(time.time()))
    os._exit(17)


def _dying_rank_job(rank, world, path):
    import torch.distributed as dist

    return {
        "rank-dies-spatial-decode": _one_fault(
            rank, "rank-dies-spatial-decode", dist.group.WORLD, lambda case: _die(case, path)
        )
    }


def _one_shot_worker(rank, world, init_file, results, fn, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
        results.put((rank, True, fn(rank, world, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    results.close()
    results.join_thread()
    os._exit(0)  # a peer may be gone: skip the process group's teardown


def _run_with_deaths(fn, world, *args, timeout: float = 120):
    """Like run_ranks, for a job in which a rank dies on purpose: returns ({rank: result}, exit codes) as
    soon as every rank has reported or exited; fails on a rank that raised."""
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="vaeshard-deaths-")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_one_shot_worker, args=(r, world, os.path.join(tmp, "rendezvous"), results, fn, args), daemon=True
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    outcomes = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=0.5)
                outcomes[rank] = (ok, value)
            except queue_mod.Empty:
                pass
            if all(r in outcomes or p.exitcode is not None for r, p in enumerate(procs)):
                break
        for p in procs:
            p.join(timeout=5)
        while True:
            try:
                rank, ok, value = results.get(timeout=0.2)
                outcomes[rank] = (ok, value)
            except queue_mod.Empty:
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)
    failed = [f"rank {r}:\n{v}" for r, (ok, v) in outcomes.items() if not ok]
    assert not failed, "\n".join(failed)
    return {r: v for r, (ok, v) in outcomes.items()}, [p.exitcode for p in procs]


def _check_and_record_fault(case, what, per_rank: dict, fault_at: float | None, problems: list, after: str = ""):
    times, outcome_text = [], []
    for r in sorted(per_rank):
        o = per_rank[r]
        if o["type"] == "none" and not (case == "rank-skips-request" and r == 1):
            problems.append(f"{case}: rank {r} did not raise")
        if o["raised_at"] is not None and fault_at is not None:
            seconds = o["raised_at"] - fault_at
            times.append(f"rank {r}: {seconds:.2f} s")
            if seconds > FAULT_TIMEOUT_S + FAULT_SLACK_S:
                problems.append(f"{case}: rank {r} raised {seconds:.1f} s after the fault")
        # rank 0 names what it waited for: the rank that never arrived, or the failed exchange
        expected = (
            "rank(s) [1] did not call decode" if case == "rank-skips-request" else "another rank failed or is gone"
        )
        if r == 0 and expected not in o["message"]:
            problems.append(f"{case}: rank 0 raised {o['type']}: {o['message']!r}")
        # a rank that timed out leaves one collective pending in gloo, holding that collective's
        # buffers (at most world + 1 tensors) until the group's own timeout; nothing else may stay
        held = 0 if o["raised_at"] is None or "another rank failed" not in o["message"] else 3
        if not (o["caches_released"] and o["no_shard_context"]) or o["tensors_delta"] > held:
            problems.append(
                f"{case}: rank {r} kept request scratch (feature caches, shard context or {o['tensors_delta']} tensors)"
            )
        shown = o["message"] if len(o["message"]) < 260 else o["message"][:257] + "..."
        outcome_text.append(f"rank {r}: {o['type']}: {shown}")
    scratch = "; ".join(
        f"rank {r}: caches {'released' if o['caches_released'] else 'KEPT'}, shard context "
        f"{'none' if o['no_shard_context'] else 'LEFT'}, live tensors {o['tensors_delta']:+d}, RSS "
        f"{o['rss_delta'] / 2**20:+.1f} MiB ({o['rss_delta_trimmed'] / 2**20:+.1f} MiB after malloc_trim)"
        for r, o in sorted(per_rank.items())
    ) + (f"; {after}" if after else "")
    report.record(
        "fault",
        case,
        what=what,
        timeout=f"{FAULT_TIMEOUT_S:g} s (gloo)",
        outcome="; ".join(outcome_text),
        time=", ".join(times) or "-",
        scratch=scratch,
    )


def test_fault_on_one_rank_makes_every_rank_raise_within_the_timeout():
    jobs = run_ranks(_faults_in_one_job, 2, timeout=150, fresh=True)
    results = [job["cases"] for job in jobs]
    problems = [
        f"rank {r}: {job['tensors_left']} tensors still alive after the groups' own timeout"
        for r, job in enumerate(jobs)
        if job["tensors_left"]
    ]
    for case, what in FAULTS:
        if case.startswith("rank-dies"):
            continue
        per_rank = {r: results[r][case] for r in range(2)}
        fault_at = results[0 if case == "rank-skips-request" else 1][case]["fault_at"]
        after = "after the group's own timeout: live tensors " + ", ".join(
            f"rank {r} {job['tensors_left']:+d}" for r, job in enumerate(jobs)
        )
        _check_and_record_fault(case, what, per_rank, fault_at, problems, after)
        if case != "rank-skips-request":
            assert per_rank[1]["type"] == "RuntimeError" and "injected fault" in per_rank[1]["message"]
        assert per_rank[0]["type"] == "CommTimeout"
    assert not problems, "\n".join(problems)


def test_rank_killed_mid_decode_makes_the_others_raise_within_the_timeout(tmp_path):
    death_file = tmp_path / "died_at"
    outcomes, exit_codes = _run_with_deaths(_dying_rank_job, 2, str(death_file), timeout=120)
    assert exit_codes[1] == 17 and 1 not in outcomes  # rank 1 really died mid-decode
    died_at = float(death_file.read_text())
    case = "rank-dies-spatial-decode"
    per_rank = {0: outcomes[0][case]}
    problems = []
    _check_and_record_fault(case, dict(FAULTS)[case] + " (rank 1 exit code 17)", per_rank, died_at, problems)
    assert per_rank[0]["type"] == "CommTimeout"
    assert not problems, "\n".join(problems)


# --- long-lived workers ------------------------------------------------------------------------------

# model, op, mode, output, shape: tiny requests (~5-50 ms on one CPU core) mixing everything a worker meets
SOAK_SPECS = [
    ("wan21", "decode", "tile", "all", (1, 4, 1, 5, 6)),
    ("wan21", "decode", "spatial_shard_height", "all", (1, 4, 1, 6, 3)),  # portrait
    ("wan21", "decode", "spatial_shard_width", "rank0", (1, 4, 1, 3, 7)),  # landscape
    ("wan21", "decode", "auto", "all", (1, 4, 2, 4, 5)),
    ("wan21", "decode", "auto", "rank0", (1, 4, 1, 2, 2)),
    ("wan21", "decode", "tile", "all", (1, 4, 1, 3, 3)),  # a single tile: direct
    ("wan21", "encode", "tile", "all", (1, 3, 1, 40, 40)),
    ("wan21", "encode", "spatial_shard_height", "all", (1, 3, 1, 32, 16)),
    ("wan21", "encode", "auto", "rank0", (1, 3, 1, 16, 24)),
    ("autoencoder_kl", "decode", "tile", "all", (1, 4, 20, 14)),
    ("autoencoder_kl", "decode", "spatial_shard_width", "all", (1, 4, 6, 10)),
    ("autoencoder_kl", "decode", "spatial_shard_height", "rank0", (1, 4, 10, 6)),
    ("autoencoder_kl", "decode", "auto", "all", (2, 4, 7, 9)),
    ("autoencoder_kl", "encode", "tile", "all", (1, 3, 40, 36)),
    ("autoencoder_kl", "encode", "auto", "all", (1, 3, 16, 16)),
]
SOAK_SEEDS = (1, 2)


def _live_tensors() -> int:
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def _soak(rank, world, num_requests):
    """One worker serving a warm-up pass over every distinct request, then `num_requests` drawn at random.

    The Wan VAE runs on the default group and the AutoencoderKL on a second group of the same ranks,
    so requests on two groups interleave. Every result is compared with the same model in this
    process: tile with torch.equal against diffusers' tiled decode/encode, spatial and direct within
    1e-5 of the untiled one.
    """
    import statistics

    import torch.distributed as dist

    import vaeshard

    second = dist.new_group([0, 1])
    served = {"wan21": build("wan21", (32, 24)), "autoencoder_kl": build("autoencoder_kl")}
    plain = {"wan21": build("wan21", (32, 24)), "autoencoder_kl": build("autoencoder_kl")}
    groups = {"wan21": None, "autoencoder_kl": second}
    references: dict[tuple[int, int], tuple[torch.Tensor, bool]] = {}
    tally = {"checked": 0, "empty": 0, "worst_spatial": 0.0, "strategies": {}}

    def reference(k, seed, x):
        if (k, seed) not in references:
            model, op, mode, _, shape = SOAK_SPECS[k]
            ref = plain[model]
            exact = vaeshard.plan(served[model], shape, world, mode, op=op).strategy == "tile"
            with torch.no_grad():
                if op == "decode":
                    value = ref.tiled_decode(x).sample if exact else ref.decode(x).sample
                else:
                    ref.use_tiling = exact
                    value = ref._encode(x)
                    ref.use_tiling = False
            references[(k, seed)] = (value, exact)
        return references[(k, seed)]

    def serve(k, seed):
        model, op, mode, output, shape = SOAK_SPECS[k]
        x = latent(shape, seed=seed)
        if op == "encode":
            x = x.clamp(-1, 1)
        vae = vaeshard.parallelize(
            served[model], mode=mode, output=output, group=groups[model], timeout=REQUEST_TIMEOUT_S
        )
        strategy = vaeshard.plan(vae, shape, world, mode, op=op).strategy
        tally["strategies"][f"{op} {strategy}"] = tally["strategies"].get(f"{op} {strategy}", 0) + 1
        start = time.perf_counter()
        if op == "decode":
            got = vae.decode(x).sample
        else:
            posterior = vae.encode(x).latent_dist
            got = posterior.parameters if posterior is not None else x.new_empty(0)
        seconds = time.perf_counter() - start
        if output == "rank0" and rank != 0:
            assert got.numel() == 0
            tally["empty"] += 1
            return seconds
        want, exact = reference(k, seed, x)
        if exact:
            assert torch.equal(got, want), (SOAK_SPECS[k], seed)
        else:
            diff = (got - want).abs().max().item()
            assert diff <= 1e-5, (SOAK_SPECS[k], seed, diff)
            tally["worst_spatial"] = max(tally["worst_spatial"], diff)
        tally["checked"] += 1
        return seconds

    distinct = [(k, s) for k in range(len(SOAK_SPECS)) for s in SOAK_SEEDS]
    for k, s in distinct:  # warm-up: allocator pools, lazily built modules, the reference cache
        serve(k, s)
    gc.collect()
    rss_before, tensors_before = _rss_bytes(), _live_tensors()
    _trim_heap()
    trimmed_before = _rss_bytes()
    order = random.Random(0).choices(distinct, k=num_requests)  # the same order on every rank
    tally.update(checked=0, empty=0, strategies={})
    times = [serve(k, s) for k, s in order]
    gc.collect()
    rss_after, tensors_after = _rss_bytes(), _live_tensors()
    _trim_heap()
    trimmed_after = _rss_bytes()
    return {
        "trimmed_before": trimmed_before,
        "trimmed_after": trimmed_after,
        "warmup": len(distinct),
        "requests": num_requests,
        "checked": tally["checked"],
        "empty": tally["empty"],
        "worst_spatial": tally["worst_spatial"],
        "strategies": tally["strategies"],
        "median_ms": statistics.median(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "tensors_before": tensors_before,
        "tensors_after": tensors_after,
    }


RSS_BOUND_MIB = 16  # growth allowed over the measured requests (allocator noise; a leak of one result per
# request of the largest spec would exceed it within the CI count)


def test_soak_mixed_requests_exact_and_no_growth():
    results = run_ranks(_soak, 2, SOAK_REQUESTS, timeout=400)
    for r, res in enumerate(results):
        assert res["checked"] + res["empty"] == SOAK_REQUESTS
        assert res["tensors_after"] == res["tensors_before"], (r, res["tensors_before"], res["tensors_after"])
        assert res["rss_after"] - res["rss_before"] <= RSS_BOUND_MIB * 2**20, (r, res["rss_before"], res["rss_after"])
    mix = ", ".join(f"{n} {s}" for s, n in sorted(results[0]["strategies"].items()))
    memory = "; ".join(
        f"rank {r}: RSS {res['rss_before'] / 2**20:.1f} -> {res['rss_after'] / 2**20:.1f} MiB "
        f"({(res['rss_after'] - res['rss_before']) / 2**20:+.1f}; after malloc_trim "
        f"{res['trimmed_before'] / 2**20:.1f} -> {res['trimmed_after'] / 2**20:.1f}), "
        f"live tensors {res['tensors_before']} -> "
        f"{res['tensors_after']}"
        for r, res in enumerate(results)
    )
    report.record(
        "soak",
        f"soak-{SOAK_REQUESTS}",
        what=f"2 gloo ranks; Wan 2.1 (small) on the default group and AutoencoderKL (small) on a second group "
        f"of the same ranks, interleaved; {len(SOAK_SPECS)} request kinds x {len(SOAK_SEEDS)} latents "
        "(shapes, portrait/landscape, tile/auto/height/width, decode/encode, output all/rank0)",
        requests=f"{results[0]['warmup']} warm-up + {SOAK_REQUESTS} measured: {mix}",
        results=f"rank 0 checked {results[0]['checked']}, rank 1 checked {results[1]['checked']} "
        f"(+{results[1]['empty']} empty rank0-output results); tile bit-identical, "
        f"spatial/direct worst {max(res['worst_spatial'] for res in results):.1e}",
        time=f"median {results[0]['median_ms']:.0f} ms, max {results[0]['max_ms']:.0f} ms",
        memory=memory,
    )
    for key, value in report.environment_meta().items():
        report.record("meta", key, value=value)


def _two_groups(rank, world):
    """Ranks {0, 1} serve a Wan VAE on one group while ranks {2, 3} serve an AutoencoderKL on another."""
    import torch.distributed as dist

    import vaeshard

    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    if rank < 2:
        requests = [("spatial_shard_height", (1, 4, 1, 6, 3)), ("tile", (1, 4, 1, 5, 6))] * 2
        model, group = "wan21", low
    else:
        requests = [("tile", (1, 4, 20, 14)), ("spatial_shard_width", (1, 4, 6, 10))] * 3
        model, group = "autoencoder_kl", high
    tile = (32, 24) if model == "wan21" else None
    vae, plain = build(model, tile), build(model, tile)
    worst = 0.0
    start = time.perf_counter()
    for i, (mode, shape) in enumerate(requests):
        z = latent(shape, seed=i)
        vaeshard.parallelize(vae, mode=mode, group=group, timeout=REQUEST_TIMEOUT_S)
        got = vae.decode(z).sample
        with torch.no_grad():
            if mode == "tile":
                assert torch.equal(got, plain.tiled_decode(z).sample)
            else:
                worst = max(worst, (got - plain.decode(z).sample).abs().max().item())
    assert worst <= 1e-5
    return {"model": model, "requests": len(requests), "worst": worst, "seconds": time.perf_counter() - start}


def test_two_vaes_on_two_groups_work_independently():
    results = run_ranks(_two_groups, 4, timeout=200)
    report.record(
        "soak",
        "two-groups",
        what="4 gloo ranks: Wan 2.1 on group {0, 1} and AutoencoderKL on group {2, 3}, at the same time, "
        "different request counts and modes",
        requests=f"{results[0]['requests']} on {{0, 1}}, {results[2]['requests']} on {{2, 3}}",
        results=f"every result checked on every rank; tile bit-identical, spatial worst "
        f"{max(r['worst'] for r in results):.1e}",
        time=f"{max(r['seconds'] for r in results):.1f} s for the whole run",
        memory="-",
    )


# --- the document ------------------------------------------------------------------------------------


def report_ids() -> list[str]:
    return (
        [c[0] for c in BAD_INPUTS]
        + ["size-larger-than-group-late"]
        + [c[0] for c in MUST_WORK]
        + [c[0] for c in FAULTS]
        + ["two-groups"]
        + ARRIVAL_IDS
        + SERVICE_IDS
        + HTTP_IDS
        + SERVICE_FAULT_IDS
    )


def test_reliability_doc_has_a_row_for_every_case():
    text = report.DOC.read_text(encoding="utf-8")
    assert report.BEGIN in text and report.END in text
    table = text.split(report.BEGIN, 1)[1].split(report.END, 1)[0]
    missing = [i for i in report_ids() if f"`{i}`" not in table]
    assert not missing, f"docs/reliability.md lacks rows {missing}: run python -m tests.reliability_report"
    assert re.search(r"`soak-\d+`", table)
