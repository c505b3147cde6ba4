"""The exactness tolerances of vaeshard's parity tests, in one place, and the checks that apply them.

A parity test compares vaeshard's result with diffusers' own single-process result for the same
weights and input (the same device, dtype and, on CPU, thread count), never with itself and never
with zeros. The user-facing contract these follow is in README.md ("Exactness") and BENCHMARKS.md.
"""

from __future__ import annotations

import torch

# spatial shard and the fast tier against diffusers' untiled decode, CPU fp32, at the tests' small
# sizes (RMS-norm families: Wan, Qwen-Image)
CPU_FP32 = 1e-5
# the same where GroupNorm / BatchNorm statistics are combined across ranks, and at real sizes
CPU_FP32_GROUPNORM = 1e-4
CPU_FP32_REAL_SIZES = 1e-4
# spatial shard on CUDA, fp32 with TF32 off
CUDA_FP32 = 1e-4
# half precision in the CPU tests (fp16 through Triton's interpreter, or a stand-in of the kernel)
# against diffusers' fp32 decode: max and mean |diff|
HALF_MAX, HALF_MEAN = 5e-2, 2e-3
# CUDA bf16 (benchmarks/gpu_parity.py): against diffusers' fp32 decode with TF32 off, at most these
# times as far as diffusers' own bf16 decode (mean, max), and within BF16_MAX of diffusers' bf16 output
BF16_MEAN_RATIO, BF16_MAX_RATIO, BF16_MAX = 1.10, 1.25, 5e-2


def max_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape, (tuple(got.shape), tuple(ref.shape))
    return (got.double() - ref.double()).abs().max().item()


def assert_real(ref: torch.Tensor) -> None:
    """The reference holds real values (a decode of random weights has a std of about 0.1-0.3)."""
    assert ref.numel() and ref.float().std().item() > 1e-3, "the reference is (nearly) constant"


def assert_close(got: torch.Tensor, ref: torch.Tensor, tol: float = CPU_FP32, what: str = "") -> float:
    """max |got - ref| <= tol against a real reference; returns the difference."""
    assert_real(ref)
    diff = max_diff(got, ref)
    assert diff <= tol, f"{what}: max |diff| {diff:.3g} > {tol:g}"
    return diff


def assert_identical(got: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Bit for bit equal to a real reference."""
    assert_real(ref)
    assert got.shape == ref.shape and torch.equal(got, ref), (
        f"{what}: not bit-identical (max |diff| {max_diff(got, ref) if got.shape == ref.shape else 'shape'})"
    )


def assert_half_close(got: torch.Tensor, ref_fp32: torch.Tensor, what: str = "") -> tuple[float, float]:
    """A half-precision result against diffusers' fp32 decode: max and mean |diff| within HALF_MAX and
    HALF_MEAN; returns both."""
    assert_real(ref_fp32)
    err = (got.float() - ref_fp32.float()).abs()
    err_max, err_mean = err.max().item(), err.mean().item()
    assert err_max <= HALF_MAX and err_mean <= HALF_MEAN, f"{what}: max {err_max:.3g}, mean {err_mean:.3g}"
    return err_max, err_mean


def reference_from_rank0(rank: int, compute):
    """`compute()` (diffusers' result) run on rank 0 only and sent to every rank of the default group.

    Every rank builds the same weights and input (tests/models.py seeds them) and runs one torch
    thread, so rank 0's result is each rank's own; computing it once keeps N ranks on a small CI
    machine from repeating the single-process decode N times."""
    import torch.distributed as dist

    box = [compute() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
