#!/usr/bin/env python3
"""The fast tier's norm, bias and launch costs, one command each (kernels/norm.py; the convolutions:
benchmarks/conv_kernel.py).

    python3 benchmarks/kernel_costs.py norm [--json norm_kernel.json] [--no-sweep]   # one CUDA GPU
    python3 benchmarks/kernel_costs.py sass [--channels 96 --dump norm96.sass]      # no GPU needed
    python3 benchmarks/kernel_costs.py launch --calls 400 --decode                  # one CUDA GPU
    python3 benchmarks/kernel_costs.py windows [--stages 1,2,3 --frames 9]            # one CUDA GPU (or --device cpu)

norm: the memory bandwidth of the fused norm and bias kernels (`rms_norm`, `add_bias_and_residual_`,
`add_bias_`) per tile choice (kernels/norm.py's `TILE`), against a plain copy with the same strides
and PyTorch's own bias pass. Each voxel's channels are read once and written once (the norm, a bias)
or read twice and written once (bias + residual); a kernel slower than that traffic at a copy's
speed is bound by something else (its instructions: `sass`). The shapes are those of a Wan 2.1 720p
decode in bf16: the norms write into the new-frames view of a causal convolution's channels-last
input buffer (two cached frames in front; on 2 GPUs two halo columns a side), at full resolution (96
channels), at the next two levels (192, 384), and one shard of the full resolution on 2 GPUs. Each
variant is timed as the median of `--reps` CUDA-event timings of `--loops` calls. "wide" forces the
kernels' 64-bit index arithmetic (the default is 32-bit wherever offsets fit).

sass: the machine instructions of the norm kernels, compiled for Hopper (sm_90) without a GPU.
Compiles `_rms_norm_silu_kernel` (and the bias + residual kernel) with the tile it would launch for
each channel count, as Triton's launcher specialises a channels-last bf16 tensor (channel stride 1;
pointers, other strides and sizes divisible by 16), disassembles the cubin with the `nvdisasm` Triton
ships, and counts the instructions of one program. Both kernels have no loops, so the count divided
by the elements one thread handles is the instructions issued per element: where that times the
elements exceeds what the SMs issue in the time a copy takes, the kernel is bound by its
instructions, not by memory (`norm` times them).

windows: one neighbourhood attention of each stage of LTX-2.5's diffusion decoder at 1088 x 1920, 121
frames (bf16, random queries, keys and values): vaeshard's windows in blocks
(layers/neighbourhood_attention.py) against diffusers' FlexAttention processor's computation
(`flex_attention` compiled, with its BlockMask) where that mask is built (up to `--flex-tokens`
tokens: it holds a boolean per (query, key) pair while it is made), each timed as the median of
`--reps` CUDA-event timings, its peak above what the inputs hold, and the largest difference.
`--device cpu --frames 3 --crop 12,14`: a check of the script (fp32, eager flex, no peaks).

launch: the host's cost of one call of each kernel the fast tier launches, at shapes too small to
keep the GPU busy: what a decoder call spends on the host per layer, apart from the GPU work. Each
row times `--calls` calls (the device synchronised every 100, so the launch queue never fills) and
prints the host's CPU time per call (`time.thread_time`: the time the thread ran, not the time a busy
machine kept it waiting), medians of `--reps` runs, twice, interleaved run by run: with the compiled
kernels launched directly (`triton_support.launch`, the library's way) and with every launch through
Triton's JIT function (`jit`). A host's speed moves from machine to machine and call to call by more
than these differences, so only the two columns of one run compare. `--decode` adds the host's time
for a whole decode (Wan 2.1's real config, a latent of 21 frames of 8 x 16, one rank, no CUDA
graph), whose GPU work is small beside it. A sharded decode's host issues about 1600 Triton launches
(about 390 of them box_conv's) and 420 cuDNN convolutions per Wan 2.1 decode of 21 latent frames
(`ranks.py share --host-profile`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter

import torch
import torch.nn.functional as F

from vaeshard.kernels import norm as norm_kernels

# --- norm ----------------------------------------------------------------------------------


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


def norm(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="kernel_costs.py norm", description="the norm and bias kernels' bandwidth per tile, against a copy"
    )
    ap.add_argument("--loops", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--no-sweep", action="store_true", help="only the default tile (32- and 64-bit), no other tile choices"
    )
    args = ap.parse_args(argv)
    if norm_kernels.triton is None or not torch.cuda.is_available():
        raise SystemExit("kernel_costs.py norm needs a CUDA GPU and Triton")
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


# --- sass ----------------------------------------------------------------------------------


ALIGNED = {
    "x_ptr",
    "y_ptr",
    "w_ptr",
    "b_ptr",
    "p_ptr",
    "h_ptr",
    "S",
    "C",
    "D1",
    "D2",
    "sxn",
    "sx0",
    "sx1",
    "sx2",
    "syn",
    "sy0",
    "sy1",
    "sy2",
    "shn",
    "sh0",
    "sh1",
    "sh2",
}


ONE = {"sxc": 1, "syc": 1, "shc": 1}  # channels-last: the channel stride is 1


def sass_lines(kernel, constants: dict, num_warps: int) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    names = kernel.arg_names
    # (constants a kernel does not have are left out: an older library's kernels have fewer)
    constants = {k: v for k, v in {**ONE, **constants}.items() if k in names}
    types = {
        n: "*bf16"
        if n.endswith("_ptr")
        else "fp32"
        if n in ("scale", "eps")
        else "constexpr"
        if n in constants
        else "i32"
        for n in names
    }
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ALIGNED and n not in constants}
    source = ASTSource(kernel, types, constexprs={(names.index(k),): v for k, v in constants.items()}, attrs=attrs)
    compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].strip() for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def opcode(line: str) -> str:
    return (line.split()[1] if line.startswith("@") else line.split()[0]).split(".")[0].rstrip(";")


def sass(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="kernel_costs.py sass", description="the norm kernels' instructions, compiled for sm_90"
    )
    ap.add_argument("--channels", default="96,192,384", help="channel counts (default Wan's 96,192,384)")
    ap.add_argument("--dump", help="write the last kernel's instructions here")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; set to silence its notice
    warps = norm_kernels.TILE["num_warps"]
    print(f"{'kernel':34} {'C':>4} {'tile':>16} {'instr.':>7} {'per element':>11}  most frequent")
    for c in (int(v) for v in args.channels.split(",")):
        block_s, padded, _ = norm_kernels._tile(c)
        # (a library from before the channel blocks, commit 2de46c2 or older: one block of `padded`)
        blocks = getattr(norm_kernels, "_channel_blocks", None)
        block_c, chunks = blocks(c) if blocks else (padded, None)
        norm = dict(HAS_BIAS=False, PRE_BIAS=True, SILU=True, BLOCK_S=block_s, BLOCK_C=block_c, WIDE=False)
        launches = [
            (
                "rms_norm (+SiLU, conv bias first)",
                norm_kernels._rms_norm_silu_kernel,
                {**norm, "CHUNKS": chunks} if chunks else norm,
                f"{block_s}x{chunks or 1}x{block_c}",
            ),
            (
                "bias + residual",
                norm_kernels._bias_residual_kernel,
                dict(BLOCK_S=block_s, BLOCK_C=padded, INTO_H=True, RESIDUAL=True, WIDE=False),
                f"{block_s}x{padded}",
            ),
        ]
        for label, kernel, constants, tile in launches:
            lines = sass_lines(kernel, constants, warps)
            per_thread = block_s * c / (32 * warps)  # real elements (channels < C masked) per thread
            ops = ", ".join(f"{op} {n}" for op, n in Counter(map(opcode, lines)).most_common(6))
            print(f"{label:34} {c:4} {tile:>16} {len(lines):7} {len(lines) / per_thread:11.1f}  {ops}")
            if args.dump:
                with open(args.dump, "w") as f:
                    f.write("\n".join(lines) + "\n")


# --- launch ----------------------------------------------------------------------------------


def _host_time(fn, calls: int, reps: int) -> tuple[float, float]:
    """Median host CPU time per call of `fn`, (direct launches, JIT launches), interleaved."""
    from vaeshard.kernels import triton_support

    key = triton_support._key
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for rep in range(2 * reps + 2):
            direct = rep % 2 == 0
            triton_support._key = key if direct else (lambda args, kwargs: None)
            c0 = time.thread_time()
            for i in range(calls):
                fn()
                if i % 100 == 99:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            if rep >= 2:  # (the first of each: compiles, algorithm choices)
                times[direct].append((time.thread_time() - c0) / calls)
    finally:
        triton_support._key = key
    return statistics.median(times[True]), statistics.median(times[False])


def launch(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="kernel_costs.py launch", description="the host's cost of each fast-tier kernel launch"
    )
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode", action="store_true", help="also: a whole decode at a small latent")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from vaeshard.kernels import box_conv, norm
    from vaeshard.kernels import conv3d as conv_kernel
    from vaeshard.layers import tier

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    cl3 = torch.channels_last_3d

    def tensor(*shape, fmt=cl3):
        return torch.randn(*shape, device=dev, dtype=bf16).to(memory_format=fmt)

    x96 = tensor(1, 96, 2, 16, 32)
    w96 = tensor(96, 96, 3, 3, 3, fmt=torch.contiguous_format) * 0.05
    b96 = tensor(96, fmt=torch.contiguous_format)
    cache96 = tensor(1, 96, 2, 16, 32)
    front = conv_kernel.Front(cache96)
    gamma = tensor(96, 1, 1, 1, fmt=torch.contiguous_format)
    x384 = tensor(1, 384, 4, 8, 16)
    w384 = tensor(384, 384, 3, 3, 3, fmt=torch.contiguous_format) * 0.02
    small = tensor(1, 96, 2, 2, 32)
    rows = []
    with torch.no_grad(), tier.active(tier.FastPlan()):
        if box_conv.runs(x96, w96):
            boxed = conv_kernel.cached_box_weight(w96)
            out = torch.empty_like(x96)
            rows.append(
                (
                    "box_conv.conv3d, causal, its cache read where it lies",
                    lambda: box_conv.conv3d(x96, w96, b96, (0, 1, 1), out, boxed, causal=True, cache=cache96),
                )
            )
            rows.append(
                (
                    "tier.conv_with_bias -> box_conv (the decode's call)",
                    lambda: tier.conv_with_bias(F.conv3d, x96, w96, b96, 1, (0, 1, 1), 1, 1, front=front),
                )
            )
        rows.append(("norm.rms_norm + SiLU", lambda: norm.rms_norm(x96, gamma, 0.0, 9.8, silu=True)))
        rows.append(("norm.rms_norm + SiLU, two rows", lambda: norm.rms_norm(small, gamma, 0.0, 9.8, silu=True)))
        rows.append(("F.conv3d, cuDNN, 384 channels", lambda: F.conv3d(x384, w384, None, 1, 1)))
        rows.append(("torch.empty_like", lambda: torch.empty_like(x96)))
        rows.append(("Tensor.copy_", lambda: small.copy_(small)))
        rows.append(("Tensor.zero_", lambda: small.zero_()))
        print(f"{torch.cuda.get_device_name()}: host CPU time per call, medians of {args.reps} x {args.calls} calls")
        for name, fn in rows:
            direct, jit = _host_time(fn, args.calls, args.reps)
            print(f"  {name:55s} {direct * 1e6:7.1f} us   jit {jit * 1e6:7.1f} us", flush=True)
    if args.decode:
        from diffusers import AutoencoderKLWan

        import vaeshard
        from vaeshard.cli.io import NAMED_CONFIGS

        vae = AutoencoderKLWan(**NAMED_CONFIGS["wan21"][1]).eval().to(dev, bf16)
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(cuda_graphs=False))
        z = torch.randn(1, 16, 21, 8, 16, device=dev, dtype=bf16)
        with torch.no_grad():
            direct, jit = _host_time(lambda: vae.decode(z), 1, args.reps)
        print(
            f"  {'a decode, Wan 2.1, latent 1x16x21x8x16, 1 rank':55s} {direct * 1e3:7.1f} ms   jit {jit * 1e3:7.1f} ms"
        )


# --- windows ---------------------------------------------------------------------------------

# LTX-2.5's diffusion decoder (its real config) at 1088 x 1920, 121 frames (latent 16 x 34 x 60): each
# stage's token grid (T, H, W), window and heads (head_dim 64); the blocks of a stage share the grid
WINDOW_STAGES = [
    ("stage 1", (18, 34, 60), (3, 7, 7), 32),
    ("stage 2", (18, 68, 120), (3, 7, 7), 16),
    ("stage 3", (35, 68, 120), (3, 5, 5), 8),
    ("stage 4", (69, 136, 240), (3, 5, 5), 8),
    ("stage 5", (121, 272, 480), (11, 11, 11), 4),
]


def _peak_and_time(fn, reps: int, cuda: bool) -> tuple[float, float | None]:
    """(median seconds of `fn`, its peak GiB above what was allocated before it; None on the CPU)."""
    if not cuda:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times), None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    seconds = _time(fn, 1, reps)
    return seconds, (torch.cuda.max_memory_allocated() - base) / 2**30


def _window_row(name, grid, kernel, heads, args, flex_attention, windowed_attention, block_mask) -> dict:
    cuda = args.device == "cuda"
    tokens = grid[0] * grid[1] * grid[2]
    g = torch.Generator(device=args.device).manual_seed(0)
    dtype = torch.bfloat16 if cuda else torch.float32
    q, k, v = (torch.randn(1, *grid, heads, 64, device=args.device, dtype=dtype, generator=g) for _ in range(3))
    q = q * 64**-0.5
    row = {"stage": name, "grid": grid, "kernel": kernel, "heads": heads, "tokens": tokens}
    row["vaeshard_s"], row["vaeshard_peak_gib"] = _peak_and_time(
        lambda: windowed_attention(q, k, v, grid, kernel), args.reps, cuda
    )
    if tokens > args.flex_tokens:
        row["flex_s"] = None
        row["why"] = f"diffusers' mask of {tokens:,}^2 pairs not built (--flex-tokens {args.flex_tokens:,})"
        return row

    def flex():
        seq = [x.reshape(1, tokens, heads, 64).transpose(1, 2) for x in (q, k, v)]
        return flex_attention(*seq, block_mask=mask, scale=1.0).transpose(1, 2).reshape(q.shape)

    mask = block_mask(*grid, kernel, args.device)
    row["flex_s"], row["flex_peak_gib"] = _peak_and_time(flex, args.reps, cuda)
    row["max_abs_diff"] = (windowed_attention(q, k, v, grid, kernel).float() - flex().float()).abs().max().item()
    return row


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def windows(argv: list[str] | None = None) -> None:
    """One neighbourhood attention of each LTX-2.5 stage: vaeshard's windows in blocks against
    diffusers' FlexAttention (its BlockMask, flex_attention compiled) where its mask fits."""
    ap = argparse.ArgumentParser(prog="kernel_costs.py windows", description=windows.__doc__)
    ap.add_argument("--stages", default="1,2,3,4,5", help="which stages (1-5; default all)")
    ap.add_argument("--frames", type=int, default=None, help="cut every grid to this many frames")
    ap.add_argument("--crop", default=None, help="H,W: cut every grid to this height and width")
    ap.add_argument("--flex-tokens", type=int, default=2**17, help="the most tokens diffusers' mask is built for")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a check of the script (fp32, eager flex)"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import warnings

    from diffusers.models.autoencoders.ltx2_diffusion_decoder import _neighborhood_block_mask
    from torch.nn.attention.flex_attention import flex_attention

    from vaeshard.layers.neighbourhood_attention import windowed_attention

    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    cuda = args.device == "cuda"
    flex = torch.compile(flex_attention, dynamic=False) if cuda else flex_attention
    crop = tuple(int(n) for n in args.crop.split(",")) if args.crop else None
    rows = []
    for name, grid, kernel, heads in (WINDOW_STAGES[int(i) - 1] for i in args.stages.split(",")):
        grid = (min(grid[0], args.frames or grid[0]), *(min(n, c) for n, c in zip(grid[1:], crop or grid[1:])))
        rows.append(_window_row(name, grid, kernel, heads, args, flex, windowed_attention, _neighborhood_block_mask))
        print(json.dumps(rows[-1]), flush=True)
        if cuda:
            torch.cuda.empty_cache()
    if args.json:
        where = torch.cuda.get_device_name() if cuda else "cpu"
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": where, "rows": rows}, f, indent=1)
    how = "compiled" if cuda else "eager"
    print(f"stage | grid | kernel | vaeshard s | peak GiB | flex ({how}) s | peak GiB | max|diff|")
    for r in rows:
        ours = f"{r['vaeshard_s']:.4f} | {_gib(r['vaeshard_peak_gib'])}"
        theirs = (
            f"{r['flex_s']:.4f} | {_gib(r['flex_peak_gib'])} | {r['max_abs_diff']:.2e}"
            if r["flex_s"] is not None
            else f"- | - | {r['why']}"
        )
        print(f"{r['stage']} | {r['grid']} | {r['kernel']} | {ours} | {theirs}")


COMMANDS = {"norm": norm, "sass": sass, "launch": launch, "windows": windows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="kernel_costs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("command", choices=COMMANDS, help="what to measure (COMMAND --help: its options)")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="the command's options")
    args = ap.parse_args(argv)
    COMMANDS[args.command](args.options)


if __name__ == "__main__":
    main()
