#!/usr/bin/env python3
"""The host's cost of one call of each kernel the fast tier launches, at shapes too small to keep the
GPU busy: what a decoder call spends on the host per layer, apart from the GPU work.

    python3 benchmarks/launch_cost.py --calls 400 --decode

Each row times `--calls` calls (the device synchronised every 100, so the launch queue never fills)
and prints the host's CPU time per call (`time.thread_time`: the time the thread ran, not the time a
busy machine kept it waiting), medians of `--reps` runs, twice, interleaved run by run: with the
compiled kernels launched directly (`triton_support.launch`, the library's way) and with every
launch through Triton's JIT function (`jit`). A host's speed moves from machine to machine and
call to call by more than these differences, so only the two columns of one run compare.
`--decode` adds the host's time for a whole decode (Wan 2.1's real config, a latent of 21 frames of
8 x 16, one rank, no CUDA graph), whose GPU work is small beside it. A sharded decode's host issues
about 1600 Triton launches (about 390 of them box_conv's) and 420 cuDNN convolutions per Wan 2.1
decode of 21 latent frames (`rank_alone.py --host-profile`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def _time(fn, calls: int, reps: int) -> tuple[float, float]:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode", action="store_true", help="also: a whole decode at a small latent")
    args = ap.parse_args()
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
            direct, jit = _time(fn, args.calls, args.reps)
            print(f"  {name:55s} {direct * 1e6:7.1f} us   jit {jit * 1e6:7.1f} us", flush=True)
    if args.decode:
        from diffusers import AutoencoderKLWan

        import vaeshard
        from vaeshard.cli.io import NAMED_CONFIGS

        vae = AutoencoderKLWan(**NAMED_CONFIGS["wan21"][1]).eval().to(dev, bf16)
        vaeshard.parallelize(vae, fast=vaeshard.FastOptions(cuda_graphs=False))
        z = torch.randn(1, 16, 21, 8, 16, device=dev, dtype=bf16)
        with torch.no_grad():
            direct, jit = _time(lambda: vae.decode(z), 1, args.reps)
        print(
            f"  {'a decode, Wan 2.1, latent 1x16x21x8x16, 1 rank':55s} {direct * 1e3:7.1f} ms   jit {jit * 1e3:7.1f} ms"
        )


if __name__ == "__main__":
    main()
