"""The fast tier's conv-input buffer protocol: a causal convolution's whole input (causal zero frames,
cached frames, the new frames, halo rows, zero columns) built in one channels-last buffer that the
layer before it writes into, and diffusers' feature-cache bookkeeping around it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import tuning
from ..kernels.norm import rms_norm
from ..runtime import graphs


def buffer_shape(new, rows, columns: int, tpad: int) -> tuple[int, ...]:
    """A causal convolution's input buffer's shape for `new` frames behind `tpad` ones, with the halo
    rows `rows` ((sharded dim or None, before, after)) and `columns` zero columns a side."""
    dim, before, after = rows
    shape = list(new)
    shape[2] += tpad
    if dim is not None:
        shape[dim] += before + after
    shape[-1] += 2 * columns
    return tuple(shape)


def copy_frames(dst: torch.Tensor, src: torch.Tensor, dim: int) -> None:
    """`dst.copy_(src)`; one frame (index of `dim`) at a time where `dst` is not one dense block but
    each of its frames is, laid out as `src`'s: a buffer's frames between its halo rows (sharded by
    height, channels-last), each a plain memory copy where one copy of the whole would be a strided
    copy kernel; up to tuning.COPY_FRAMES_MAX frames, where that measured faster (docs/tuning.md,
    entry `COPY_FRAMES_MAX`; more: one strided copy). The same values either way."""
    frames = dst.shape[dim]
    if 1 < frames <= tuning.COPY_FRAMES_MAX and dst.shape == src.shape and not _dense(dst):
        d, s = dst.select(dim, 0), src.select(dim, 0)
        if same_layout(d, s) and _dense(d):
            for i in range(frames):
                dst.select(dim, i).copy_(src.select(dim, i))
            return
    dst.copy_(src)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, and the same strides wherever an axis has more than one element (a part of a
    tensor's frames has its strides, though it spans fewer frames)."""
    return a.shape == b.shape and all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill one block of memory without gaps (in some order of its dims)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


CACHE_T = 2  # frames of a causal convolution's input that diffusers keeps for the next chunk


def causal_conv_step(conv: nn.Module, x: torch.Tensor, feat_cache: list, feat_idx: list) -> torch.Tensor:
    """diffusers' step for a causal convolution with a feature cache: `conv(x, cache)`, then the
    cache entry updated with x's last frames (`store_cache`: in place where it can be)."""
    idx = feat_idx[0]
    feat_idx[0] += 1
    old = feat_cache[idx]
    y = conv(x, old)
    store_cache(feat_cache, idx, old, x)
    return y


def norm_into_causal_conv(norm, pre_bias, conv, x, feat_cache, feat_idx, halo_rows=None) -> CausalInput:
    """silu(norm(x)) written into `conv`'s input buffer, with diffusers' feature-cache bookkeeping;
    `convolve()` on the result runs the convolution (`halo_rows`: see HaloCausalConv3d)."""
    pending = causal_input(conv, x, feat_cache, feat_idx, halo_rows)
    rms_norm(x, norm.gamma, norm.bias, norm.scale, silu=True, pre_bias=pre_bias, out=pending.new)
    return pending


def causal_input(conv, like, feat_cache, feat_idx, halo_rows=None, shape=None) -> CausalInput:
    """`conv`'s input buffer for new frames shaped like `like` (or `shape`, in `like`'s dtype and on
    its device), its cached frames in place, with diffusers' feature-cache bookkeeping: the caller
    writes the new frames into the result's `new`, then calls `convolve()`."""
    cache, idx = None, None
    if feat_cache is not None:
        idx = feat_idx[0]
        cache = feat_cache[idx]
        feat_idx[0] += 1
    buf, new, ready, front = conv.input_buffer(like, cache, halo_rows, shape)
    frames = buf[:, :, buf.shape[2] - new.shape[2] :]  # the new frames with their halo rows: the next cache
    if feat_cache is not None and new.shape[2] >= CACHE_T and not _cache_in_place(cache, frames):
        # the new cache comes from the new frames alone and the buffer holds the cached frames now
        # (or `front` holds them until the convolution has read them): the entry released first, so
        # the old and the new cache are never alive together past the convolution
        feat_cache[idx] = cache = None
    return CausalInput(conv, buf, new, frames, ready, halo_rows, feat_cache, idx, cache, front)


class CausalInput:
    """A causal convolution's written input buffer whose cache update is still to come: diffusers'
    cache of the input's last frames is taken after the halo exchange, with the frames' halo rows
    (sharded), so the next call copies it into its buffer whole, one contiguous copy instead of a
    strided one each way, and exchanges only its new frames. The same values: the halo rows of a
    cached frame are those the exchange would bring again."""

    def __init__(self, conv, buf, new, frames, ready, halo_rows, feat_cache, idx, old, front=None):
        self.conv, self.buf, self.new, self.frames = conv, buf, new, frames
        self.width = new.shape[-1]  # (the buffer may be wider: zero columns, HaloCausalConv3d)
        self.ready, self.halo_rows = ready, halo_rows
        self.feat_cache, self.idx, self.old = feat_cache, idx, old
        self.front = front  # (the time padding read from the old cache where it lies, HaloCausalConv3d.input_buffer)

    def output_shape(self) -> tuple[int, ...]:
        return self.conv.output_shape(self.buf, self.width, self.front)

    def norms_in_epilogue(self) -> bool:
        """Whether `convolve(norm=..., out=...)` would compute the norm in the convolution kernel's
        epilogue into a causal input buffer (`HaloCausalConv3d.norms_in_epilogue`)."""
        return self.conv.norms_in_epilogue(self.buf, self.width, self.front)

    def convolve(
        self, with_bias: bool = True, add_to: torch.Tensor | None = None, norm=None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The convolution (`HaloCausalConv3d.forward_buffer`; `add_to`: added to that tensor in
        place, which is returned; `norm`, `out`: that norm of it written into `out`, returned), then
        the cache update; the buffer is dropped."""
        y = self.conv.forward_buffer(
            self.buf, with_bias, self.halo_rows, self.ready, add_to, norm, out, self.width, self.front
        )
        if self.feat_cache is not None:  # (stream order: the convolution has read the old cache)
            store_cache(self.feat_cache, self.idx, self.old, self.frames, owned=True)
        self.buf = self.new = self.frames = self.old = self.front = None
        return y


def _cache_in_place(cache, frames: torch.Tensor) -> bool:
    """Whether diffusers' cache update after `frames` (their last CACHE_T frames; after one frame,
    the old cache's last frame in front of it) can be written into the old cache tensor: it has
    that shape already (every decoder call after the second). The entry then keeps its storage
    from call to call instead of a new tensor each call, which leaves the caching allocator fewer
    blocks to split and less memory reserved; the values are the same."""
    t = frames.shape[2]
    return (
        isinstance(cache, torch.Tensor)
        and cache.shape == (*frames.shape[:2], CACHE_T, *frames.shape[3:])
        and cache.dtype == frames.dtype
        and cache.device == frames.device
        and (t >= CACHE_T or (CACHE_T == 2 and t == 1))
    )


def store_cache(feat_cache: list, idx: int, old, frames: torch.Tensor, owned: bool = False) -> None:
    """diffusers' cache update after a causal convolution's input `frames`, once the old entry `old`
    has been read: the last CACHE_T frames; with fewer, the old cache's last frame in front (zeros
    after an upsampler's "Rep" mark, nothing before the first call). Written into `old` where
    `_cache_in_place` allows, else stored as a new tensor. `owned`: `frames` is a buffer of the
    caller's that nothing writes or reads afterwards; where it is exactly CACHE_T frames of its own
    storage (the box kernel's buffers, which hold only the new frames, at parts of two frames:
    FastPlan.layer_frames), it becomes the cache itself, not copied, and `old` is dropped."""
    if owned and _cache_in_place(old, frames) and frames.shape[2] == CACHE_T and _whole_storage(frames):
        feat_cache[idx] = frames
        return
    target = graphs.cache_target(idx)
    if target is not None and target is not old and _cache_in_place(target, frames):
        # a request with kept CUDA graphs capturing its first or second call: the new cache goes
        # where the steady graph reads it (the same values as below)
        if frames.shape[2] >= CACHE_T:
            target.copy_(frames[:, :, -CACHE_T:])
        elif old is None:  # the first call's one frame: a one-frame cache, the target's last frame
            feat_cache[idx] = target[:, :, -1:]
            feat_cache[idx].copy_(frames)
            return
        else:  # one new frame after the first call's (or, after an upsampler's "Rep", zeros)
            if isinstance(old, str):
                target[:, :, :1].zero_()
            else:
                target[:, :, :1].copy_(old[:, :, -1:])  # (where old is that last frame: the convolution has read it)
            target[:, :, 1:].copy_(frames)
        feat_cache[idx] = target
        return
    if _cache_in_place(old, frames):
        if frames.shape[2] >= CACHE_T:
            old.copy_(frames[:, :, -CACHE_T:])
        else:  # one new frame: the old cache's last frame moves to the front
            old[:, :, :1].copy_(old[:, :, 1:])
            old[:, :, 1:].copy_(frames)
        return
    cache_x = frames[:, :, -CACHE_T:].clone()
    if cache_x.shape[2] < 2 and old is not None:
        last = torch.zeros_like(cache_x) if isinstance(old, str) else old[:, :, -1:].to(cache_x.device)
        cache_x = torch.cat([last, cache_x], dim=2)
    feat_cache[idx] = cache_x


def _whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` spans its storage exactly (not a view into a larger tensor's)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def upsample_into_buffer(conv, like, frames, b, t, c, h, w):
    """`conv`'s input buffer holding the nearest 2x of `frames` ((b, t, c, h, w), or (b, t / 2, 2,
    c, h, w) after a time convolution), written in one strided copy (nearest-exact at an integer
    scale takes source row i // 2)."""
    buf, core = conv.input_buffer(like, (b * t, c, 2 * h, 2 * w))
    lead = frames.shape[:-3]
    target = core.unflatten(0, lead).unflatten(-1, (w, 2)).unflatten(-3, (h, 2))
    target.copy_(frames[..., None, :, None].expand(*lead, c, h, 2, w, 2))
    return buf
