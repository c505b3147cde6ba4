#!/usr/bin/env python3
"""vaeshard's convolution kernels (Triton and Gluon) against cuDNN, alone, on one GPU.

    python3 benchmarks/conv_kernel.py                      # Wan 2.1's 96-channel shapes, the library's tile
    python3 benchmarks/conv_kernel.py --sweep --json conv.json
    python3 benchmarks/conv_kernel.py --only "Wan 2.2" --sweep   # shapes whose name contains this
    python3 benchmarks/conv_kernel.py --residual                 # + bias + a residual, in place
    python3 benchmarks/conv_kernel.py --norm                     # + the next RMS norm + SiLU
    python3 benchmarks/conv_kernel.py --box-sweep                # box_conv's tilings of BOX_SWEEP too
    python3 benchmarks/conv_kernel.py --front [--residual]       # box_conv reading the cache where it lies

The kernels: kernels/conv3d.py's Triton kernel and kernels/box_conv.py's Gluon kernel. Each shape
is one decoder call's convolution input (a channels-last bf16 buffer: the two cached
frames and four new ones, halo rows or columns where sharded) with random weights. cuDNN runs as the
fast tier runs it (benchmark mode, no bias); the kernel runs the tiling `conv3d.plan` picks
(`--sweep`: also the tiles of SWEEP below; a `*` marks a tile the plan would not pick). Median of 20
timed calls after a warm-up, CUDA events; the largest relative difference to cuDNN's output is
printed beside each (both sum in fp32 and round once to bf16, in different orders).

`--residual`: each call also adds a bias and a residual (a residual block's second convolution):
cuDNN, then the fast tier's one-pass bias + residual add (kernels/norm.py's `add_bias_and_residual_`), against
the kernel adding both in its epilogue (`conv3d(..., add_to=residual)`); the difference is to
`F.conv3d(x, weight, bias) + residual`.

`--norm`: each call also applies the next RMS norm + SiLU, with the convolution's bias added first
(a residual block's first convolution), writing into the new frames of the next convolution's input
buffer: cuDNN then the norm kernel (kernels/norm.py's `rms_norm(..., pre_bias=, out=)`) against the kernel with
the norm in its epilogue (`conv3d(..., norm=, out=)`); the `+pass` rows time the kernel followed by
the norm kernel, as the decode ran it before; the difference is to cuDNN then the norm kernel.

`--front`: box_conv's causal convolutions (the shapes it runs) reading their two cached frames from
the cache where it lies (`conv3d.Front`, a buffer of the four new frames) against copying the
cache in front of the new frames, then convolving that buffer, as the fast tier did before; with
`--residual` both add a bias and a residual. The difference printed is to the kernel's output on
the copied buffer (the same sums in the same order: 0 expected), then the same with a cache of one
frame and with none (zero frames) against the kernel on a buffer with zero frames in front.

The upsamplers' convolution is computed by phases (kernels/phases.py) with cuDNN; its measurement
against the former paths is in git (docs/perf-log.md, "Upsamplers by phases").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from unittest import mock

import torch
import torch.nn.functional as F

from vaeshard.kernels import box_conv
from vaeshard.kernels import conv3d as conv_kernel
from vaeshard.kernels.norm import add_bias_and_residual_, rms_norm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_costs  # (benchmarks/, next to this script) its CUDA-event timer

# name: (Cin, Cout, input frames, H, W, padding): the buffers of Wan 2.1's full-resolution residual
# blocks (96 channels) at 720p (1 GPU; 2 GPUs by height and by width; 4 by width) and 480p (1 GPU,
# 2 by width; with zero columns), and of the half-resolution ones (192 channels) at 720p (and 480p
# with zero columns)
SHAPES = {
    "720p, 1 GPU": (96, 96, 6, 720, 1280, (0, 1, 1)),
    "720p, 2 GPUs by height": (96, 96, 6, 362, 1280, (0, 0, 1)),
    "720p, 2 GPUs by width": (96, 96, 6, 720, 642, (0, 1, 0)),
    "720p, 4 GPUs by width": (96, 96, 6, 720, 322, (0, 1, 0)),
    "480p, 1 GPU": (96, 96, 6, 480, 832, (0, 1, 1)),
    "480p, 2 GPUs by width": (96, 96, 6, 480, 418, (0, 1, 0)),
    "480p, 2 GPUs by height": (96, 96, 6, 242, 832, (0, 0, 1)),  # (box_conv: no zero columns)
    # zero columns (conv3d.wants_zero_columns): the 480p rows that no row tile fits, their padding held as a
    # zero column a side, so the wrapping tiles take them (cuDNN on the same buffer without padding)
    "480p, 1 GPU, zero columns": (96, 96, 6, 480, 834, (0, 1, 0)),
    "480p, 2 GPUs by height, zero columns": (96, 96, 6, 242, 834, (0, 0, 0)),
    "480p/2, 1 GPU, zero columns": (192, 192, 6, 240, 418, (0, 1, 0)),
    "480p/2, 2 GPUs by height, zero columns": (192, 192, 6, 122, 418, (0, 0, 0)),
    "720p/2, 1 GPU": (192, 192, 6, 360, 640, (0, 1, 1)),
    "720p/2, 2 GPUs by height": (192, 192, 6, 182, 640, (0, 0, 1)),
    "720p/2, 2 GPUs by width": (192, 192, 6, 360, 322, (0, 1, 0)),
    # the head's 96 -> 3 convolution (conv_out; cuDNN's Ampere-generation kernel without box_conv)
    "head 720p, 1 GPU": (96, 3, 6, 720, 1280, (0, 1, 1)),
    "head 720p, 2 GPUs by height": (96, 3, 6, 362, 1280, (0, 0, 1)),
    "head 480p, 2 GPUs by height": (96, 3, 6, 242, 832, (0, 0, 1)),
    # the quarter- and eighth-resolution layers (384 channels; cuDNN in the library): --box-sweep
    "720p/4, 1 GPU": (384, 384, 4, 180, 320, (0, 1, 1)),
    "720p/4, 2 GPUs by height": (384, 384, 4, 92, 320, (0, 0, 1)),
    "720p/8, 1 GPU": (384, 384, 3, 90, 160, (0, 1, 1)),
    # Wan 2.2's full-resolution layers (256 channels at 704 x 1280 / 2, before its 2 x 2 unpatchify):
    # not taken by conv3d.plan (not measured yet); --sweep times candidate tiles
    "Wan 2.2 720p, 1 GPU": (256, 256, 6, 352, 640, (0, 1, 1)),
    "Wan 2.2 720p, 2 GPUs by width": (256, 256, 6, 352, 322, (0, 1, 0)),
}
# --sweep: tiles tried besides the plan's (fields of conv3d.ConvPlan; block_n2: a second
# channel tile in the same program, so 96 channels are 64 + 32 and 192 are 128 + 64, none idle)
SWEEP = {
    96: [dict(block_m=256, block_n=128, block_n2=0, block_k=32, stages=s, num_warps=8) for s in (3, 4, 5)]
    + [dict(block_m=128, block_n=128, block_n2=0, block_k=32, stages=4, num_warps=4)]
    + [dict(block_m=256, block_n=64, block_n2=32, block_k=32, stages=s, num_warps=8) for s in (3, 4, 5)]
    + [dict(block_m=128, block_n=64, block_n2=32, block_k=32, stages=s, num_warps=4) for s in (4, 6)],
    192: [
        dict(block_m=128, block_n=128, block_n2=64, block_k=bk, stages=s, num_warps=8)
        for bk, s in ((64, 3), (64, 4), (32, 4), (32, 6))
    ]
    + [dict(block_m=256, block_n=128, block_n2=64, block_k=32, stages=s, num_warps=8) for s in (3, 4)]
    + [dict(block_m=128, block_n=256, block_n2=0, block_k=64, stages=3, num_warps=8)],
    256: [dict(block_m=128, block_n=128, block_n2=128, block_k=64, stages=s, num_warps=8) for s in (3, 4)]
    + [dict(block_m=128, block_n=256, block_n2=0, block_k=64, stages=3, num_warps=8)],
}


# box_conv tilings to time with --box-sweep, by output channels: 96 as the library runs it and with
# 3 slots; more channels (the Triton kernel or cuDNN in the library) either as channel tiles of 96
# on 16 x 16 voxels (each program reads the patch's boxes, each weight serves 256 voxels) or on
# 8 x 16 voxels, whose accumulators (128 x 192) fit the consumer warps' registers; Wan 2.2's 256
# channels as channel tiles of 64, 128 or 256
_WIDE = box_conv.BoxPlan(rows=8, block_n=128, block_n2=64)
BOX_SWEEP = {
    96: [box_conv.PLAN, box_conv.PLAN._replace(a_regs=True), box_conv.BoxPlan()],
    192: [_WIDE, _WIDE._replace(stages=3, tma_out=True), _WIDE._replace(stages=3, tma_out=True, a_regs=True)],
    256: [
        box_conv.BoxPlan(block_n=64, block_n2=64, stages=3),
        box_conv.BoxPlan(block_n=32, block_n2=32),
        box_conv.BoxPlan(rows=8, block_n=128, block_n2=128, stages=3),
        box_conv.BoxPlan(rows=8, block_n=64, block_n2=64),
    ],
    384: [box_conv.BoxPlan(), _WIDE],
    3: [box_conv.BoxPlan(block_n=16, block_n2=0, stages=s) for s in (4, 6)] + [box_conv.BoxPlan(block_n=8, block_n2=8)],
}


def box_tile(how: box_conv.BoxPlan) -> str:
    """A box_conv tiling as the tables print it: voxels, channel tiles, channel step, slots, warps."""
    return (
        f"{how.rows}x{how.cols}x{how.block_n}+{how.block_n2}x{how.block_k} s{how.stages} w{how.num_warps}+1"
        + (" rA" if how.a_regs else "")
        + (" tma" if how.tma_out else "")
    )


def box_rows(
    rows: list, name: str, x, weight, boxed, padding, want, cudnn: float, flop: float, bias=None, residual=None
) -> None:
    """--box-sweep: box_conv.conv3d with each of BOX_SWEEP's tilings for this shape (no bias, no
    epilogue; with --residual its bias and residual added as it stores), its time and largest
    difference to cuDNN's output, printed and added to `rows`."""
    cout = weight.shape[0]
    if not box_conv.available() or x.shape[1] % 32:
        return
    add = residual is not None
    for how in BOX_SWEEP.get(cout, []):
        tile = box_tile(how)
        out = (
            residual.clone()
            if add
            else torch.empty(want.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
        )
        try:
            got = box_conv.conv3d(x, weight, bias, padding, out, boxed, add=add, how=how).clone()
        except Exception as err:  # noqa: BLE001 - a tiling that does not compile or launch: the next one
            print(f"{name:24} {'box*':10} {tile:22} failed: {type(err).__name__}: {str(err)[:120]}", flush=True)
            continue
        diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        ms = median_ms(lambda out=out, how=how: box_conv.conv3d(x, weight, bias, padding, out, boxed, add=add, how=how))
        label = "box" + ("" if box_conv.PLANS.get(cout) == how else "*")
        print(
            f"{name:24} {label:10} {tile:22} {cudnn:9.3f} {ms:9.3f} {cudnn / ms:7.2f}x "
            f"{flop / ms / 1e9:8.0f} {diff:9.1e}",
            flush=True,
        )
        rows.append(
            dict(
                shape=name,
                cout=cout,
                box=how._asdict(),
                cudnn_ms=cudnn,
                kernel_ms=ms,
                speedup=cudnn / ms,
                tflops=flop / ms / 1e9,
                rel_diff=diff,
            )
        )


def front_rows(args) -> list:
    """--front: see the module's text; prints the table and returns its rows."""
    rows = []
    print(f"{'shape':24} {'copy + conv ms':>14} {'front ms':>9} {'speed-up':>8} {'diff':>8} {'1 frame':>8} {'none':>8}")
    for name, (cin, cout, frames, h, w, padding) in SHAPES.items():
        if (args.only and args.only not in name) or cout not in box_conv.PLANS or (args.residual and cout % 8):
            continue
        row = _front_row(name, cin, cout, frames, h, w, padding, args.residual)
        rows += [row] if row is not None else []
    return rows


def _front_row(name: str, cin: int, cout: int, frames: int, h: int, w: int, padding, add: bool) -> dict | None:
    """One shape's --front row (None where box_conv does not run it), printed."""
    torch.manual_seed(0)
    x = torch.randn(1, cin, frames, h, w, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)  # the copied buffer: cache, then new frames
    weight = torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * cin) ** 0.5
    if not box_conv.runs(x, weight):
        return None
    cache = x[:, :, :2].clone()
    new = x[:, :, 2:].clone()  # the buffer of the new frames alone
    boxed = box_conv.box_weight_of(weight)
    bias = torch.randn(cout, device="cuda", dtype=torch.bfloat16) if add else None
    out = torch.zeros(
        (1, cout, frames - 2, h + 2 * padding[1] - 2, w + 2 * padding[2] - 2), device="cuda", dtype=torch.bfloat16
    ).contiguous(memory_format=torch.channels_last_3d)
    residual = torch.randn_like(out) if add else out

    def copied(c=cache):
        x[:, :, :2].copy_(c)
        return box_conv.conv3d(x, weight, bias, padding, out, boxed, add=add)

    def apart(c=cache):
        return box_conv.conv3d(new, weight, bias, padding, out, boxed, add=add, causal=True, cache=c)

    diffs = []
    for c in (cache, cache[:, :, 1:].clone(), None):
        x[:, :, :2].zero_()
        if c is not None:
            x[:, :, 2 - c.shape[2] : 2].copy_(c)
        out.copy_(residual)
        want = box_conv.conv3d(x, weight, bias, padding, out, boxed, add=add).clone()
        out.copy_(residual)
        got = apart(c).clone()
        diffs.append((got.float() - want.float()).abs().max().item())
    base, ms = median_ms(copied), median_ms(apart)
    print(
        f"{name:24} {base:14.3f} {ms:9.3f} {base / ms:7.2f}x {diffs[0]:8.1e} {diffs[1]:8.1e} {diffs[2]:8.1e}",
        flush=True,
    )
    return {
        "shape": name,
        "cout": cout,
        "residual": add,
        "copy_conv_ms": base,
        "front_ms": ms,
        "speedup": base / ms,
        "diff": diffs[0],
        "diff_one_frame": diffs[1],
        "diff_no_cache": diffs[2],
    }


def median_ms(fn, reps: int = 20) -> float:
    return kernel_costs._time(fn, loops=1, reps=reps) * 1e3  # (CUDA events around each call)


def _kernel_rows(args, rows: list, name: str, cin: int, cout: int, frames: int, h: int, w: int, padding) -> None:
    """One shape's rows of the main table (see the module's text), printed and added to `rows`."""
    torch.manual_seed(0)
    x = torch.randn(1, cin, frames, h, w, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    weight = torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / (27 * cin) ** 0.5
    bias = residual = into = norm = None
    want = F.conv3d(x, weight, None, 1, padding)
    if args.residual:
        bias = torch.randn(cout, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn(want.shape, device="cuda", dtype=torch.bfloat16)
        residual = residual.contiguous(memory_format=torch.channels_last_3d)
        want = F.conv3d(x, weight, bias, 1, padding) + residual
        into = residual.clone()  # (overwritten by every timed call; the values do not matter there)
    if args.norm:
        bias = torch.randn(cout, device="cuda", dtype=torch.bfloat16)
        gamma = torch.rand(cout, device="cuda", dtype=torch.bfloat16) + 0.5
        norm = conv_kernel.NormEpilogue(gamma, 0.0, cout**0.5, pre_bias=bias)
        buf = torch.empty(
            (1, cout, want.shape[2] + 2, *want.shape[3:]),
            device="cuda",
            dtype=torch.bfloat16,
            memory_format=torch.channels_last_3d,
        )
        into = buf[:, :, 2:]  # the next convolution's new frames, behind its two cached ones

    def normed(y):
        return rms_norm(y, norm.gamma, 0.0, norm.scale, True, pre_bias=norm.pre_bias, out=into)

    if args.norm:
        want = normed(want).clone()
    flop = 2 * want.numel() * cin * 27
    if args.norm:
        cudnn = median_ms(lambda: normed(F.conv3d(x, weight, None, 1, padding)))
    elif args.residual:
        cudnn = median_ms(
            lambda: add_bias_and_residual_(F.conv3d(x, weight, None, 1, padding), bias, into, into_residual=True)
        )
    else:
        cudnn = median_ms(lambda: F.conv3d(x, weight, None, 1, padding))
    chosen = conv_kernel.plan(x, weight, 1, padding, 1, 1)
    gemm = conv_kernel.gemm_weight_of(weight)
    # where the plan declines, the sweep's tiles (or the default tile) are timed anyway, to
    # show why it declines
    wrap = padding[2] == 0
    base = chosen or conv_kernel.TILE._replace(wrap=wrap)
    swept = [conv_kernel.TILE._replace(wrap=wrap, **t) for t in SWEEP.get(cout, [])] if args.sweep else []
    tiles = ([chosen] if chosen else []) + [t for t in swept if t != chosen] or [base]
    if chosen is not None and chosen.box:  # and the Triton kernel's plan, where it has one
        with mock.patch.object(box_conv, "available", lambda: False):
            triton_plan = conv_kernel.plan(x, weight, 1, padding, 1, 1)
        tiles += [triton_plan] if triton_plan is not None else []
    boxed = box_conv.box_weight_of(weight)
    if args.box_sweep and not args.norm:
        box_rows(rows, name, x, weight, boxed, padding, want, cudnn, flop, bias, residual)
    for how in tiles:
        if how.block_n + how.block_n2 < cout:
            continue
        if not how.box and cout % 8:  # (TMA's 16-byte rows: the Triton kernel does not take it)
            continue
        kw = boxed if how.box else gemm  # (conv3d.cached_weight_for's layouts)
        if args.norm:
            got = conv_kernel.conv3d(x, weight, None, padding, how, kw, norm=norm, out=into).clone()
        elif args.residual:
            got = conv_kernel.conv3d(x, weight, bias, padding, how, kw, residual.clone())
        else:
            got = conv_kernel.conv3d(x, weight, None, padding, how, kw)
        diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        runs = {"": lambda how=how, kw=kw: conv_kernel.conv3d(x, weight, None, padding, how, kw)}
        if args.norm:
            runs = {
                "": lambda how=how, kw=kw: conv_kernel.conv3d(x, weight, None, padding, how, kw, norm=norm, out=into),
                "+pass": lambda how=how, kw=kw: normed(conv_kernel.conv3d(x, weight, None, padding, how, kw)),
            }
        elif args.residual:
            runs = {"": lambda how=how, kw=kw: conv_kernel.conv3d(x, weight, bias, padding, how, kw, into)}
        for suffix, run in runs.items():
            ms = median_ms(run)
            n = f"{how.block_n}+{how.block_n2}" if how.block_n2 else f"{how.block_n}"
            tile = f"{how.block_m}x{n}x{how.block_k} s{how.stages} w{how.num_warps}"
            if how.box:
                tile = box_tile(box_conv.PLANS[cout])
            label = ("box" if how.box else "wrap" if how.wrap else "rows") + ("" if how == chosen else "*") + suffix
            print(
                f"{name:24} {label:10} {tile:22} {cudnn:9.3f} {ms:9.3f} {cudnn / ms:7.2f}x "
                f"{flop / ms / 1e9:8.0f} {diff:9.1e}",
                flush=True,
            )
            rows.append(
                {
                    "shape": name,
                    "cin": cin,
                    "cout": cout,
                    "frames": frames,
                    "h": h,
                    "w": w,
                    "padding": padding,
                    "planned": chosen is not None,
                    "residual": args.residual,
                    "norm": args.norm,
                    "norm_pass": suffix == "+pass",
                    "how": how._asdict(),
                    "cudnn_ms": cudnn,
                    "kernel_ms": ms,
                    "speedup": cudnn / ms,
                    "tflops": flop / ms / 1e9,
                    "rel_diff": diff,
                }
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time the other tiles")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="the shapes whose name contains this text")
    ap.add_argument("--residual", action="store_true", help="add a bias and a residual in the same call")
    ap.add_argument("--norm", action="store_true", help="apply the next RMS norm + SiLU in the same call")
    ap.add_argument(
        "--front",
        action="store_true",
        help="box_conv reading the causal cache where it lies against copying it in front (conv3d.Front)",
    )
    ap.add_argument(
        "--box-sweep",
        action="store_true",
        help="also time box_conv's kernel with the tilings of BOX_SWEEP (channel counts it does not run for yet)",
    )
    args = ap.parse_args()
    if args.residual and args.norm:
        ap.error("--residual or --norm, not both")
    torch.backends.cudnn.benchmark = True
    # the Gluon kernel timed alone, where the library's route leaves it out (box_conv.ROUTED)
    box_conv.ROUTED = bool(args.front or args.box_sweep)
    if args.front:
        rows = front_rows(args)
        env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(env=env, rows=rows), f, indent=1)
        return
    rows = []
    print(
        f"{'shape':24} {'plan':10} {'tile':22} {'cuDNN ms':>9} {'kernel ms':>9} {'speed-up':>8} {'TFLOP/s':>8} "
        f"{'rel. diff':>9}"
    )
    for name, (cin, cout, frames, h, w, padding) in SHAPES.items():
        if args.only and args.only not in name:
            continue
        if (args.norm or args.residual) and cout % 8:  # (the head: no norm or residual follows it)
            continue
        _kernel_rows(args, rows, name, cin, cout, frames, h, w, padding)
    print("* not what conv3d.plan picks for this shape (it may leave the shape to cuDNN)")
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
