"""Halo rows for diffusers' `CogVideoXCausalConv3d` in its constant padding mode (CogVideoX's causal
convolution, `AutoencoderKLCogVideoX`), through its child `CogVideoXSafeConv3d`.

Contract of the modules: `CogVideoXCausalConv3d.forward(inputs, conv_cache=None)` pads time only
(the previous frame batch's last `k_t - 1` input frames, `conv_cache`, or the first frame repeated),
returns `(output, new_conv_cache)` with the cache cut from the time-padded input before any spatial
padding, and leaves the spatial zero padding to its child `conv`, an `nn.Conv3d` subclass
(`CogVideoXSafeConv3d`) whose `padding` is (0, p_h, p_w) and whose forward cuts inputs above 2 GiB
into chunks along time (overlapping by `k_t - 1` frames) and concatenates the outputs. Time is never
sharded, so the wrapper and its cache stay diffusers' own, each rank keeping the cache of its own
rows; the child is swapped (`HaloSafeConv3d`): sharded, the sharded axis is extended by the rows its
zero padding would cover, taken from the neighbouring ranks (zeros at the global edges), once for
the whole input (cached frames included: their halo rows are the neighbours' cached rows), and the
convolution then runs without padding on that axis, in diffusers' time chunks (the chunk count from
this rank's input, which changes no value: each output frame sees the same input frames). Outside a
sharded request the original forward runs. The replicate mode (Mochi's) is
layers/replicate_conv.py.

Requirements a family checks: odd spatial kernel with 'same' zero padding, stride and dilation 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current

# diffusers' CogVideoXSafeConv3d: inputs above this many GiB (counted at 2 bytes per value) go in parts
SAFE_CONV_GIB = 2


class HaloSafeConv3d:
    """Mixin for `CogVideoXSafeConv3d` with spatial 'same' zero padding (see the module docstring)."""

    def forward(self, input):
        ctx = current()
        if ctx is None:
            return super().forward(input)
        slot = 1 if ctx.axis == HEIGHT else 2  # (T, H, W) index of the sharded axis
        padding = list(self.padding)
        if padding[slot]:
            input = ctx.halo_pad(input, ctx.dim(input), padding[slot], padding[slot])
            padding[slot] = 0
        return safe_conv3d(self, input, tuple(padding))


def safe_conv3d(conv, x: torch.Tensor, padding) -> torch.Tensor:
    """`conv` (an nn.Conv3d with zeros padding, stride 1 in time) of `x` with `padding`, in diffusers'
    CogVideoXSafeConv3d time chunks: above SAFE_CONV_GIB, `int(GiB / 2) + 1` chunks, each after the
    first led by the previous chunk's last `k_t - 1` frames; at most one chunk per `k_t` frames (where
    diffusers' chunks would be shorter than the kernel, and fail)."""

    def run(part):
        return F.conv3d(part, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)

    gib = x.numel() * 2 / 1024**3
    if gib <= SAFE_CONV_GIB:
        return run(x)
    kt = conv.kernel_size[0]
    chunks = torch.chunk(x, min(int(gib / SAFE_CONV_GIB) + 1, max(1, x.shape[2] // kt)), dim=2)
    if kt > 1:
        chunks = [chunks[0]] + [
            torch.cat((chunks[i - 1][:, :, -kt + 1 :], chunks[i]), dim=2) for i in range(1, len(chunks))
        ]
    return torch.cat([run(part) for part in chunks], dim=2)
