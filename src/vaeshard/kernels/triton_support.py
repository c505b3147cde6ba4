"""Triton, where it is installed: one place for the optional import, for where the fast tier's
Triton kernels (kernels/: norm.py, conv3d.py, phases.py, attention.py) can run, and for how they and
box_conv.py's Gluon kernel are launched.

They run on CUDA tensors, and on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set
before Triton is imported: how CI checks what they compute). CPU-only installs need not have Triton.

Only the Triton versions of SUPPORTED: the kernels use Triton's and Gluon's APIs as those versions
define them, and another version may refuse or miscompile them. With any other version (or none)
`triton` and `tl` are None here, as without Triton, so no kernel is defined or launched and the
fast tier runs PyTorch's layers; `unavailable()` says why, and `vaeshard.plan(...).explain()` shows it.
"""

from __future__ import annotations

import functools
import os

# (major, minor) of the Triton versions the kernels were compiled, checked and measured with
SUPPORTED = ((3, 6), (3, 7))

try:
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the installation
    triton = tl = None

VERSION: str | None = getattr(triton, "__version__", None)  # the installed Triton's, None without one


@functools.lru_cache(maxsize=8)
def _why_not(version: str | None) -> str | None:
    if version is None:
        return "Triton is not installed"
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        major = minor = None
    if (major, minor) in SUPPORTED:
        return None
    supported = " and ".join(f"{a}.{b}.x" for a, b in SUPPORTED)
    return f"Triton {version} is installed and vaeshard's kernels support Triton {supported}"


def unavailable() -> str | None:
    """Why vaeshard's Triton kernels cannot run in this installation (not installed, or a version
    outside SUPPORTED), or None where they can."""
    return _why_not(VERSION)


if triton is not None and unavailable() is not None:
    triton = tl = None  # as without Triton: the kernel modules define nothing and every layer runs PyTorch's


def interpreting() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(x) -> bool:
    """Whether a supported Triton is installed and its kernels can take the tensor `x` (CUDA, or the
    interpreter)."""
    return triton is not None and unavailable() is None and (x.is_cuda or interpreting())


def frame_stride(t) -> int:
    """The stride the convolution kernels step by along the samples-and-frames axis of an (N, C, T,
    H, W) tensor they write (frame n * T + f lies at (n * T + f) * frame_stride(t)): its frame stride,
    or with one frame per sample its sample stride, as a size-1 axis's own stride can be anything
    (an upsampler's output after one frame, a view of (N, C, H, W) frames, has the channels')."""
    return t.stride(0) if t.shape[2] == 1 else t.stride(2)


# --- launches ----------------------------------------------------------------------------------------

# Each Triton launch through the JIT function binds and classifies every argument again (its
# specialization: a tensor's dtype and 16-byte alignment, an integer's width and whether it is 1 or a
# multiple of 16, a descriptor's dtype, block and layout) to find the compiled kernel, a sizeable
# share of the host's time per launch (docs/tuning.md, entry `kernels/triton_support.py launch`).
# `launch` keeps the compiled kernel per key of the arguments, a key at least as fine as that
# classification (every integer by its value), and launches it directly when the key was seen before.
_COMPILED = "_vaeshard_compiled"
_KEYS_KEPT = 4096  # per kernel; past it the kept kernels are dropped and found again


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)` (`args`: the kernel's leading parameters in order, `kwargs`:
    the rest by name, constexprs and launch options such as num_warps; parameters with defaults are
    not left out), the same launch, through the compiled kernel kept for these arguments' key where
    there is one. In Triton's interpreter, or for arguments of a kind `_key` does not classify, the
    JIT function launches as usual."""
    key = None if interpreting() else _key(args, kwargs)
    kept = kernel.__dict__.setdefault(_COMPILED, {})
    compiled = kept.get(key) if key is not None else None
    if compiled is None:
        compiled = _first_launch(kernel, grid, args, kwargs)
        if key is not None and hasattr(compiled, "run") and hasattr(compiled, "packed_metadata"):
            if len(kept) >= _KEYS_KEPT:
                kept.clear()
            kept[key] = compiled
        return
    # every parameter in order, as the JIT function hands them to the compiled kernel's launcher
    # (which skips the constexprs: they are compiled in)
    compiled[(*grid, *(1,) * (3 - len(grid)))](*args, *(kwargs[name] for name in kernel.arg_names[len(args) :]))


def _first_launch(kernel, grid: tuple, args: tuple, kwargs: dict):
    """A launch whose compiled kernel is not kept here yet: Triton finds it in vaeshard's cache folder,
    or compiles it into it (kernels/cache.py). An entry there that Triton cannot read makes the
    folder stale: it is discarded with a warning and the kernel compiled again."""
    if interpreting():
        return kernel[grid](*args, **kwargs)
    from . import cache

    with cache.triton_kernels() as place:
        try:
            return kernel[grid](*args, **kwargs)
        except (OSError, ValueError, KeyError, EOFError) as exc:
            if place is None:
                raise
            cache.discard(place.parent, f"Triton could not read a kernel from it ({type(exc).__name__}: {exc})")
    with cache.triton_kernels():
        return kernel[grid](*args, **kwargs)


def _key(args, kwargs):
    """The arguments' key for `launch` (None: not classified), with the current CUDA device: each
    tensor by its dtype and 16-byte alignment, each integer by its value, each descriptor by its
    dtype, block and layout, the rest by name and value."""
    import torch

    if not torch.cuda.is_initialized():  # (no CUDA kernel has run: a CPU install, or stand-ins in tests)
        return None
    parts = [torch.cuda.current_device()]
    for a in args:
        kind = type(a)
        if kind is int or kind is bool or a is None:
            parts.append((kind, a))
        elif kind is float:
            parts.append(kind)
        elif isinstance(a, torch.Tensor):
            parts.append((a.dtype, a.data_ptr() % 16 == 0))
        elif hasattr(a, "block_shape") and hasattr(a, "base"):  # a TMA descriptor (Triton's or Gluon's)
            parts.append(
                (kind, a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None), getattr(a, "padding", None))
            )
        else:
            return None
    for name, value in kwargs.items():
        if not (value is None or type(value) in (int, float, bool, str)):
            return None
        parts.append((name, value))
    return tuple(parts)
