"""Weights in the layouts the kernels read, kept on the weight tensors they come from.

A kernel that reads a weight in another layout (the Triton convolution's GEMM matrix, box_conv's
rows, the upsampling phases' summed taps) makes it once and keeps it on the weight tensor, under a
name of its own, and makes it again when the weight changes (an in-place update bumps its version;
a move or a reload is a new tensor, which has none kept). `forget` drops everything kept on a
module's parameters: the one place that frees this state.
"""

from __future__ import annotations

import torch

_KEPT = "_vaeshard_kept"  # on a weight tensor: {name: (key, the weight in that layout)}


def kept(weight: torch.Tensor, name: str, make) -> torch.Tensor:
    """`make(weight)`, kept on the weight tensor under `name` and made again when the weight changes;
    made on every call for an inference tensor, which keeps no version counter."""
    if weight.is_inference():
        return make(weight)
    key = (weight._version, weight.dtype, weight.device, weight.data_ptr())
    held = weight.__dict__.setdefault(_KEPT, {})
    entry = held.get(name)
    if entry is None or entry[0] != key:
        entry = held[name] = (key, make(weight))
    return entry[1]


def holds(weight: torch.Tensor, name: str) -> bool:
    """Whether `weight` keeps a layout under `name`."""
    return name in weight.__dict__.get(_KEPT, {})


def forget(module: torch.nn.Module) -> None:
    """Drop every layout kept on `module`'s parameters (`vaeshard.release`)."""
    for p in module.parameters():
        p.__dict__.pop(_KEPT, None)
