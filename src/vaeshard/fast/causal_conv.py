"""Causal convolutions that pad time by replicating the clip's first frame, run chunk by chunk in a
frame loop (frame_loop.py) with a cache of their last input frames.

The operation: `F.pad(x, time_causal_padding, mode="replicate")` (time: the first frame repeated
`t_front` times in front; height and width: the edge rows and columns repeated), then an unpadded
Conv3d child `conv` of stride 1 in time. diffusers' `HunyuanVideo15CausalConv3d` and
`HunyuanVideoCausalConv3d` are it; so is `CogVideoXCausalConv3d` in its "replicate" mode (Mochi 1's),
whose forward takes and returns a cache it ignores in that mode.

In a frame loop each chunk is padded as diffusers pads the clip (sharded: the neighbours' rows on the
sharded axis first, layers/halo.py), and then its `t_front` front frames are replaced by the
cache: the last `t_front` frames of the previous chunk's padded input, halo rows and edge columns
included, which are those of the same frames in the whole clip's padded input. So each output frame
reads the input values it reads in the whole clip. One copy of the input is made per call, as
diffusers' F.pad makes one. Outside a frame loop the halo mixin's (or diffusers') forward runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers import tier
from ..layers.halo import HaloPadThenCachedConv, HaloPadThenConv, extend_padding, safe_conv3d
from ..runtime.spatial import current
from . import frame_loop, producers


def _by_module(conv) -> str | None:
    """How `_unpadded_child` runs `conv`: "safe" (CogVideoXSafeConv3d's time chunks), "plain" (one
    call), or None (the module's own forward: another padding mode, or another forward)."""
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return None
    if type(conv).__name__ == "CogVideoXSafeConv3d":
        return "safe"
    return "plain" if type(conv).forward is torch.nn.Conv3d.forward else None


def _unpadded_child(
    conv, whole: torch.Tensor, residual: torch.Tensor | None = None, leave_bias: bool = False
) -> torch.Tensor:
    """The unpadded child convolution `conv` of a causal convolution over its padded input `whole`, as
    `conv(whole)` computes it, plus `residual` where given: diffusers' `CogVideoXSafeConv3d` in its
    time chunks (layers/halo.py `safe_conv3d`), a plain nn.Conv3d in one call; in the fast tier the
    bias (and the residual) in one vectorised pass (layers/tier.py `conv_module`), or with
    `leave_bias` (where layers/tier.py `leaves_bias`) no bias."""
    way = _by_module(conv)
    if way == "safe":
        return safe_conv3d(conv, whole, conv.padding, add_to=residual, leave_bias=leave_bias)
    if way == "plain":
        return tier.conv_module(conv, whole, conv.padding, add_to=residual, leave_bias=leave_bias)
    if leave_bias:
        raise ValueError(f"{type(conv).__name__} runs its own forward, which adds its bias")
    out = conv(whole)
    return out if residual is None else out + residual


def _child_leaving_bias(conv, whole: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(output, bias)` of the unpadded child `conv` over `whole`: without its bias, and the bias, where
    PyTorch or the fast tier adds biases in a pass of their own (layers/tier.py `leaves_bias`, the
    exact tier too); else the output with it, and None."""
    if _by_module(conv) is not None and tier.leaves_bias(conv, whole, exact_too=True):
        return _unpadded_child(conv, whole, leave_bias=True), conv.bias
    return _unpadded_child(conv, whole), None


def padded_in_loop(module, x: torch.Tensor) -> torch.Tensor:
    """`x` padded by `module.time_causal_padding` in replicate mode as the whole clip's would be, in a
    frame loop (see the module docstring); sharded, with the neighbours' rows on the sharded axis."""
    padding = tuple(module.time_causal_padding)
    ctx = current()
    if ctx is not None:
        x, padding = extend_padding(ctx, x, padding, "replicate")
    elif x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return frame_loop.cached_front(module, _replicate_padded(x, padding), padding[4])
    return frame_loop.cached_front(module, F.pad(x, padding, mode="replicate"), padding[4])


def _replicate_padded(x: torch.Tensor, padding: tuple) -> torch.Tensor:
    """`F.pad(x, padding, mode="replicate")` of a channels-last `x`, channels-last: `x` copied into a
    new buffer's interior and the padding filled in place as fast/producers.py fills it (PyTorch's
    replicate pad reads a channels-last map several times slower and returns it channels-first). A
    frame loop's later chunk leaves the front frames to its cache."""
    w_left, w_right, h_top, h_bottom, front, back = padding
    n, c, t, h, w = x.shape
    buf = torch.empty(
        (n, c, t + front + back, h + h_top + h_bottom, w + w_left + w_right),
        dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d,
    )  # fmt: skip
    buf[:, :, front : front + t, h_top : h_top + h, w_left : w_left + w].copy_(x)
    frames = buf[:, :, front : front + t]
    producers.fill_edges(frames, 3, h_top, h_bottom, "replicate")
    producers.fill_edges(frames, 4, w_left, w_right, "replicate")
    producers.fill_edges(buf, 2, front if frame_loop.first_chunk() else 0, back, "replicate")
    return buf


class CachedReplicateCausalConv3d(HaloPadThenConv):
    """Mixin for a replicate-padded causal convolution (`forward(x)`: HunyuanVideo 1.5's): cached in
    a frame loop, halo rows when sharded (layers/halo.py HaloPadThenConv) outside one; given the
    interior of its own padded input buffer (fast/producers.py: a norm wrote it), that buffer with its
    padding filled in place."""

    # the filled buffer is the tensor diffusers' F.pad hands the unpadded child (fast/producers.py)
    input_as_diffusers = True

    def producer_padding(self):
        """(F.pad tuple, time mode, space mode) of this convolution's input, for fast/producers.py; None
        where its child is strided (a sharded strided child needs `HaloPadThenConv`'s check of the
        shard extents)."""
        if any(s != 1 for s in self.conv.stride):
            return None
        return tuple(self.time_causal_padding), "replicate", "replicate"

    def forward(self, hidden_states):
        whole = producers.filled(self, hidden_states)
        if whole is not None:
            return _unpadded_child(self.conv, whole)
        return self._unproduced(hidden_states)

    def _unproduced(self, hidden_states):
        if not frame_loop.active():
            return super().forward(hidden_states)
        return _unpadded_child(self.conv, padded_in_loop(self, hidden_states))

    def adding(self, hidden_states, residual):
        """`self(hidden_states) + residual`, as a residual block ends (fast/residual_blocks.py): given its
        produced buffer, `residual` added in the convolution's bias pass; otherwise this forward, then
        the add."""
        whole = producers.filled(self, hidden_states)
        if whole is None:
            return self._unproduced(hidden_states) + residual
        return _unpadded_child(self.conv, whole, residual)

    def leaving_bias(self, hidden_states):
        """`(output, bias)` of `self(hidden_states)` for a norm that adds the bias as it reads
        (fast/residual_blocks.py): given its produced buffer and where the fast tier adds biases in a
        pass of their own (layers/tier.py `leaves_bias`), the output without the bias, and the bias;
        otherwise this forward, and None."""
        whole = producers.filled(self, hidden_states)
        if whole is None:
            return self._unproduced(hidden_states), None
        return _child_leaving_bias(self.conv, whole)


def _time_padding(kernel: int, causal: bool) -> tuple[int, int]:
    """(frames in front, frames behind) a time kernel of `kernel` frames pads with: all in front where
    causal, half on each side otherwise."""
    return (kernel - 1, 0) if causal else ((kernel - 1) // 2, (kernel - 1) // 2)


class ProducedTimePaddedConv3d:
    """Mixin for a convolution that pads time itself by repeating the clip's first frame in front
    (causal) or its first and last frames on either side, and leaves the spatial padding to its child
    nn.Conv3d `conv` (LTX-Video's `LTXVideoCausalConv3d`): given the interior of its own padded input
    buffer (fast/producers.py: a norm wrote it), that buffer with its padding filled in place,
    convolved unpadded; any other input takes the next forward in line."""

    def _space(self):
        """(height pad, width pad, mode) of the child's spatial padding; None where the child is
        strided or dilated, pads time, or pads in a mode the producers do not fill."""
        conv = self.conv
        if any(s != 1 for s in conv.stride) or any(d != 1 for d in conv.dilation):
            return None
        if isinstance(conv.padding, str) or conv.padding[0] != 0 or conv.padding_mode not in producers.MODES:
            return None
        return conv.padding[1], conv.padding[2], conv.padding_mode

    def producer_padding(self):
        """(F.pad tuple, time mode, space mode) of this convolution's input, for fast/producers.py."""
        space = self._space()
        if space is None:
            return None
        h, w, mode = space
        return (w, w, h, h, *self._time_offered()), "replicate", mode

    def _time_offered(self) -> tuple[int, int]:
        """The frames in front and behind the buffer holds: this convolution's own padding."""
        return _time_padding(self.kernel_size[0], self.is_causal)

    def _unpadded(self, whole, residual=None):
        return tier.conv_module(self.conv, whole, 0, add_to=residual)

    def _filled(self, hidden_states, **kwargs):
        """Its produced input buffer, padding filled (fast/producers.py), or None."""
        return producers.filled(self, hidden_states)

    def forward(self, hidden_states, *args, **kwargs):
        whole = self._filled(hidden_states, **kwargs)
        if whole is None or args or kwargs:
            return super().forward(hidden_states, *args, **kwargs)
        return self._unpadded(whole)

    def adding(self, hidden_states, residual, **kwargs):
        """`self(hidden_states, **kwargs) + residual`, as a residual block ends (layers/ltx_resnet.py):
        given its produced buffer, `residual` added in the convolution's bias pass (layers/tier.py
        `conv_module`); otherwise this forward, then the add."""
        whole = self._filled(hidden_states, **kwargs)
        if whole is None:
            return super().forward(hidden_states, **kwargs) + residual
        return self._unpadded(whole, residual)


class ProducedRuntimeCausalConv3d(ProducedTimePaddedConv3d):
    """The same for LTX-2's `LTX2VideoCausalConv3d`, causal or not per call (`forward(x, causal)`): its
    buffer holds the most frames either way takes (the kernel less one in front, half that behind),
    and a call convolves the frames its own padding spans."""

    def _time_offered(self) -> tuple[int, int]:
        k = self.kernel_size[0]
        return _time_padding(k, True)[0], _time_padding(k, False)[1]

    def _filled(self, hidden_states, causal: bool = True):
        return producers.filled(self, hidden_states, time=_time_padding(self.kernel_size[0], causal))

    def forward(self, hidden_states, causal: bool = True):
        whole = self._filled(hidden_states, causal=causal)
        if whole is None:
            return super().forward(hidden_states, causal=causal)
        return self._unpadded(whole)


class CachedReplicateCachedCausalConv3d(HaloPadThenCachedConv):
    """The same for `CogVideoXCausalConv3d` in "replicate" mode (`forward(x, conv_cache)` ->
    `(output, None)`: diffusers ignores the cache in that mode), as Mochi 1's decoder uses it."""

    input_as_diffusers = True

    def producer_padding(self):
        """(F.pad tuple, time mode, space mode) of this convolution's input, for fast/producers.py; None
        outside "replicate" mode or where its child is strided."""
        if self.pad_mode != "replicate" or any(s != 1 for s in self.conv.stride):
            return None
        return tuple(self.time_causal_padding), "replicate", "replicate"

    def forward(self, inputs, conv_cache=None):
        whole = producers.filled(self, inputs)
        if whole is not None:
            return _unpadded_child(self.conv, whole), None
        return self._unproduced(inputs, conv_cache)

    def _unproduced(self, inputs, conv_cache):
        if not frame_loop.active():
            return super().forward(inputs, conv_cache)
        if self.pad_mode != "replicate":
            raise ValueError(f"vaeshard's frame loop runs {type(self).__name__} only in its 'replicate' padding mode")
        return _unpadded_child(self.conv, padded_in_loop(self, inputs)), None

    def adding(self, inputs, residual, conv_cache=None):
        """`(output + residual, next cache)` of `self(inputs, conv_cache)`, as a residual block ends
        (fast/residual_blocks.py): given its produced buffer, `residual` added in the convolution's
        bias pass; otherwise this forward, then the add."""
        whole = producers.filled(self, inputs)
        if whole is None:
            out, cache = self._unproduced(inputs, conv_cache)
            return out + residual, cache
        return _unpadded_child(self.conv, whole, residual), None

    def leaving_bias(self, inputs, conv_cache=None):
        """`(output, next cache, bias)` of `self(inputs, conv_cache)` for a norm that adds the bias as
        it reads (fast/residual_blocks.py): given its produced buffer and where the fast tier adds
        biases in a pass of their own (layers/tier.py `leaves_bias`), the output without the bias,
        and the bias; otherwise this forward, and None."""
        whole = producers.filled(self, inputs)
        if whole is None:
            out, cache = self._unproduced(inputs, conv_cache)
            return out, cache, None
        out, bias = _child_leaving_bias(self.conv, whole)
        return out, None, bias


class ProducedHandedCacheConv3d:
    """Mixin for `CogVideoXCausalConv3d` in its constant mode with a time kernel of more than one frame
    (`forward(x, conv_cache)` -> `(output, next cache)`: time padded in front by the cache its caller
    hands it, or the first frame repeated; its child `CogVideoXSafeConv3d` zero-pads space): given the
    interior of its own padded input buffer (fast/producers.py: a norm wrote it), the cache's frames
    copied in front and the padding filled in place. In the fast tier the buffer is padded in space
    too and convolved unpadded in diffusers' time chunks (layers/halo.py `safe_conv3d`); in the exact
    tier it holds the front frames only, the tensor diffusers' torch.cat makes, which the child
    convolves as diffusers calls it (`input_as_diffusers`: cuDNN pads space, the same bits). The next
    cache: the buffer's last front frames without their padding, as diffusers keeps it. Any other
    input takes the next forward in line."""

    input_as_diffusers = True  # (in the exact tier's geometry: `producer_padding`)

    def producer_padding(self):
        """(F.pad tuple, time mode, space mode) of this convolution's input, for fast/producers.py
        (the exact tier: time only); None outside the constant mode with a time kernel above one
        frame, or where the child is strided or dilated, pads time or pads space in another mode."""
        conv = self.conv
        if self.pad_mode == "replicate" or self.time_kernel_size == 1 or isinstance(conv.padding, str):
            return None
        if any(s != 1 for s in conv.stride) or any(d != 1 for d in conv.dilation) or conv.padding[0]:
            return None
        if conv.padding_mode != "zeros":
            return None
        h, w = conv.padding[1:] if tier.enabled() else (0, 0)
        return (w, w, h, h, self.time_kernel_size - 1, 0), "replicate", "zeros"

    def forward(self, inputs, conv_cache=None):
        whole = producers.filled(self, inputs, cache=conv_cache)
        if whole is None:
            return super().forward(inputs, conv_cache)
        return self._convolve(whole)

    def leaving_bias(self, inputs, conv_cache=None):
        """`(output, next cache, bias)` of `self(inputs, conv_cache)` for a norm that adds the bias as
        it reads (fast/residual_blocks.py): given its produced buffer and where PyTorch or the fast tier
        adds biases in a pass of their own (layers/tier.py `leaves_bias`, the exact tier too), the
        output without the bias, and the bias; otherwise this forward, and None."""
        whole = producers.filled(self, inputs, cache=conv_cache)
        if whole is None:
            return (*super().forward(inputs, conv_cache), None)
        if not tier.leaves_bias(self.conv, whole, exact_too=True):
            return (*self._convolve(whole), None)
        return (*self._convolve(whole, leave_bias=True), self.conv.bias)

    def _convolve(self, whole, residual=None, leave_bias=False):
        """(output, next cache) of the child over the filled buffer `whole`: in the exact tier
        diffusers' call (layers/halo.py `safe_conv3d`, cuDNN padding space) on the tensor its torch.cat
        makes; in the fast tier unpadded over the buffer padded in space too."""
        front = self.time_kernel_size - 1
        if not tier.enabled():
            out = safe_conv3d(self.conv, whole, self.conv.padding, add_to=residual, leave_bias=leave_bias)
            return out, whole[:, :, whole.shape[2] - front :].clone()
        h, w = self.conv.padding[1:]
        kept = whole[:, :, whole.shape[2] - front :, h : whole.shape[3] - h, w : whole.shape[4] - w]
        return safe_conv3d(self.conv, whole, 0, add_to=residual, leave_bias=leave_bias), kept.clone()

    def adding(self, inputs, residual, conv_cache=None):
        """`(output + residual, next cache)` of `self(inputs, conv_cache)`, as a residual block ends
        (fast/residual_blocks.py): given its produced buffer, `residual` added in the convolution's
        bias pass (layers/halo.py `safe_conv3d`: where diffusers runs one chunk; in the exact tier with
        diffusers' spatial padding, by cuDNN); otherwise this forward, then the add."""
        whole = producers.filled(self, inputs, cache=conv_cache)
        if whole is None:
            out, cache = super().forward(inputs, conv_cache)
            return out + residual, cache
        return self._convolve(whole, residual)


def loop_problem(module) -> str | None:
    """Why `module` cannot run in a frame loop (None: it can): its time padding must be causal (all
    in front, the kernel less one frames) and its convolution of stride 1 and not dilated in time."""
    if module.time_causal_padding[4:] != (module.conv.kernel_size[0] - 1, 0):
        return "a causal convolution whose time padding is not the kernel less one frames, all in front"
    if module.conv.stride[0] != 1 or module.conv.dilation[0] != 1:
        return "a causal convolution strided or dilated in time"
    return None
