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
