"""The fast tier's producers: a norm + SiLU that writes its output straight into the padded input
buffer of the convolution after it, so the convolution makes no padded copy of its input and the
SiLU no pass of its own.

A family declares, as data (`NormIntoConv`, the family's `norm_into_conv`), which norm feeds which
padding convolution through which SiLU module inside one diffusers block: diffusers' forward of
that block must be `conv(silu(norm(x)))` with nothing else reading the norm's or the SiLU's output
(the family mirrors that forward). `link` ties each declared triple together at install time; a
request runs the protocol where its plan says so (`FastPlan.norm_into_conv`), in inference without
autograd and with no forward hook on the three modules (a hook could read or replace the norm's
output, which holds SiLU applied already):

1. the norm asks the convolution for the interior of its input buffer (`interior`): a new tensor
   of the padded input's shape (time front and back frames, halo rows of a sharded request, the
   spatial padding), channels-last unless the convolution says otherwise (`produced_channels_last`
   False: channels-first, where it convolves exactly the tensor diffusers' F.pad gives it),
   allocated per call from PyTorch's caching allocator, so no buffer is shared between two live
   uses and a CUDA graph captures it as any other activation; the view of its new frames and own
   rows and columns. The convolution, and the SiLU module, are told what was produced: the view's
   pointer, shape, strides and dtype (a norm applied to a channels-last view of the feature map, as
   LTX-Video's, returns that view permuted back, so diffusers' own `movedim` then gives a new
   tensor object over the same memory: the record is of the memory, not of the object);
2. the norm writes silu(norm(x)) there (kernels/norm.py `rms_norm` / `mean_rms_norm`, `out=view`);
3. the SiLU module passes on as it is the tensor it was told of, once, and applies SiLU to anything
   else (`SiLUAfterProducer`);
4. the convolution, given exactly that tensor (`filled`: the record, and the view checked against
   the buffer it is part of, never guessed), fills the padding in place and runs its unpadded
   convolution on the whole buffer. Anything else takes the convolution's own path. Each record is
   used once: the next call of either module sees none.

The padding filled, in the order that makes each step read filled values only, as F.pad pads the
whole (sharded: the neighbours' rows first, as layers/halo.py `extend_padding`): the sharded axis's
halo rows from the neighbours (the space mode at the global edges), then the other spatial axes
(replicate: the edge rows or columns copied; zeros: zeroed), then the time frames in front (in a
frame loop's later chunk from the convolution's cache, else the first frame repeated, replicate, or
zeros) and behind (the last frame repeated, or zeros; never in a frame loop). A convolution offers
`producer_padding()`: (the F.pad tuple, the time mode, the space mode).
The cache is then updated exactly as `frame_loop.cached_front` does (a clone of the buffer's last
front frames, never a view of the buffer). A convolution whose caller hands it its cache
(CogVideoX's `conv_cache`: frames without spatial padding) has those frames copied into the front
frames' interior first, and their padding filled with the new frames'; it returns the next cache
itself. The same values as the convolution's own path: the padding only copies values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.modules import module as torch_module

from ..kernels import group_norm
from ..kernels.norm import mean_rms_norm, per_channel_rms_norm, rms_norm
from ..layers import tier
from ..layers.convs import HaloConv2d
from ..layers.halo import HaloFrameConv2d
from ..layers.norms import GlobalGroupNorm, runs_same, same_group_norm, whole_map_sum
from ..runtime.spatial import HEIGHT, current
from . import frame_loop

MODES = ("replicate", "zeros", "reflect")

_FEEDS = "_vaeshard_feeds"  # on the norm: (its SiLU module, the convolution it writes into)
_AFTER = "_vaeshard_after_producer"  # on the SiLU module: it follows a producing norm
_PENDING = "_vaeshard_produced"  # on the SiLU module and the convolution: the record of what was produced


@dataclass(frozen=True)
class NormIntoConv:
    """One declaration: in each module of the diffusers class `block` (whose attributes named in
    `unless` are None), the norm at attribute `norm` (an RMS norm or a GroupNorm carrying a
    `ProducingNorm` mixin) is followed by the SiLU module at `silu` and then the padding convolution
    at `conv`, and diffusers' forward of `block` passes the norm's output only through them."""

    block: str
    norm: str
    silu: str
    conv: str
    # attributes of the block that must be None for its forward to be conv(silu(norm(x))) (a
    # timestep's scale and shift between the norm and the SiLU, say)
    unless: tuple[str, ...] = ()


def link(vae, pairs: tuple[NormIntoConv, ...]) -> int:
    """Tie each declared norm to its convolution and mark its SiLU module, in every module of `vae`
    of a declared class whose three children carry the protocol's mixins (a swapped norm and SiLU,
    and a convolution with `producer_padding`); stored outside nn.Module's registries. Returns how
    many norms were linked."""
    linked = 0
    for module in vae.modules():
        for pair in pairs:
            if _class_name(module) != pair.block or any(getattr(module, a, None) is not None for a in pair.unless):
                continue
            norm, silu, conv = (getattr(module, a, None) for a in (pair.norm, pair.silu, pair.conv))
            if isinstance(norm, ProducingNorm) and isinstance(silu, SiLUAfterProducer) and _takes(conv):
                norm.__dict__[_FEEDS] = (silu, conv)
                silu.__dict__[_AFTER] = True
                linked += 1
    return linked


def unlink(module) -> None:
    module.__dict__.pop(_FEEDS, None)
    module.__dict__.pop(_AFTER, None)
    module.__dict__.pop(_PENDING, None)


def _record(t: torch.Tensor) -> tuple:
    """What identifies a produced tensor's memory: pointer, shape, strides, dtype."""
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def _told(module, t: torch.Tensor) -> bool:
    """Whether `module` was told `t` was produced for it, consuming the record either way."""
    pending = module.__dict__.pop(_PENDING, None)
    return pending is not None and pending == _record(t)


def linked_conv(norm):
    """The convolution `norm` writes into where the protocol runs (None: not linked)."""
    linked = norm.__dict__.get(_FEEDS)
    return None if linked is None else linked[1]


def _plain(modules) -> bool:
    """Inference without autograd and no hook that would see these modules' outputs: a hook could
    read or replace the norm's output, which holds SiLU applied already (and a replaced output,
    unmarked, would get SiLU a second time)."""
    if torch.is_grad_enabled() or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    return not any(m.training or m._forward_hooks or m._forward_pre_hooks for m in modules)


def _class_name(module) -> str:
    """The diffusers class name of a module, swapped or not (runtime/swap.py's `_vaeshard_base`)."""
    return getattr(type(module), "_vaeshard_base", type(module)).__name__


def _takes(conv) -> bool:
    return conv is not None and any(callable(getattr(conv, a, None)) for a in ("producer_padding", "produced_input"))


def told(conv, x: torch.Tensor) -> bool:
    """Whether `x` is the input `interior` gave `conv` (once: the record is consumed either way)."""
    return _told(conv, x)


def runs() -> bool:
    """Whether this request runs the protocol (its fast-tier plan's `norm_into_conv`)."""
    plan = tier.current()
    return plan is not None and plan.norm_into_conv


# -- the buffer's geometry --------------------------------------------------------------------------


def _geometry(x_shape, padding):
    """(the buffer's shape, the interior's start per dim) for an input of `x_shape` padded by the
    F.pad tuple `padding` (w_left, w_right, h_top, h_bottom, t_front, t_back); sharded, the sharded
    axis's padding is halo rows (the same rows, the neighbours' values)."""
    w_left, w_right, h_top, h_bottom, t_front, t_back = padding
    n, c, t, h, w = x_shape
    shape = (n, c, t + t_front + t_back, h + h_top + h_bottom, w + w_left + w_right)
    return shape, (0, 0, t_front, h_top, w_left)


def _interior_of(buf: torch.Tensor, x_shape, start) -> torch.Tensor:
    view = buf
    for dim, (begin, size) in enumerate(zip(start, x_shape)):
        if begin or size != buf.shape[dim]:
            view = view.narrow(dim, begin, size)
    return view


def interior(conv, x: torch.Tensor, channels_last: bool = True) -> torch.Tensor | None:
    """The view of a new input buffer of `conv` that an input like `x` fills, recorded as produced
    for `conv` (None where the protocol does not take this input: not 5-D, the convolution offers no
    padding it fills, `producer_padding()` None, or time padding behind the frames in a frame loop).
    A convolution that builds its own input buffer (`produced_input`: the 2-D ones, whose padding
    cuDNN applies) gives the view itself. `channels_last` False: a contiguous (channels-first) buffer,
    the layout diffusers' own padding gives its convolution, only for a convolution whose filled buffer
    is exactly the tensor diffusers' forward convolves (`input_as_diffusers`: F.pad makes all of its
    padding and its child convolves unpadded), so PyTorch's convolution of it gives diffusers' bits."""
    if not channels_last and not getattr(conv, "input_as_diffusers", False):
        return None
    own = getattr(conv, "produced_input", None)
    if own is not None:
        view = own(x) if channels_last else None
        if view is not None:
            conv.__dict__[_PENDING] = _record(view)
        return view
    offered = conv.producer_padding()
    if offered is None or x.dim() != 5:
        return None
    padding, time_mode, space_mode = offered
    if len(padding) != 6 or time_mode not in MODES or space_mode not in MODES:
        return None
    if padding[5] and frame_loop.active():
        return None
    shape, start = _geometry(x.shape, padding)
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    buf = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=layout)
    view = _interior_of(buf, x.shape, start)
    conv.__dict__[_PENDING] = _record(view)
    return view


_LOOP = object()  # `filled`'s default `cache`: the frame loop's (frame_loop.py), if one runs


def filled(conv, x: torch.Tensor, time: tuple[int, int] | None = None, cache=_LOOP) -> torch.Tensor | None:
    """`conv`'s whole padded input where `x` is the interior `interior(conv, ...)` gave (checked: the
    record, and the view's shape, strides and pointer within its buffer), its padding filled in place
    and the causal cache updated (module docstring); None for any other input. `time`: the frames in
    front and behind this call pads with, where the convolution learns them only when it is called
    (LTX-2's `causal` argument): its `producer_padding()` then offers the most of either, and the
    input returned is the buffer's frames this call reads. `cache`: where the convolution is handed
    its cache by its caller (CogVideoX's `conv_cache`): the previous call's last input frames, without
    spatial padding (they fill the front frames' interior, and their padding is filled as the new
    frames' is), or None (the first frame repeated in front); the caller keeps the next one."""
    if not _told(conv, x):
        return None
    buf = x._base
    padding, mode, space_mode = conv.producer_padding()
    ctx = current()
    shape, start = _geometry(x.shape, padding)
    if buf is None or tuple(buf.shape) != shape:
        return None
    if not (buf.is_contiguous(memory_format=torch.channels_last_3d) or buf.is_contiguous()):
        return None
    expected = _interior_of(buf, x.shape, start)
    if expected.data_ptr() != x.data_ptr() or expected.stride() != x.stride():
        return None
    w_left, w_right, h_top, h_bottom, front, back = padding
    handed = cache is not _LOOP and cache is not None
    if handed:  # the cached frames in front, then padded in space with the new ones
        if tuple(cache.shape) != (*x.shape[:2], front, *x.shape[3:]):
            return None  # (the norm's output stays usable: the convolution's own path takes it)
        _interior_of(buf, cache.shape, (0, 0, 0, *start[3:])).copy_(cache)
    frames = slice(0 if handed else front, front + x.shape[2])
    sharded_dim = None if ctx is None else (3 if ctx.axis == HEIGHT else 4)
    pads = {3: (h_top, h_bottom), 4: (w_left, w_right)}
    # the sharded axis first (its halo rows span the interior's other axes only), then the other
    if sharded_dim is not None:
        _halo_rows(ctx, buf, frames, start, x.shape, sharded_dim, *pads[sharded_dim], space_mode)
    for dim in (3, 4):
        if dim != sharded_dim:
            fill_edges(buf[:, :, frames], dim, *pads[dim], space_mode)
    if time is not None:  # the frames this call reads, around the interior
        if time[0] > front or time[1] > back:
            raise ValueError(f"{type(conv).__name__}: time padding {time} exceeds the buffer's ({front}, {back})")
        buf = buf[:, :, front - time[0] : front + x.shape[2] + time[1]]
        front, back = time
    if cache is not _LOOP:  # time: the front unless handed, and the back; the caller keeps the cache
        fill_edges(buf, 2, 0 if handed else front, back, mode)
        return buf
    # time: the front unless a later chunk's comes from the cache below, and the back
    fill_edges(buf, 2, front if frame_loop.first_chunk() else 0, back, mode)
    frame_loop.cached_front(conv, buf, front)
    return buf


def fill_edges(part: torch.Tensor, dim: int, before: int, after: int, mode: str) -> None:
    """Fill the first `before` and last `after` entries of `part` along `dim` (the padding around
    what lies between): replicate copies the edge entry, reflect mirrors the entries next to it,
    zeros zeroes them."""
    extent = part.shape[dim]
    for begin, size, edge in ((0, before, before), (extent - after, after, extent - after - 1)):
        if not size:
            continue
        target = part.narrow(dim, begin, size)
        if mode == "replicate":
            target.copy_(part.narrow(dim, edge, 1).expand_as(target))
        elif mode == "reflect":  # mirrored about the edge entry, which is not repeated
            start = before + 1 if begin == 0 else extent - 2 * after - 1
            target.copy_(part.narrow(dim, start, size).flip(dim))
        else:
            target.zero_()


def _halo_rows(ctx, buf, frames: slice, start, x_shape, dim: int, before: int, after: int, mode: str) -> None:
    """The sharded axis's padding of the buffer's `frames` at the interior's columns: the neighbours'
    rows (one exchange), and at the global edges what `mode` pads the whole map with."""
    other = 4 if dim == 3 else 3
    # those frames at the interior's columns (rows along `other`), all rows along `dim`
    part = buf[:, :, frames].narrow(other, start[other], x_shape[other])
    extent = x_shape[dim]
    prev, nxt = ctx.neighbour_rows(part.narrow(dim, before, extent), dim, before, after)
    for rows, at, received in ((before, 0, prev), (after, before + extent, nxt)):
        if rows and received is not None:
            part.narrow(dim, at, rows).copy_(received)
    # at the global edges (nothing received): what the mode pads the whole map with, from this rank's rows
    fill_edges(part, dim, before if prev is None else 0, after if nxt is None else 0, mode)


# -- the mixins -------------------------------------------------------------------------------------


class ProducingNorm:
    """Base of the norm mixins that write silu(norm(x)) into a linked convolution's buffer: `produce`
    runs the protocol where the request does and returns the produced view, else None."""

    def produce(self, x: torch.Tensor, write) -> torch.Tensor | None:
        """`write(x, view)` into `interior(conv, x)` where this norm is linked and the request runs
        the protocol, the SiLU module told of the view; the view, or None (then nothing was written)."""
        linked = self.__dict__.get(_FEEDS)
        if linked is None or not runs() or not _plain((self, *linked)):
            return None
        silu, conv = linked
        view = interior(conv, x, channels_last=getattr(conv, "produced_channels_last", True))
        if view is None:
            return None
        write(x, view)
        silu.__dict__[_PENDING] = _record(view)
        return view


class RMSNormSiLUIntoConv(ProducingNorm):
    """Mixin for an RMS norm over channels (`gamma`, `bias`, `scale` as diffusers' RMS norms keep
    them) that a family declares followed by SiLU and a padding convolution: where the request runs
    the protocol, silu(norm(x)) written into that convolution's buffer (`interior`); elsewhere the
    norm's own forward. `pre_bias` (one value per channel): the bias of the convolution that made x,
    which left it out (fast/residual_blocks.py), added to x first and rounded as its bias pass would
    have (by the kernel as it reads x, else by an add)."""

    def forward(self, x, pre_bias=None):
        def write(x, view):
            rms_norm(x, self.gamma, self.bias, self.scale, silu=True, pre_bias=pre_bias, out=view)

        view = self.produce(x, write)
        if view is not None:
            return view
        return super().forward(_biased(x, pre_bias))


class ChannelsLastRMSNormSiLUIntoConv(ProducingNorm):
    """Mixin for diffusers' `RMSNorm` without weights, applied to a channels-last view (B, T, H, W, C)
    of the feature map and permuted back by the caller (LTX-Video's `norm(x.movedim(1, -1)).movedim(-1, 1)`),
    declared followed by SiLU and a padding convolution: where the request runs the protocol,
    silu(norm(x)) written into that convolution's buffer, returned as the view the caller permutes
    back into the interior (kernels/norm.py `mean_rms_norm`); elsewhere the next forward in line."""

    def forward(self, x, *args, **kwargs):
        if args or kwargs or x.dim() != 5 or self.weight is not None:
            return super().forward(x, *args, **kwargs)
        view = self.produce(x.movedim(-1, 1), lambda x, view: mean_rms_norm(x, self.eps, silu=True, out=view))
        return super().forward(x) if view is None else view.movedim(1, -1)


class PerChannelRMSNormSiLUIntoConv(ProducingNorm):
    """Mixin for LTX-2's `PerChannelRMSNorm` over dim 1 declared followed by SiLU and a padding
    convolution: where the request runs the protocol, silu(norm(x)) written into that convolution's
    buffer (kernels/norm.py `per_channel_rms_norm`, each step rounded as diffusers rounds it);
    elsewhere the next forward in line."""

    def forward(self, x, *args, **kwargs):
        if args or kwargs or x.dim() != 5 or self.channel_dim != 1:
            return super().forward(x, *args, **kwargs)
        view = self.produce(x, lambda x, view: per_channel_rms_norm(x, self.eps, silu=True, out=view))
        return super().forward(x) if view is None else view


def _biased(x: torch.Tensor, pre_bias: torch.Tensor | None) -> torch.Tensor:
    """x plus `pre_bias` (one value per channel) as the bias pass of the convolution that made x, which
    left it out, would have added it; x where None."""
    return x if pre_bias is None else x + pre_bias.reshape(1, -1, *([1] * (x.dim() - 2)))


class GroupNormSiLUIntoConv(ProducingNorm):
    """Mixin for an nn.GroupNorm declared followed by SiLU and a padding convolution: where the request
    runs the protocol, silu(norm(x)) straight into that convolution's buffer: by kernels/group_norm.py
    (two reads of x, one write; sharded, one all-reduce makes the statistics the whole map's) where
    they take x, else the norm's own output (the next forward in line: a sharded request's takes the
    whole map's statistics) through SiLU in one pass (`silu.out`). Elsewhere, unsharded where the
    request allows PyTorch's arithmetic by vaeshard's kernels (tier.same_kernels), silu(norm(x)) in one
    pass with PyTorch's bits (kernels/group_norm_same.py), the SiLU module told to pass it on; else the
    norm's own forward. `pre_bias` (one value per channel): the bias of the convolution that made x,
    which left it out (fast/residual_blocks.py), added to x first and rounded as its bias pass would
    have (by the kernels as they read x, else by an add)."""

    def forward(self, x, pre_bias=None):
        norm = super().forward

        def write(x, view):
            if group_norm.takes(x, self.num_groups):  # the kernels (sharded: one all-reduce of statistics)
                gn_args = (self.num_groups, self.weight, self.bias, self.eps)
                group_norm.group_norm(x, *gn_args, silu=True, out=view, reduce=whole_map_sum(), pre_bias=pre_bias)
            else:
                torch.ops.aten.silu.out(norm(_biased(x, pre_bias)), out=view)

        view = self.produce(x, write)
        if view is None:
            view = self._with_silu_same(x, pre_bias)
        return norm(_biased(x, pre_bias)) if view is None else view

    def _with_silu_same(self, x: torch.Tensor, pre_bias=None) -> torch.Tensor | None:
        """silu(norm(x)) with PyTorch's bits where the request allows it (`runs_same`), the SiLU module
        told to pass it on; in the exact tier, written into the interior of a channels-first padded
        input of the convolution (`interior`), whose own path then pads only the border and runs
        PyTorch's convolution as diffusers calls it, on the input diffusers' padding gives it. None
        where those kernels do not run (nothing written). `pre_bias`: as `forward`'s."""
        linked = self.__dict__.get(_FEEDS)
        variant = "silu" if pre_bias is None else "biased"
        if linked is None or not _plain((self, *linked)) or not runs_same(self, x, variant):
            return None
        silu, conv = linked
        view = None if tier.enabled() else interior(conv, x, channels_last=False)
        y = same_group_norm(self, x, silu=True, out=view, pre_bias=pre_bias)
        silu.__dict__[_PENDING] = _record(y)
        return y


class GlobalGroupNormIntoConv(GroupNormSiLUIntoConv, GlobalGroupNorm):
    """An nn.GroupNorm into the next convolution's buffer where declared and the request runs it;
    sharded, with the whole map's statistics either way (layers/norms.py)."""


class FrameGroupNormSiLUIntoConv(ProducingNorm):
    """Mixin for a per-frame GroupNorm (Mochi's `MochiChunkedGroupNorm3D`: its `norm_layer` on each frame
    as a sample, `chunk_size` frames at a time) declared followed by SiLU and a padding convolution:
    where the request runs the protocol, each chunk's norm (`norm_layer`, so a sharded request's
    statistics are the whole frame's; every frame at once by kernels/group_norm.py where they take it) goes
    through SiLU straight into that convolution's buffer, with no copy of the map into frame-major
    order and none back; elsewhere the norm's own forward. A
    GroupNorm normalises each sample alone, so the chunks' values do not depend on how frames are
    grouped into chunks. `pre_bias` (one value per channel): the bias of the convolution that made x,
    which left it out (fast/residual_blocks.py), added to x first and rounded as its bias pass would
    have (by the kernels as they read x, else by an add)."""

    def forward(self, x, pre_bias=None):
        view = self.produce(x, lambda x, view: self._write(x, view, pre_bias)) if x.dim() == 5 else None
        if view is not None:
            return view
        return super().forward(_biased(x, pre_bias))

    def _write(self, x: torch.Tensor, view: torch.Tensor, pre_bias=None) -> None:
        step = max(1, int(self.chunk_size))
        gn = self.norm_layer
        for n in range(x.shape[0]):
            frames, out = x[n].transpose(0, 1), view[n].transpose(0, 1)  # (T, C, H, W) views
            if group_norm.takes(frames, gn.num_groups):  # the kernels: every frame at once
                gn_args = (gn.num_groups, gn.weight, gn.bias, gn.eps)
                reduce = whole_map_sum()
                group_norm.group_norm(frames, *gn_args, silu=True, out=out, reduce=reduce, pre_bias=pre_bias)
                continue
            for start in range(0, frames.shape[0], step):
                chunk = frames[start : start + step]
                chunk = _biased(chunk, pre_bias)
                torch.ops.aten.silu.out(self.norm_layer(chunk), out=out[start : start + step])


class SpatialNormSiLUIntoConv(ProducingNorm):
    """Mixin for CogVideoX's `CogVideoXSpatialNorm3D` (`forward(f, zq, conv_cache)` -> `(norm(f) *
    conv_y(zq') + conv_b(zq'), caches)`, zq' the latent zq interpolated (nearest) to f's frames and
    size) declared followed by SiLU and a padding convolution: where the request runs the protocol,
    silu of that written straight into the convolution's buffer, with the caches diffusers returns;
    elsewhere, and where f's rows and columns are not a power-of-two multiple of zq's, the norm's own
    forward.

    The two 1x1x1 convolutions act per pixel, and nearest interpolation by a power of two repeats each
    latent pixel over a block of f's, so they run on zq interpolated in time only (`conditioning`, a
    mirror of diffusers' interpolation, guarded by families/cogvideox.py's mirror) and their outputs
    are broadcast over those blocks: no interpolated latent and no two full-size maps.
    kernels/group_norm.py normalises, conditions and applies SiLU in two reads of f and one write into
    the buffer (sharded, with the whole map's statistics); where they do not take f, the product and
    the sum are made in place on the norm's output, then `silu.out` writes the buffer; each step
    rounded as diffusers rounds it. `pre_bias` (one value per channel): the bias of the convolution
    that made f, which left it out (fast/residual_blocks.py), added to f first and rounded as its bias
    pass would have (by the kernels as they read f, else by an add)."""

    def forward(self, f, zq, conv_cache=None, pre_bias=None):
        blocks = _blocks(f.shape[3:], zq.shape[3:]) if f.dim() == 5 and zq.dim() == 5 else None
        caches: dict = {}

        def write(x, view):
            scale, shift = self.conditioning(f, zq, conv_cache or {}, caches)
            gn = self.norm_layer
            if group_norm.takes(f, gn.num_groups) and scale.stride() == shift.stride():
                # the norm, the conditioning and SiLU in the kernels' two reads of f
                gn_args = (gn.num_groups, gn.weight, gn.bias, gn.eps)
                cond = (scale, shift)
                group_norm.group_norm(f, *gn_args, True, view, cond, reduce=whole_map_sum(), pre_bias=pre_bias)
                return
            norm = gn(_biased(f, pre_bias))
            (h, bh), (w, bw) = blocks
            # f as blocks of the latent's pixels: (B, C, T, h, bh, w, bw), the conditioning broadcast
            norm.view(*norm.shape[:3], h, bh, w, bw).mul_(scale[:, :, :, :, None, :, None]).add_(
                shift[:, :, :, :, None, :, None]
            )
            torch.ops.aten.silu.out(norm, out=view)

        view = None if blocks is None else self.produce(f, write)
        if view is None:
            same = self._with_silu_same(f, zq, conv_cache, pre_bias)
            if same is not None:
                return same
        return super().forward(_biased(f, pre_bias), zq, conv_cache) if view is None else (view, caches)

    def _with_silu_same(self, f, zq, conv_cache, pre_bias=None):
        """Where the request allows PyTorch's arithmetic by vaeshard's kernels (`runs_same`) and the
        norm is linked: diffusers' forward with its product and sum and the SiLU after it in the norm's
        apply pass (kernels/group_norm_same.py, each step rounded as PyTorch rounds it), the SiLU module
        told to pass it on: `(output, caches)`, written in the exact tier into the new frames of the
        convolution's channels-first input (`interior`, as `GroupNormSiLUIntoConv._with_silu_same`);
        else None (nothing computed). The conditioning runs at the latent's rows and columns where
        that gives diffusers' values (`_same_conditioning`), else at f's as diffusers runs it."""
        linked = self.__dict__.get(_FEEDS)
        gn = self.norm_layer
        if linked is None or f.dim() != 5 or not _plain((self, *linked)) or not runs_same(gn, f):
            return None
        caches: dict = {}
        scaled = runs_same(gn, f, "scaled" if pre_bias is None else "scaled-biased")
        scale, shift = self._same_conditioning(f, zq, conv_cache or {}, caches, scaled)
        alike = all(t.dtype == f.dtype and t.is_contiguous() for t in (scale, shift))
        if not alike or not scaled:  # (the SiLU module applies its own)
            return same_group_norm(gn, _biased(f, pre_bias)) * scale + shift, caches
        # in the exact tier into the new frames of the convolution's channels-first input (`interior`)
        view = None if tier.enabled() else interior(linked[1], f, channels_last=False)
        y = same_group_norm(gn, f, silu=True, out=view, scale=scale, shift=shift, pre_bias=pre_bias)
        linked[0].__dict__[_PENDING] = _record(y)
        return y, caches

    def _same_conditioning(self, f, zq, conv_cache: dict, caches: dict, blocked: bool):
        """diffusers' (conv_y, conv_b) values: where `blocked` (the kernels take the maps at the
        latent's rows and columns) and f's rows and columns are a power-of-two multiple of zq's, at
        zq's rows and columns, each value standing for a block of f's pixels, once
        `_LATENT_CONDITIONING` holds that this gives, broadcast, the maps diffusers makes at f's size:
        the two 1x1x1 convolutions act on each pixel alone, but whether cuDNN sums a pixel's channels
        alike at both sizes is its choice, so the first request of each shape on a device computes both
        and compares them bit for bit (and uses diffusers' own). Else at f's size, as diffusers."""
        blocks = _blocks(f.shape[3:], zq.shape[3:]) if blocked else None
        if blocks is None or blocks == ((zq.shape[3], 1), (zq.shape[4], 1)):
            return self.conditioning(f, zq, conv_cache, caches, size=f.shape[3:])
        key = (f.device, f.dtype, tuple(f.shape), tuple(zq.shape))
        verdict = _LATENT_CONDITIONING.get(key)
        if verdict is False or verdict is None and f.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.conditioning(f, zq, conv_cache, caches, size=f.shape[3:])
        if verdict:
            return self.conditioning(f, zq, conv_cache, caches)
        small = self.conditioning(f, zq, conv_cache, {})
        full = self.conditioning(f, zq, conv_cache, caches, size=f.shape[3:])
        (_, bh), (_, bw) = blocks
        _LATENT_CONDITIONING[key] = all(
            torch.equal(s.repeat_interleave(bh, 3).repeat_interleave(bw, 4), t) for s, t in zip(small, full)
        )
        return full

    def conditioning(self, f, zq, conv_cache: dict, caches: dict, size=None):
        """(conv_y, conv_b) of zq interpolated to f's frames as diffusers interpolates them (the first
        frame apart where f has an odd count above one), at zq's own rows and columns, or at `size`
        (f's, as diffusers interpolates); their caches put in `caches`."""
        size = zq.shape[3:] if size is None else tuple(size)
        if f.shape[2] > 1 and f.shape[2] % 2 == 1:
            z_first = F.interpolate(zq[:, :, :1], size=(1, *size))
            z_rest = F.interpolate(zq[:, :, 1:], size=(f.shape[2] - 1, *size))
            zq = torch.cat([z_first, z_rest], dim=2)
        else:
            zq = F.interpolate(zq, size=(f.shape[2], *size))
        scale, caches["conv_y"] = self.conv_y(zq, conv_cache=conv_cache.get("conv_y"))
        shift, caches["conv_b"] = self.conv_b(zq, conv_cache=conv_cache.get("conv_b"))
        return scale, shift


# (device, dtype, f's shape, zq's shape) -> whether CogVideoX's conditioning at the latent's rows and
# columns, broadcast, equals diffusers' at f's (SpatialNormSiLUIntoConv._same_conditioning)
_LATENT_CONDITIONING: dict = {}


def _blocks(f_size, z_size):
    """((latent rows, rows per latent row), (columns, columns per column)) where f's rows and columns
    are a power-of-two multiple of the latent's (nearest interpolation then repeats each latent pixel
    over a block), else None."""
    out = []
    for n, m in zip(f_size, z_size):
        if m < 1 or n % m or (n // m) & (n // m - 1):
            return None
        out.append((m, n // m))
    return tuple(out)


class ProducedConv2d(HaloConv2d):
    """Mixin for a stride-1 zero-padded nn.Conv2d (layers/convs.py `HaloConv2d`) that a declared norm
    writes into: its input buffer (`input_buffer`: channels-last, room for a sharded request's halo
    rows; cuDNN pads the rest) is what the norm fills, and given that very view the convolution runs
    on the buffer (`forward_buffer`); anything else takes HaloConv2d's path."""

    def produced_input(self, x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 4 or not tier.enabled() or any(s != 1 for s in self.stride):
            return None
        return self.input_buffer(x)[1]

    def forward(self, x):
        if told(self, x):
            return self.forward_buffer(x if x._base is None else x._base)
        return super().forward(x)


class ProducedFrameConv2d(HaloFrameConv2d):
    """Mixin for a single-frame "causal Conv3d" (layers/halo.py `HaloFrameConv2d`: an nn.Conv2d over
    x.squeeze(2), zero-padded by F.pad) that a declared norm writes into. Its input buffer is the
    channels-first padded frame F.pad makes (`input_as_diffusers`, `produced_channels_last` False),
    so given that very view the convolution runs unpadded on the filled buffer as diffusers' forward
    convolves its padded copy (the same input, layout and call: the same bits); anything else takes
    HaloFrameConv2d's path."""

    input_as_diffusers = True
    produced_channels_last = False

    def producer_padding(self):
        left, right, top, bottom = self._padding
        return (left, right, top, bottom, 0, 0), "zeros", "zeros"

    def forward(self, x, cache_x=None):
        buf = filled(self, x, cache=None) if cache_x is None else None
        if buf is None:
            return super().forward(x, cache_x)
        out = F.conv2d(buf.squeeze(2), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return out.unsqueeze(2)


class SiLUAfterProducer:
    """Mixin for diffusers' SiLU module after a producing norm: the tensor that norm wrote (SiLU
    applied already) passes on as it is; any other input gets SiLU as diffusers applies it."""

    def forward(self, x):
        if self.__dict__.get(_AFTER) and _told(self, x):
            return x
        return super().forward(x)
