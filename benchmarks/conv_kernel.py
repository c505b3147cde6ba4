#!/usr/bin/env python3
"""vaeshard's Triton convolution (src/vaeshard/conv_kernel.py) against cuDNN, alone, on one GPU.

    python3 benchmarks/conv_kernel.py                      # Wan 2.1's 96-channel shapes, the library's tile
    python3 benchmarks/conv_kernel.py --sweep --json conv.json

Each shape is one decoder call's convolution input (a channels-last bf16 buffer: the two cached
frames and four new ones, halo rows or columns where sharded) with random weights. cuDNN runs as the
fast tier runs it (benchmark mode, no bias); the kernel runs the tiling `conv_kernel.plan` picks
(`--sweep`: also the other tiles listed below). Median of 20 timed calls after a warm-up, CUDA
events; the largest relative difference to cuDNN's output is printed beside each (both sum in fp32
and round once to bf16, in different orders).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from vaeshard import conv_kernel

# name: (Cin, Cout, input frames, H, W, padding): the buffers of Wan 2.1's full-resolution residual
# blocks at 720p (1 GPU; 2 GPUs by height and by width) and 480p (1 and 2 GPUs by width)
SHAPES = {
    "720p, 1 GPU": (96, 96, 6, 720, 1280, (0, 1, 1)),
    "720p, 2 GPUs by height": (96, 96, 6, 362, 1280, (0, 0, 1)),
    "720p, 2 GPUs by width": (96, 96, 6, 720, 642, (0, 1, 0)),
    "720p, 4 GPUs by width": (96, 96, 6, 720, 322, (0, 1, 0)),
    "480p, 1 GPU": (96, 96, 6, 480, 832, (0, 1, 1)),
    "480p, 2 GPUs by width": (96, 96, 6, 480, 418, (0, 1, 0)),
}
SWEEP = [dict(block_m=256, stages=s, num_warps=8) for s in (3, 4, 5)] + [dict(block_m=128, stages=s, num_warps=4) for s in (4, 5)]


def median_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time the other tiles")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    print(f"{'shape':24} {'plan':5} {'tile':18} {'cuDNN ms':>9} {'kernel ms':>9} {'speed-up':>8} {'TFLOP/s':>8} {'rel. diff':>9}")
    for name, (cin, cout, frames, h, w, padding) in SHAPES.items():
        torch.manual_seed(0)
        x = torch.randn(1, cin, frames, h, w, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        weight = torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * cin) ** 0.5
        want = F.conv3d(x, weight, None, 1, padding)
        flop = 2 * want.numel() * cin * 27
        cudnn = median_ms(lambda: F.conv3d(x, weight, None, 1, padding))
        chosen = conv_kernel.plan(x, weight, 1, padding, 1, 1)
        gemm = conv_kernel.gemm_weight_of(weight)
        # where the plan declines (rows of a width that is not a multiple of the tile, padded), the
        # row tiling is timed anyway, to show why it declines
        base = chosen or conv_kernel.TILE
        tiles = [base] + ([base._replace(**t) for t in SWEEP if base._replace(**t) != base] if args.sweep else [])
        for how in tiles:
            got = conv_kernel.conv3d(x, weight, None, padding, how, gemm)
            diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            ms = median_ms(lambda: conv_kernel.conv3d(x, weight, None, padding, how, gemm))
            tile = f"{how.block_m}x{how.block_n}x{how.block_k} s{how.stages} w{how.num_warps}"
            label = ("wrap" if how.wrap else "rows") + ("" if chosen else "*")
            print(f"{name:24} {label:5} {tile:18} {cudnn:9.3f} {ms:9.3f} {cudnn / ms:7.2f}x {flop / ms / 1e9:8.0f} {diff:9.1e}",
                  flush=True)
            rows.append(dict(shape=name, cin=cin, cout=cout, frames=frames, h=h, w=w, padding=padding,
                             planned=chosen is not None, how=how._asdict(), cudnn_ms=cudnn, kernel_ms=ms,
                             speedup=cudnn / ms, tflops=flop / ms / 1e9, rel_diff=diff))
        del x, want
    print("* conv_kernel.plan leaves this shape to cuDNN; timed with the row tiling anyway")
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
