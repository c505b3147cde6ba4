#!/usr/bin/env python3
"""The upsamplers' 3x3 convolution two ways, at the Wan decoders' 720p shapes (one GPU, bf16).

    python3 benchmarks/upsample_phases.py

Per upsampler of a steady decoder call (one latent frame): the source frames (after an upsample3d's
time convolution, its two channel halves per frame), then
  copy    the upsampled frames copied into a channels-last buffer, cuDNN's 3x3 convolution, the bias pass
          (the fast tier's path before kernels/phases.py);
  phases  kernels/phases.py: (the channel halves copied apart,) one cuDNN convolution of 2x2 taps into
          4 x Cout channels, the interleaving pass with the bias;
(The Triton kernel that read the source for all nine taps, removed in commit 23d2308, was a third
column as this script ran at commit c53220a: `benchmarks/results/2026-12-01/phases/`.)
The parts of `phases` are timed apart too (halves copy, convolution, interleave), and a grouped
convolution that would read the halves where they lie (2 groups), for comparison. Medians of CUDA-event
timings; TFLOP/s of the 36-product convolution each replaces; max |diff| against the copy path.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from vaeshard.kernels import phases as upsample
from vaeshard.layers import tier

# (name, source frames, sub, Cin, Cout, source rows, columns)
SHAPES = [
    ("wan21 up0 (upsample3d)", 1, 2, 384, 192, 90, 160),
    ("wan21 up1 (upsample3d)", 2, 2, 384, 192, 180, 320),
    ("wan21 up2 (upsample2d)", 4, 1, 192, 96, 360, 640),
    ("wan22 up0 (upsample3d)", 1, 2, 1024, 1024, 44, 80),
    ("wan22 up1 (upsample3d)", 2, 2, 1024, 1024, 88, 160),
    ("wan22 up2 (upsample2d)", 4, 1, 512, 512, 176, 320),
]


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(
        f"{'upsampler':24} {'copy ms':>8} {'phases':>8} | {'halves':>7} {'conv':>7} {'inter':>7}"
        f" {'grouped':>8} | {'TFLOP/s copy':>12} {'phases':>7} | max|diff|"
    )
    with tier.active(tier.FastPlan()):
        for name, f, sub, cin, cout, h, w in SHAPES:
            _row(name, f, sub, cin, cout, h, w, args.reps, dev, dt)


def _row(name: str, f: int, sub: int, cin: int, cout: int, h: int, w: int, reps: int, dev, dt) -> None:
    """One upsampler's row of the table (see the module's text)."""
    src = torch.randn(f, sub * cin, h, w, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(cout, cin, 3, 3, device=dev, dtype=dt) / (3 * cin**0.5)).contiguous(
        memory_format=torch.channels_last
    )
    bias = torch.randn(cout, device=dev, dtype=dt) / 10
    frames = src.unflatten(1, (sub, cin))  # (F, sub, Cin, h, w): frame f * sub + j, a view

    def copy_path():  # as layers/buffers.py's upsample_into_buffer
        buf = torch.empty((f * sub, cin, 2 * h, 2 * w), device=dev, dtype=dt, memory_format=torch.channels_last)
        buf.unflatten(0, (f, sub)).unflatten(-1, (w, 2)).unflatten(-3, (h, 2)).copy_(
            frames[..., None, :, None].expand(f, sub, cin, h, 2, w, 2)
        )
        return tier.conv_with_bias(F.conv2d, buf, weight, bias, 1, 1, 1, 1)

    def halves():  # as layers/convs.py's HaloConv2d.forward_by_phases (unsharded: only for sub 2)
        if sub == 1:
            return src
        apart = torch.empty((f * sub, cin, h, w), device=dev, dtype=dt, memory_format=torch.channels_last)
        apart.unflatten(0, (f, sub)).copy_(frames)
        return apart

    phases_w = upsample.cached_phase_weight(weight)

    def phases_path():
        return upsample.conv2d_by_phases(halves(), weight, bias, phases=phases_w)

    apart = halves()
    y = F.conv2d(apart, phases_w, None, 1, 1)
    out = torch.empty((f * sub, cout, 2 * h, 2 * w), device=dev, dtype=dt, memory_format=torch.channels_last)
    grouped_w = torch.cat([phases_w, phases_w])
    ms = {
        "copy": timed(copy_path, reps),
        "phases": timed(phases_path, reps),
        "halves": timed(halves, reps) if sub > 1 else 0.0,
        "conv": timed(lambda: F.conv2d(apart, phases_w, None, 1, 1), reps),
        "inter": timed(lambda: upsample.interleave_phases(y, bias, out), reps),
        "grouped": timed(lambda: F.conv2d(src, grouped_w, None, 1, 1, 1, 2), reps) if sub > 1 else None,
    }
    flop = 2 * f * sub * cout * cin * 9 * (2 * h) * (2 * w)
    ref = copy_path().float()
    diff = (phases_path().float() - ref).abs().max().item()
    grouped = f"{ms['grouped']:8.3f}" if ms["grouped"] is not None else f"{'-':>8}"
    print(
        f"{name:24} {ms['copy']:8.3f} {ms['phases']:8.3f} | {ms['halves']:7.3f} {ms['conv']:7.3f}"
        f" {ms['inter']:7.3f} {grouped} | {flop / ms['copy'] / 1e9:12.0f} {flop / ms['phases'] / 1e9:7.0f}"
        f" | {diff:.2e} (|ref| {ref.abs().max().item():.2f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
