"""Which kernel runs a fast-tier convolution, and what it reads and writes: one answer per convolution.

A layer asks `route` once before it builds a causal convolution's input buffer (`like=`: whether the
buffer holds the width padding as zero columns, and whether the kernel reads the causal time padding
from the cache where it lies), and once with the written buffer (`x=`: which kernel runs it and what
that kernel can do as it stores). The answers come from the kernels' own rules (conv3d.plan,
conv3d.wants_zero_columns, conv3d.reads_front, box_conv.runs and the epilogue rules); nothing else in
vaeshard asks those.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import conv3d


class Route(NamedTuple):
    """One convolution's route. `plan`: the kernel's tiling (`plan.box`: the Gluon kernel, else the
    Triton one), or None for PyTorch's convolution (cuDNN). `front`: the causal time padding read from
    this cache where it lies (conv3d.Front), or None. `zero_columns`: zero columns a side that the input
    buffer holds in place of the width padding."""

    plan: conv3d.ConvPlan | None = None
    front: conv3d.Front | None = None
    zero_columns: int = 0

    @property
    def kernel(self) -> str:
        return "pytorch" if self.plan is None else "box" if self.plan.box else "triton"

    @property
    def adds_residual(self) -> bool:
        """Whether the kernel adds a residual in place as it stores (`add_to`), rather than a pass after it."""
        return self.plan is not None and conv3d.adds_in_epilogue(self.plan)

    @property
    def norms_output(self) -> bool:
        """Whether the kernel computes the next RMS norm (+ SiLU) as it stores (`norm`, `out`)."""
        return self.plan is not None and conv3d.norms_in_epilogue(self.plan)


PYTORCH = Route()


def route(
    conv,
    weight: torch.Tensor,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    kernels_on: bool,
    x: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    front: conv3d.Front | None = None,
    like: torch.Tensor | None = None,
    width: int | None = None,
    causal: bool = False,
    cache: torch.Tensor | None = None,
) -> Route:
    """The route of `conv(x, weight, bias, stride, padding, dilation, groups)` (F.conv2d or F.conv3d) in
    a request whose fast tier may run vaeshard's convolution kernels (`kernels_on`: triton_convs).

    With `x` (the input as it will be convolved; `padding` what the convolution applies to it; `front`
    as an earlier route decided): the kernel that runs it, PYTORCH where none takes it (a 2-D
    convolution, a bias of another dtype, which PyTorch's own call rejects, or shapes no kernel was
    measured faster on).

    With `like` instead (planning the input buffer of a 3-D convolution for new frames of `like`'s
    dtype and device, `width` columns; `padding` the convolution's own): `zero_columns` 1 where an
    unpadded buffer's row tiles do not fit and the width padding is one column a side (the caller
    passes 0 for an axis it fills itself, as a sharded width); and where `causal` (its time padding is
    the `kernel - 1` frames before, held whole in `cache` or zeros, None) and no zero columns are
    held, `front`: the kernel reads that padding from the cache where it lies."""
    if not kernels_on or conv is not F.conv3d:
        return PYTORCH
    if x is not None:
        if bias is not None and bias.dtype != x.dtype:
            return PYTORCH
        plan = conv3d.plan(x, weight, stride, padding, dilation, groups, front=front)
        return PYTORCH if plan is None else Route(plan, front)
    plain = _triple(stride) == (1, 1, 1) and _triple(dilation) == (1, 1, 1) and groups == 1
    columns = int(plain and _triple(padding)[2] == 1 and conv3d.wants_zero_columns(like, weight, width))
    reads = None
    if causal and not columns and plain and weight.shape[2] == 3 and conv3d.reads_front(like, weight, cache):
        reads = conv3d.Front(cache)
    return Route(None, reads, columns)


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)
