"""The benchmark scripts' own arithmetic (the scripts run on GPU machines; their logic is checked here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _frames(path: str, line: int, name: str) -> list[dict]:
    return [
        {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 1, "name": "pad"},
        {"filename": path, "line": line, "name": name},
    ]


def test_peak_breakdown_finds_the_peak_and_its_live_blocks_by_source():
    prof = _load("profile_decode")
    conv = _frames("/x/site-packages/diffusers/models/autoencoders/autoencoder_kl_wan.py", 170, "forward")
    halo = _frames("/repo/src/vaeshard/comm.py", 150, "halo_pad")
    entries = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": conv},
        {"action": "alloc", "addr": 2, "size": 50, "frames": halo},
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 120, "frames": conv},  # live: 50 + 120 = 170, the peak
        {"action": "alloc", "addr": 4, "size": 7, "frames": []},  # 177: a new peak, from elsewhere
        {"action": "free_requested", "addr": 3, "size": 120},
        {"action": "alloc", "addr": 5, "size": 60, "frames": halo},  # 117: below the peak
        {"action": "free_requested", "addr": 99, "size": 5},  # a block from before the trace: ignored
    ]
    peak, sites = prof.peak_breakdown(entries)
    assert peak == 177
    assert sites == [
        ("diffusers/models/autoencoders/autoencoder_kl_wan.py:170 forward", 120),
        ("vaeshard/comm.py:150 halo_pad", 50),
        ("(outside vaeshard and diffusers)", 7),
    ]


def test_idle_gaps_are_attributed_to_the_kernel_that_ends_them():
    import types

    import torch

    prof_mod = _load("profile_decode")
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(start, end, name, device=cuda):
        return types.SimpleNamespace(
            time_range=types.SimpleNamespace(start=start, end=end), name=name, device_type=device
        )

    events = [
        event(0, 100, "sm90_xmma_fprop_implicit_gemm"),
        event(50, 120, "ncclDevKernel_SendRecv"),  # overlaps: no gap
        event(0, 1000, "aten::conv3d", device=cpu),  # host events are not GPU time
        event(170, 200, "sm90_xmma_fprop_implicit_gemm"),  # 50 us idle before a convolution
        event(205, 300, "_rms_norm_silu_kernel"),  # 5 us: below the 10 us threshold
        event(400, 420, "ncclDevKernel_SendRecv"),  # 100 us idle before NCCL
        event(440, 500, "sm90_xmma_fprop_implicit_gemm"),  # 20 us before a convolution
    ]
    span, idle, gaps = prof_mod._idle_gaps(types.SimpleNamespace(events=lambda: events))
    assert span == 500e-6
    assert abs(idle - 170e-6) < 1e-12
    assert gaps.keys() == {"convolution", "communication (NCCL)"}
    assert abs(gaps["convolution"][0] - 70e-6) < 1e-12 and gaps["convolution"][1] == 2
    assert abs(gaps["communication (NCCL)"][0] - 100e-6) < 1e-12 and gaps["communication (NCCL)"][1] == 1
    # busy: the union of the kernel intervals, 0-120, 170-200, 205-300, 400-420, 440-500 us
    busy = prof_mod._busy_seconds(types.SimpleNamespace(events=lambda: events))
    assert abs(busy - (120 + 30 + 95 + 20 + 60) * 1e-6) < 1e-12


def test_timeline_splits_kernels_by_decoder_call_at_the_marker_kernels():
    prof = _load("profile_decode")
    spin = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
    spans = sorted(
        [
            (0, 1, spin),  # call 0
            (1, 400, "sm90_xmma_fprop_implicit_gemm"),
            (450, 500, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"),  # 50 us idle before it
            (500, 600, "_rms_norm_silu_kernel"),  # then 400 us idle until the next call's marker
            (1000, 1001, spin),  # call 1
            (1001, 1300, "sm90_xmma_fprop_implicit_gemm"),
            (1100, 1200, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"),  # overlaps: not idle
            (1350, 1400, "Memcpy DtoD (Device -> Device)"),  # 50 us idle before it, the last kernel
        ]
    )
    (nccl0, idle0), (nccl1, idle1) = prof.per_call(spans, 2)
    assert (nccl0, nccl1) == (0.05, 0.1)
    assert abs(idle0 - 0.451) < 1e-9  # 1000 us window: 1 us marker, 399 + 50 + 100 busy
    assert abs(idle1 - 0.051) < 1e-9  # up to the last kernel's end: 1 us marker, 299 + 50 busy
    assert prof.per_call(spans, 3) is None  # a marker missing: no split
    # kernel classes the tables rely on
    assert (
        prof.classify("fmha_cutlassF_bf16_aligned_32x128_gmem_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass")
        == "attention"
    )
    assert prof.classify("Memcpy DtoD (Device -> Device)") == "cat / pad / copy"
    assert prof.classify("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == "convolution"
    # PyTorch's GroupNorm statistics (before: "other", half of an image VAE's decode at 1024^2)
    name = "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16, float>(long, float*)"
    assert prof.classify(name) == "norm (fp32)"


def test_memory_model_counts_storages_until_their_last_tensor_is_gone():
    import torch

    model = _load("memory_model")
    weight = torch.empty(1000, device="meta")  # external: never counted
    with model.LiveBytes([weight]) as live:
        a = torch.empty(100, device="meta")  # 400 B
        b = a.view(10, 10)  # same storage: nothing new
        w = weight.view(10, 100)  # a view of an external storage: nothing new
        c = torch.empty(50, device="meta")  # 600 B live
        del a
        assert live.current == 600  # b still uses a's storage
        del b
        assert live.current == 200
        d = torch.empty(300, device="meta")  # 1400 B: the peak
        c.add_(1)  # in place: nothing new
        del d
    assert (live.peak, live.current) == (1400, 200)
    del c, w


def test_memory_model_counts_the_bytes_copies_write_by_source_line():
    import torch

    model = _load("memory_model")
    a = torch.empty(2, 3, 4, device="meta", dtype=torch.bfloat16)
    with model.CopiedBytes() as copies:
        a.clone()  # 48 bytes
        torch.cat([a, a], dim=0)  # 96
        a[:, :, :2].copy_(a[:, :, 2:])  # 24
        a.zero_()  # 48
        a.add_(1)  # not a copy
    by_op = {}
    for key, nbytes in copies.bytes.items():
        by_op[key.split()[0]] = by_op.get(key.split()[0], 0) + nbytes
    assert by_op == {"clone": 48, "cat": 96, "copy_": 24, "zero_": 48}
    assert sum(copies.calls.values()) == 4


def test_memory_model_predicts_a_sharded_decode_below_a_direct_one():
    import torch
    from diffusers import AutoencoderKLWan

    import vaeshard

    model = _load("memory_model")
    with torch.device("meta"):
        vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1).eval()
    vaeshard.parallelize(vae)
    z = torch.empty(1, 4, 3, 6, 8, device="meta")
    one, sites = model.predicted_peak(vae, z, 1)
    two, _ = model.predicted_peak(vae, z, 2)
    four, _ = model.predicted_peak(vae, z, 4)
    assert one > two > four > 0
    assert sum(size for _, size in sites) == one
    assert any("store_cache" in site for site, _ in sites)  # the causal caches (allocated there)


def test_memory_model_sees_the_frame_settings():
    """Fewer frames per layer lower the predicted peak, more latent frames per step raise it (the
    direction BENCHMARKS.md reports for the real configs)."""
    import torch
    from diffusers import AutoencoderKLWan

    import vaeshard

    model = _load("memory_model")
    with torch.device("meta"):
        vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1).eval()
    vaeshard.parallelize(vae)
    z = torch.empty(1, 4, 5, 12, 16, device="meta")
    for ranks in (1, 2):
        one, _ = model.predicted_peak(vae, z, ranks, frames_per_step=1)
        split, _ = model.predicted_peak(vae, z, ranks, frames_per_step=1, max_layer_frames=2)
        batched, _ = model.predicted_peak(vae, z, ranks, frames_per_step=2)
        auto, _ = model.predicted_peak(vae, z, ranks)  # frames this small: 2 per step, as on CUDA
        assert split < one < batched == auto, (ranks, split, one, batched, auto)


def test_bench_table_shows_reserved_memory_beside_allocated_on_cuda():
    """The CUDA table has a reserved column (the caching allocator's peak) after the allocated one,
    per rank; a CPU table (RSS) has none."""
    from vaeshard.cli.bench import BenchResult
    from vaeshard.cli.report import bench_table

    gib = 2**30
    result = BenchResult(
        subject="s",
        shape=(1, 16, 2, 4, 4),
        dtype="bf16",
        device="cuda",
        reps=3,
        flops=None,
        flops_source=None,
        peak_tflops=None,
        reference={
            "seconds": 1.0,
            "peak_bytes": gib,
            "peak_reserved_bytes": 2 * gib,
            "seconds_reps": [1.0],
            "out_shape": [1],
            "peak_over_process_life": False,
        },
    )
    result.rows.append(
        dict(
            mode="auto",
            nproc=2,
            strategy="spatial_shard_width",
            fallback=False,
            seconds=0.5,
            speedup_vs_diffusers=2.0,
            utilisation=None,
            peak_bytes_per_rank=[gib, gib // 2],
            peak_reserved_bytes_per_rank=[3 * gib, 5 * gib // 2],
            max_abs_diff=None,
            mean_abs_diff=None,
            reason="r",
            peak_over_process_life=False,
        )
    )
    lines = bench_table(result).splitlines()
    header = next(line for line in lines if line.startswith("mode"))
    assert header.index("peak allocated GiB/rank") < header.index("reserved GiB/rank")
    assert "1.00  " in next(line for line in lines if line.startswith("diffusers")).split("(reference)")[0]
    assert "2.00" in next(line for line in lines if line.startswith("diffusers"))
    row = next(line for line in lines if line.startswith("auto")).split()
    assert row[row.index("1.00/0.50") + 1] == "3.00/2.50"
    result.device = "cpu"
    assert "reserved" not in bench_table(result)


@pytest.mark.parametrize(
    "options,match",
    [
        (lambda: {"mode": "tile"}, "not mode"),
        (lambda: {"fast": __import__("vaeshard").FastOptions(frames_per_step=0)}, "at least 1"),
        (lambda: {"fast": __import__("vaeshard").FastOptions(max_layer_frames=1)}, "at least 2"),
        (lambda: {"frames_per_step": 2}, "not frames_per_step"),  # a knob outside FastOptions
    ],
)
def test_run_bench_refuses_bad_options_before_starting(options, match):
    from vaeshard.cli import bench
    from vaeshard.cli.io import named_model

    with pytest.raises(ValueError, match=match):
        bench.run_bench(named_model("wan21"), (1, 16, 2, 4, 4), options=options(), log=pytest.fail)


def test_interleaved_ab_patch_sets_an_attribute_and_sets_it_back():
    # `--setting patch`: the attribute takes the expression's value for "on" and the library's for "off"
    ab = _load("interleaved_ab")
    from vaeshard.layers import tier

    library = tier.upsample_by_phases
    patch = ab.Patch.parse("vaeshard.layers.tier:upsample_by_phases=lambda x: False")
    try:
        patch.apply(True)
        assert tier.upsample_by_phases is not library and tier.upsample_by_phases(None) is False
        patch.apply(False)
        assert tier.upsample_by_phases is library
    finally:
        tier.upsample_by_phases = library
    for wrong in ("vaeshard.fast:upsample_by_phases", "upsample_by_phases=None", "vaeshard.fast:=None"):
        with pytest.raises(ValueError, match="MODULE:ATTR=EXPR"):
            ab.Patch.parse(wrong)


def test_the_bench_warms_up_on_the_shortest_clip_the_vae_decodes():
    # two latent frames, or more where two decode to nothing: MiniMax-H3's real clips (17 frames, 3 dropped)
    # need three; its tiny ones (7 frames, 1 dropped) two
    import diffusers
    import torch

    import vaeshard
    from vaeshard.cli import bench

    from ..models import build

    class_name, config = vaeshard.named_configs()["minimax_h3"]
    with torch.device("meta"):
        real = getattr(diffusers, class_name)(**config)
    assert [bench._warm_up_frames(real, t) for t in (1, 2, 3, 22)] == [1, 2, 3, 3]
    assert bench._warm_up_frames(build("minimax_h3"), 22) == 2
    assert bench._warm_up_frames(build("wan21"), 21) == 2


def test_every_bench_process_draws_the_same_noise(tmp_path):
    # a fresh process's global RNG is seeded at random: each process of a bench (diffusers' reference,
    # each rank) seeds it alike after loading, so a decoder that draws noise draws the same in each
    import torch

    from vaeshard.cli import bench
    from vaeshard.cli.io import ModelSource

    from ..models import build

    vae = build("ltx2_diffusion_decoder")
    vae.save_pretrained(tmp_path)
    model = ModelSource(type(vae).__name__, dict(vae.config), path=str(tmp_path))
    spec = bench.BenchSpec(model, (1, 4, 2, 4, 6), "fp32", "cpu", 1, 0, None)

    class Ctx:
        device = "cpu"
        is_cuda = False

    states, outs = [], []
    for other in (1, 2):
        torch.manual_seed(other)
        vae, z = bench._load_for(Ctx(), spec)
        states.append(torch.get_rng_state())
        with torch.no_grad():
            outs.append(vae.decode(z).sample)
    assert torch.equal(*states) and torch.equal(*outs)


@pytest.mark.parametrize(
    "settings,kept",
    [({}, False), ({"keep_cuda_graphs": True}, True), ({"keep_cuda_graphs": True, "mode": "tile"}, False)],
)
def test_the_bench_warms_kept_graphs_up_and_counts_what_they_keep(settings, kept):
    # with kept CUDA graphs the warm-up is two whole requests (the timed decodes then replay every
    # call, as a serving loop's after its first two requests of a size) and the peak counts from
    # before it, so what the graphs keep is in the figure; otherwise a short clip, counted from after
    import torch

    import vaeshard
    from vaeshard.cli import bench

    from ..models import build, latent

    mode = settings.pop("mode", "auto")
    vae = vaeshard.parallelize(build("wan21"), mode, fast=vaeshard.FastOptions(**settings))
    seen = []
    real = vae.decode
    vae.decode = lambda z, **kw: seen.append(tuple(z.shape)) or real(z, **kw)

    class Memory:
        def __getattr__(self, name):
            return lambda: seen.append(name)

    class Ctx:
        def synchronize(self):
            pass

        def barrier(self):
            pass

    z = latent((1, 4, 5, 3, 3))
    with torch.no_grad():
        bench._timed_runs(Ctx(), vae, z, 1, Memory(), together=False)
    warm = (
        ["reset", "mark_base", tuple(z.shape), tuple(z.shape), "reset_peak"]
        if kept
        else ["reset", (1, 4, 2, 3, 3), "mark_base"]
    )
    assert seen == warm + [tuple(z.shape)]
