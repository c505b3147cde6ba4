"""The shapes and memory layouts of the tensors a process group exchanges (runtime/comm.py): pure
tensor bookkeeping, no communication."""

from __future__ import annotations

import torch


def with_extent(shape: torch.Size, dim: int, extent: int) -> list[int]:
    shape = list(shape)
    shape[dim] = extent
    return shape


def memory_format(x: torch.Tensor):
    if x.ndim == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    if x.ndim == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def exchange_order(buf: torch.Tensor) -> tuple[int, ...]:
    """The order of dimensions halo rows of `buf` travel in: channels last where `buf` holds them
    innermost (4-D or 5-D, more than one channel), else as they are. It depends only on how the
    buffer was laid out, which every rank of an exchange does alike, so sender and receiver agree on
    the rows' shape and byte order."""
    if buf.ndim in (4, 5) and buf.shape[1] > 1 and buf.stride(1) == 1:
        return (0, *range(2, buf.ndim), 1)
    return tuple(range(buf.ndim))


def permuted(shape, order) -> list[int]:
    return [shape[i] for i in order]


def inverse(order) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def zeros_like_rows(x: torch.Tensor, dim: int, rows: int) -> torch.Tensor:
    return x.new_zeros(with_extent(x.shape, dim, rows))
