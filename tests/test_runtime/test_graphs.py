"""CUDA graph replay of a video decoder's steady calls (graphs.py): what can be checked without a GPU.

The capture itself needs CUDA; its values are checked on the GPU by benchmarks/gpu_parity.py (graphs
on against graphs off, bit for bit, and against diffusers). Here: the cache bookkeeping that makes a
replay read what the eager call would, which decoder calls the Wan loop marks as steady, and the
setting's plumbing.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from ..models import build, latent


def test_copy_back_writes_replaced_cache_entries_into_the_old_tensors():
    from vaeshard.runtime.graphs import _copy_back

    kept = torch.randn(2, 3)
    old = torch.randn(1, 2, 2, 3)
    new = torch.randn(1, 2, 2, 3)
    before = [None, kept, old]
    after = [None, kept, new]
    _copy_back(before, after)
    assert torch.equal(old, new) and old is not new
    assert after[2] is new  # the caller restores the list; _copy_back only moves values


@pytest.mark.parametrize(
    "old,new,message",
    [
        (torch.zeros(1, 2, 2), torch.zeros(1, 2, 1), "changed from"),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64), "changed from"),
        ("Rep", torch.zeros(2), "not a tensor"),
        (None, torch.zeros(2), "not a tensor"),
    ],
)
def test_copy_back_refuses_a_call_that_is_not_steady(old, new, message):
    from vaeshard.runtime.graphs import CaptureFailed, _copy_back

    with pytest.raises(CaptureFailed, match=message):
        _copy_back([old], [new])
    with pytest.raises(CaptureFailed, match="number of cache entries"):
        _copy_back([old], [old, new])


def test_decoder_steps_off_the_gpu_run_every_call_eagerly():
    from vaeshard.runtime.graphs import DecoderSteps

    seen = []
    with DecoderSteps(torch.device("cpu"), graphs=True, num_calls=21) as steps:
        assert not steps.enabled
        for k in range(21):
            y = steps.call(lambda x: seen.append(x) or x * 2, torch.full((1,), float(k)), [], steady=k > 0)
            assert y.item() == 2 * k
    assert len(seen) == 21 and not steps.captured


@pytest.mark.parametrize(
    "num_frames,per_step,expected",
    [
        (6, 1, [False, True, True, True, True, True]),
        (6, 2, [False, True, True, False]),  # 1 + 2 + 2 + 1 frames: the shorter last call is not steady
        (7, 3, [False, True, True]),
        (1, 2, [False]),
    ],
)
def test_wan_loop_marks_the_calls_of_one_shape_steady(monkeypatch, num_frames, per_step, expected):
    import vaeshard
    from vaeshard.runtime import graphs

    made = []

    class Recorder(graphs.DecoderSteps):
        def __init__(self, device, enabled, num_calls, keep=None):
            super().__init__(device, enabled, num_calls, keep)
            self.flags, self.shapes = [], []
            made.append(self)

        def call(self, step, x, state, steady):
            self.flags.append(steady)
            self.shapes.append(x.shape[2])
            return super().call(step, x, state, steady)

    monkeypatch.setattr(graphs, "DecoderSteps", Recorder)
    vae = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(frames_per_step=per_step))
    z = latent((1, 4, num_frames, 4, 3))
    out = vae.decode(z).sample
    with torch.no_grad():
        ref = build("wan21").decode(z).sample
    assert (out - ref).abs().max() <= 1e-5
    (steps,) = made
    assert steps.flags == expected
    assert steps.num_calls == len(expected)
    steady_frames = {n for n, f in zip(steps.shapes, steps.flags) if f}
    assert steady_frames <= {per_step}


@pytest.mark.parametrize(
    "exact,cuda_graphs,seen",
    [
        (False, True, "(set, but"),
        (False, False, "off (set)"),
        (True, True, None),
        (False, "auto", "(auto: the frame is at most"),
    ],
)
def test_cuda_graphs_setting_reaches_the_request(exact, cuda_graphs, seen):
    """The request's plan, resolved once before the decode (the same as vaeshard.plan's), carries the
    setting's decision: on this CPU none replays, and the reason says why; the exact tier has none."""
    import vaeshard
    from vaeshard.layers import tier

    for wrong in (1, "on", None):
        with pytest.raises(TypeError, match="cuda_graphs must be True, False or 'auto'"):
            vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cuda_graphs=wrong))
    vae = vaeshard.parallelize(build("wan21"), exact=exact, fast=vaeshard.FastOptions(cuda_graphs=cuda_graphs))
    (plan,) = _seen_in_a_request(vae, tier.current)
    assert plan == vaeshard.plan(vae, (1, 4, 2, 3, 3)).fast
    if seen is None:
        assert plan is None
    else:
        assert plan.cuda_graphs is False and seen in dict(plan.reasons)["cuda_graphs"], plan.reasons
    assert tier.current() is None  # outside a request


def _seen_in_a_request(vae, setting) -> set:
    """What `setting()` answers inside a decode of `vae` (read as its decoder starts)."""
    values = []
    handle = vae.decoder.conv_in.register_forward_pre_hook(lambda m, a: values.append(setting()))
    try:
        vae.decode(latent((1, 4, 2, 3, 3)))
    finally:
        handle.remove()
    assert values
    return set(values)


def test_auto_replays_where_a_rank_s_frames_are_small():
    # "auto": replayed at Wan 2.1 480p on 2 ranks (measured faster: the host paced the eager decode),
    # not at 720p on 1 or 2 (measured slower: the GPU paced it); True and False as given; never with
    # too few decoder calls to replay (the plan, as on a GPU)
    import vaeshard
    from vaeshard import policy, tuning

    vae, cuda = build("wan21"), torch.device("cuda", 0)

    def graphed(latent_hw, world, strategy, setting, frames=21):
        options = vaeshard.FastOptions(cuda_graphs=setting, frames_per_step=1)
        return policy.resolve_fast(vae, (1, 4, frames, *latent_hw), world, strategy, options, device=cuda).cuda_graphs

    assert graphed((60, 104), 2, "spatial_shard_height", "auto")  # 832 x 240 pixels a rank
    assert not graphed((90, 160), 2, "spatial_shard_height", "auto") and not graphed((90, 160), 1, "direct", "auto")
    assert 64 * 64 * 64 == tuning.GRAPHS_MAX_PIXELS
    assert graphed((64, 64), 1, "direct", "auto") and not graphed((64, 65), 1, "direct", "auto")
    assert graphed((90, 160), 1, "direct", True) and not graphed((60, 104), 2, "spatial_shard_height", False)
    assert not graphed((60, 104), 2, "spatial_shard_height", True, frames=4)  # 4 calls: too few to replay


@pytest.mark.parametrize("mode,graphed", [("auto", True), ("off", False), ("on", True)])
def test_the_wan_loop_asks_for_graphs_by_this_rank_s_frame(monkeypatch, capsys, mode, graphed):
    # the loop passes DecoderSteps the plan's decision for the rank's own output frame (a small
    # model's frame is far below the threshold; the plan here as if the device could replay); the
    # recorded steps then run eagerly all the same
    import vaeshard
    from vaeshard.cli import build_parser
    from vaeshard.layers import tier
    from vaeshard.runtime import graphs

    monkeypatch.setattr(graphs, "replays", lambda device, num_calls: True)
    made, frames = [], []

    class Recorder(graphs.DecoderSteps):
        def __init__(self, device, enabled, num_calls, keep=None):
            made.append(enabled)
            frames.append(tier.current().frame_pixels)
            super().__init__(device, False, num_calls, keep)

    monkeypatch.setattr(graphs, "DecoderSteps", Recorder)
    command = ["decode", "z.pt", "--config", "wan21", "--out", "o.mp4", "--cuda-graphs"]
    setting = build_parser().parse_args([*command, mode]).cuda_graphs  # as the command line reads it
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "yes"])
    assert "expected auto, on or off" in capsys.readouterr().err
    vae = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cuda_graphs=setting))
    vae.decode(latent((1, 4, 3, 4, 3)))
    ratio = vae.spatial_compression_ratio
    assert frames == [4 * 3 * ratio * ratio] and made == [graphed]


def _record_decoder_steps(monkeypatch) -> list:
    """(graphs wanted, keep) of each graphs.DecoderSteps the Wan loop makes from now on."""
    from vaeshard.runtime import graphs

    made = []

    class Recorder(graphs.DecoderSteps):
        def __init__(self, device, enabled, num_calls, keep=None):
            super().__init__(device, enabled, num_calls, keep)
            made.append((enabled, keep))

    monkeypatch.setattr(graphs, "DecoderSteps", Recorder)
    return made


@pytest.mark.parametrize(
    "free, reserved, allocated, released",
    [
        (1 << 30, 100 << 30, 2 << 30, True),  # 98 GiB cached, 1 GiB free: the pool could not reach it
        (50 << 30, 30 << 30, 2 << 30, False),  # more free than cached: nothing to give back
        (1 << 30, 2 << 30, 2 << 30, False),  # nothing cached
    ],
)
def test_cached_memory_goes_back_to_the_driver_before_a_graphed_request(
    monkeypatch, free, reserved, allocated, released
):
    # the allocator does not give cached blocks back while allocating to a user memory pool: a graphed
    # request releases them first where they exceed what the driver has free (graphs.release_if_cached)
    from vaeshard.runtime import graphs

    emptied = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 141 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    assert graphs.release_if_cached(torch.device("cuda", 0)) == released
    assert emptied == ([1] if released else [])


def test_keep_cuda_graphs_is_checked_and_reaches_the_request():
    import vaeshard
    from vaeshard.layers import tier

    for wrong in (1, "yes", None):
        with pytest.raises(TypeError, match="keep_cuda_graphs must be True or False"):
            vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(keep_cuda_graphs=wrong))
    with pytest.raises(ValueError, match="cuda_graphs=False replays none"):
        vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cuda_graphs=False, keep_cuda_graphs=True))
    for exact, seen in ((False, True), (True, False)):
        vae = vaeshard.parallelize(build("wan21"), exact=exact, fast=vaeshard.FastOptions(keep_cuda_graphs=True))
        assert _seen_in_a_request(vae, lambda: tier.current() is not None and tier.current().keep_cuda_graphs) == {seen}
    assert tier.current() is None  # outside a request


def _keeps_asked(monkeypatch, vae, latents, between=None):
    """The `keep` argument the Wan loop gave DecoderSteps for each of `latents` decoded in turn
    (`between(i)` runs before decode i)."""
    made = _record_decoder_steps(monkeypatch)
    for i, z in enumerate(latents):
        if between is not None:
            between(i)
        vae.decode(z)
    return [keep for _, keep in made]


def test_the_wan_loop_keeps_graphs_under_a_signature_of_shapes_settings_and_weights(monkeypatch):
    import vaeshard

    vae = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cuda_graphs=True, keep_cuda_graphs=True))
    z, taller = latent((1, 4, 5, 4, 3)), latent((1, 4, 5, 5, 3))
    weight = vae.decoder.conv_in.weight

    def between(i):
        if i == 3:
            with torch.no_grad():
                weight.mul_(1.0)  # in place: the same address, a new version

    keeps = _keeps_asked(monkeypatch, vae, [z, latent((1, 4, 7, 4, 3)), taller, z, z], between)
    assert all(k is not None and k[0] is vae for k in keeps)
    signatures = [k[1] for k in keeps]
    assert signatures[0] == signatures[1]  # more frames: the same calls
    assert signatures[2] != signatures[0]  # other frame sizes
    assert signatures[3] != signatures[0]  # the weights changed in place
    assert signatures[4] == signatures[3]
    off = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(cuda_graphs=True))
    assert _keeps_asked(monkeypatch, off, [z]) == [None]


def test_the_keep_signature_names_the_shard_and_holds_its_group():
    import vaeshard
    from vaeshard.families.wan import frames as wan_frames
    from vaeshard.layers import tier
    from vaeshard.runtime import comm as comm_mod
    from vaeshard.runtime import spatial

    vae = vaeshard.parallelize(build("wan21"))
    z = latent((1, 4, 5, 4, 3))
    group = object()

    def keep(rank, extents, axis=spatial.HEIGHT, g=group):
        ctx = spatial.ShardContext(
            comm=comm_mod.Comm(group=g, rank=rank, world=len(extents)), axis=axis, extents=extents
        )
        with tier.active(tier.FastPlan()), spatial.sharding(ctx):
            return wan_frames._keep_graphs(vae, z, 1)

    first = keep(0, [4, 4])
    assert first[2] == (group,) and first[1] == keep(0, [4, 4])[1]
    for other in (keep(1, [4, 4]), keep(0, [4, 3]), keep(0, [4, 4], spatial.WIDTH), keep(0, [4, 4], g=object())):
        assert other[1] != first[1]
    with tier.active(tier.FastPlan()):
        assert wan_frames._keep_graphs(vae, z, 1)[1] != first[1]  # unsharded
        assert wan_frames._keep_graphs(vae, z, 2)[1] != wan_frames._keep_graphs(vae, z, 1)[1]  # frames per call
        tf32 = torch.backends.cudnn.allow_tf32
        before = wan_frames._keep_graphs(vae, z, 1)[1]
        try:
            torch.backends.cudnn.allow_tf32 = not tf32  # other convolution kernels
            assert wan_frames._keep_graphs(vae, z, 1)[1] != before
        finally:
            torch.backends.cudnn.allow_tf32 = tf32


def test_kept_graphs_are_released_on_request_and_with_the_settings():
    import vaeshard
    from vaeshard.runtime import graphs

    vae = vaeshard.parallelize(build("wan21"), fast=vaeshard.FastOptions(keep_cuda_graphs=True))

    freed = []

    class Kept:  # what a graphed request leaves (it needs CUDA to make one)
        def free(self):
            freed.append(self)

    def keep_some():  # on two devices
        graphs._kept.setdefault(vae, {}).update({0: Kept(), 1: Kept()})

    keep_some()
    assert vaeshard.release(vae) == 2 and vaeshard.release(vae) == 0
    assert len(freed) == 2
    keep_some()
    vaeshard.parallelize(
        vae, fast=vaeshard.FastOptions(keep_cuda_graphs=True, frames_per_step=2)
    )  # new settings: captured under the old
    assert graphs._kept.get(vae) is None and len(freed) == 4
    keep_some()
    vaeshard.unparallelize(vae)
    assert graphs._kept.get(vae) is None and len(freed) == 6
    assert vaeshard.release(build("wan21")) == 0


def test_decoder_steps_off_the_gpu_keep_nothing():
    from vaeshard.runtime import graphs

    owner = build("wan21")
    with graphs.DecoderSteps(torch.device("cpu"), graphs=True, num_calls=21, keep=(owner, ("sig",), ())) as steps:
        assert not steps.enabled and steps.keep is None
        steps.call(lambda x: x, torch.zeros(1), [], steady=False)
    assert graphs._kept.get(owner) is None


@pytest.mark.parametrize(
    "old_frames,new_frames",
    [(1, 4), (1, 2), (1, 1), ("Rep", 1), ("Rep", 2), (None, 4), (2, 1), (None, 1), ("last", 1), ("last", 4)],
)
def test_a_cache_target_receives_the_values_a_new_cache_entry_would_hold(old_frames, new_frames):
    # capturing a request's second call with kept graphs, the call writes each new cache entry into
    # the tensor the steady graph reads (graphs.cache_target): the same values as without a target
    from vaeshard.layers.buffers import store_cache
    from vaeshard.runtime import graphs

    # ("last": the old entry is the first call's one-frame cache kept in the target's last frame)
    g = torch.Generator().manual_seed(0)
    target = torch.full((1, 3, 2, 4, 5), float("nan"))
    if isinstance(old_frames, int):
        old = torch.randn(1, 3, old_frames, 4, 5, generator=g)
    elif old_frames == "last":
        old = target[:, :, -1:]
        old.copy_(torch.randn(1, 3, 1, 4, 5, generator=g))
    else:
        old = old_frames
    frames = torch.randn(1, 3, new_frames, 4, 5, generator=g)
    plain = [None, old.clone() if isinstance(old, torch.Tensor) else old]
    store_cache(plain, 1, plain[1], frames)
    targeted = [None, old]
    with graphs.writing_caches_into([None, target]):
        store_cache(targeted, 1, old, frames)
    assert torch.equal(targeted[1], plain[1])
    if old_frames is None and new_frames == 1:  # the first call: one frame, in the target's last
        assert targeted[1].shape == (1, 3, 1, 4, 5) and targeted[1].data_ptr() == target[:, :, -1:].data_ptr()
    else:
        assert plain[1].shape == (1, 3, 2, 4, 5) and targeted[1] is target
    assert graphs.cache_target(1) is None  # outside that capture


def test_a_failed_capture_of_the_first_calls_runs_them_eagerly_without_cache_targets():
    # (the capture itself needs CUDA: here it fails as an uncapturable call's would) the call then
    # runs eagerly, writing its caches as any eager call does, and the next request will not try again
    from vaeshard.runtime import graphs

    kept_state = [torch.zeros(1, 2, 2, 3)]
    steps = graphs.DecoderSteps(torch.device("cpu"), graphs=False, num_calls=21)
    steps.enabled = True  # as on CUDA
    steps.kept = graphs.KeptCalls(signature=("sig",), pool=None, steady=None, state=kept_state)
    targets_seen = []

    def capture(step, x, state, copy_into):
        targets_seen.append(graphs.cache_target(0))
        raise graphs.CaptureFailed("RuntimeError: not capturable")

    steps._capture = capture

    def step(x):
        targets_seen.append(graphs.cache_target(0))
        return x + 1

    state = [None]
    assert torch.equal(steps._call_kept(0, step, torch.zeros(1), state, steady=False), torch.ones(1))
    assert targets_seen == [kept_state[0], None]  # the targets during the capture only
    assert steps.kept.eager_first_calls and steps.kept.first is None
    assert torch.equal(steps._call_kept(1, step, torch.zeros(1), state, steady=True), torch.ones(1))
    assert targets_seen[2:] == [None]  # the second call eagerly too, no capture tried
