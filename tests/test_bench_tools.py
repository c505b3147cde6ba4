"""The benchmark scripts' own arithmetic (the scripts run on GPU machines; their logic is checked here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
        return types.SimpleNamespace(time_range=types.SimpleNamespace(start=start, end=end), name=name, device_type=device)

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
