"""Triton, where it is installed: one place for the optional import and for where the fast tier's
Triton kernels (fast.py, conv_kernel.py) can run.

They run on CUDA tensors, and on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set
before Triton is imported: how CI checks what they compute). CPU-only installs need not have Triton.
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the installation
    triton = tl = None


def interpreting() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(x) -> bool:
    """Whether Triton is installed and its kernels can take the tensor `x` (CUDA, or the interpreter)."""
    return triton is not None and (x.is_cuda or interpreting())


def frame_stride(t) -> int:
    """The stride the convolution kernels step by along the samples-and-frames axis of an (N, C, T,
    H, W) tensor they write (frame n * T + f lies at (n * T + f) * frame_stride(t)): its frame stride,
    or with one frame per sample its sample stride, as a size-1 axis's own stride can be anything
    (an upsampler's output after one frame, a view of (N, C, H, W) frames, has the channels')."""
    return t.stride(0) if t.shape[2] == 1 else t.stride(2)
