#!/usr/bin/env python3
"""Memory bandwidth of the fast tier's fused norm and bias kernels per tile choice, against a copy.

The kernels of kernels/norm.py (`rms_norm`, `add_bias_and_residual_`, `add_bias_`) per tile choice
(its `TILE`), against a plain copy with the same strides and PyTorch's own bias pass.

    python3 benchmarks/norm_kernel.py [--json norm_kernel.json] [--no-sweep]     # one CUDA GPU

Each voxel's channels are read once and written once (the norm, a bias) or read twice and written
once (bias + residual); a kernel slower than that traffic at a copy's speed is bound by something
else (its instructions: benchmarks/kernel_sass.py). The shapes are those of a Wan 2.1 720p decode in
bf16: the norms write into the new-frames view of a causal convolution's channels-last input buffer
(two cached frames in front; on 2 GPUs two halo columns a side), at full resolution (96 channels),
at the next two levels (192, 384), and one shard of the full resolution on 2 GPUs. Each variant is
timed as the median of `--reps` CUDA-event timings of `--loops` calls. "wide" forces the kernels'
64-bit index arithmetic (the default is 32-bit wherever offsets fit).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch

from vaeshard.kernels import norm as norm_kernels

# (name, new frames' shape, buffer shape, where the new frames sit in the buffer: (frame, column))
SHAPES = [
    ("full-res", (1, 96, 4, 720, 1280), (1, 96, 6, 720, 1280), (2, 0)),
    ("full-res shard", (1, 96, 4, 720, 640), (1, 96, 6, 720, 644), (2, 2)),
    ("1/2 res", (1, 192, 4, 360, 640), (1, 192, 6, 360, 640), (2, 0)),
    ("1/4 res", (1, 384, 2, 180, 320), (1, 384, 4, 180, 320), (2, 0)),
]


def _time(fn, loops: int, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / loops)
    return statistics.median(times)


def _shape_rows(name: str, shape, buf_shape, at, variants, real_wide, loops: int, reps: int) -> list[dict]:
    """The rows of one shape: the copy, PyTorch's bias pass, the bias kernel, and per variant (label,
    tile, wide) the norm and the bias + residual kernels (each kernel's tile set for its variant)."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    t0, w0 = at
    x = torch.randn(shape, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last_3d)
    buf = torch.empty(buf_shape, device=dev, dtype=dt, memory_format=torch.channels_last_3d)
    out = buf[:, :, t0:].narrow(4, w0, shape[4])
    h = torch.randn(shape, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last_3d)
    gamma = torch.rand(shape[1], 1, 1, 1, device=dev, dtype=dt) + 0.5
    bias = torch.randn(shape[1], device=dev, dtype=dt)
    nbytes = x.numel() * x.element_size()

    def row(kernel: str, variant: str, seconds: float, passes: int) -> dict:
        return {
            "shape": name,
            "kernel": kernel,
            "variant": variant,
            "seconds": seconds,
            "GBps": passes * nbytes / seconds / 1e9,
        }

    copy_s = _time(lambda: out.copy_(x), loops, reps)
    # a convolution's bias on its channels-last output: PyTorch's own pass (what F.conv3d runs
    # after cuDNN on CUDA) against norm.add_bias_ (tier.conv_with_bias); in place, as both are
    rows = [row("bias (torch)", "-", _time(lambda: h.add_(bias.reshape(1, -1, 1, 1, 1)), loops, reps), 2)]
    if hasattr(norm_kernels, "add_bias_"):  # (not in libraries before it, for an A/B)
        rows.append(row("bias", "default", _time(lambda: norm_kernels.add_bias_(h, bias), loops, reps), 2))
    rows.append(row("copy", "-", copy_s, 2))
    for label, tile, wide in variants:
        norm_kernels.TILE.clear()
        norm_kernels.TILE.update(tile)
        norm_kernels._wide = (lambda *t: True) if wide else real_wide
        norm_s = _time(lambda: norm_kernels.rms_norm(x, gamma, 0.0, shape[1] ** 0.5, True, out=out), loops, reps)
        add_s = _time(lambda: norm_kernels.add_bias_and_residual_(x, bias, h, into_residual=True), loops, reps)
        rows.append(row("rms_norm", label, norm_s, 2))
        rows.append(row("bias_residual", label, add_s, 3))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--no-sweep", action="store_true", help="only the default tile (32- and 64-bit), no other tile choices"
    )
    args = ap.parse_args()
    if norm_kernels.triton is None or not torch.cuda.is_available():
        raise SystemExit("norm_kernel.py needs a CUDA GPU and Triton")
    torch.manual_seed(0)
    default = dict(norm_kernels.TILE)
    real_wide = norm_kernels._wide
    variants = [("default", default, False), ("default, wide", default, True)]
    sweep = () if args.no_sweep else itertools.product((4096, 8192, 16384), (32, 64, 128, 256), (2, 4, 8))
    for elements, voxels, warps in sweep:
        tile = {"elements": elements, "max_voxels": voxels, "num_warps": warps}
        if tile != default:
            variants.append((f"{elements}/{voxels}/{warps}", tile, False))
    rows = []
    try:
        for name, shape, buf_shape, at in SHAPES:
            rows += _shape_rows(name, shape, buf_shape, at, variants, real_wide, args.loops, args.reps)
    finally:
        norm_kernels.TILE.clear()
        norm_kernels.TILE.update(default)
        norm_kernels._wide = real_wide
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "triton": norm_kernels.triton.__version__,
                    "default": default,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    # the default, the best variant per shape and kernel, and the copy
    print(f"{'shape':15} {'kernel':14} {'variant':16} {'ms':>7} {'GB/s':>7}")
    for name, *_ in SHAPES:
        for kernel in ("copy", "rms_norm", "bias_residual", "bias (torch)", "bias"):
            mine = [r for r in rows if r["shape"] == name and r["kernel"] == kernel]
            if not mine:
                continue
            best = min(mine, key=lambda r: r["seconds"])
            shown = [r for r in mine if r["variant"] in ("default", "default, wide", "-")]
            for r in shown + ([best] if best not in shown else []):
                print(f"{name:15} {kernel:14} {r['variant']:16} {r['seconds'] * 1e3:7.3f} {r['GBps']:7.0f}")
    # the variant with the least time summed over every shape, per kernel
    for kernel in ("rms_norm", "bias_residual"):
        totals = {}
        for r in rows:
            if r["kernel"] == kernel:
                totals[r["variant"]] = totals.get(r["variant"], 0.0) + r["seconds"]
        best = min(totals, key=totals.get)
        print(
            f"{kernel}: summed over the shapes, default {totals['default'] * 1e3:.3f} ms, "
            f"best {best} {totals[best] * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
