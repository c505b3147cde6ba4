"""The fast tier's halo-aware convolution layers (mixins swapped onto diffusers' own modules,
runtime/swap.py): Wan's causal Conv3d and the 2-D convolutions that take their input in one
channels-last buffer; sharded in the exact tier they run halo.py's operations.

Every forward first asks the current shard context (runtime/spatial.py): outside a sharded request
there is none and, outside the fast tier, the exact original computation runs, so direct and tile
requests are unaffected by the installation.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import phases as upsample
from ..kernels.conv3d import dense_channels_last
from ..runtime.spatial import HEIGHT, WIDTH, current
from . import tier as fast_tier
from .buffers import buffer_shape, copy_frames
from .halo import HaloPaddedConv, extend_padding
from .norms import bias_moved


class HaloCausalConv3d:
    """Mixin for Wan-style causal Conv3d (explicit `_padding` applied by F.pad, optional time cache).

    Sharded: the time cache is prepended as in the original, then the sharded axis is extended by
    exactly the rows its zero padding would have covered, taken from the neighbouring ranks (zeros
    at the global edges), and the convolution runs without padding on that axis.
    Fast tier (layers/tier.py): channels-last input, and cuDNN applies the remaining spatial zero
    padding instead of a padded copy of the input.
    """

    def forward(self, x, cache_x=None):
        ctx = current()
        fast = fast_tier.enabled()
        if ctx is None and not fast:
            return super().forward(x, cache_x)
        if fast:  # one buffer: causal zero frames, cached frames, this chunk, halo rows
            return self.convolve(x, cache_x, fast_tier.max_layer_frames())
        cached = cache_x.to(x.device) if cache_x is not None and self._padding[4] > 0 else None
        # exact tier, sharded: diffusers' steps, with halo rows in place of the sharded axis's padding
        padding = list(self._padding)  # (w_left, w_right, h_top, h_bottom, t_front, t_back)
        if cached is not None:
            x = torch.cat([cached, x], dim=2)
            padding[4] -= cached.shape[2]
        x, padding = extend_padding(ctx, x, padding)
        return nn.Conv3d.forward(self, F.pad(x, padding))

    def convolve(self, x, cache_x=None, limit: int | None = None):
        """Fast tier: `forward(x, cache_x)` with at most `limit` frames at a time (None: all), the
        bound of the layer that calls it (tier.layer_frames) or the request's."""
        cached = cache_x.to(x.device) if cache_x is not None and self._padding[4] > 0 else None
        if limit is not None and x.shape[2] > limit and self._causal_in_time():
            return self._forward_in_parts(x, cached, limit)
        return self._convolve(current(), x, cached)

    # Fast tier: the input is built in one channels-last buffer. A caller that produces the input
    # itself (a residual block whose fused norm writes into the buffer) uses the two steps directly,
    # so its activations are never copied.
    #
    # `halo_rows` (sharded requests; both steps get the same): the (before, after) rows received
    # from the neighbours on the sharded axis, by default this convolution's own padding there. The
    # sharded axis is never padded by cuDNN, so the output has as many rows as the input's shard
    # plus the received rows minus the padding: with one more row received on each side than the
    # padding, one more row each side comes out (rows a neighbour holds, computed here too). (0, 0):
    # the caller wrote those rows itself (such a wider output), nothing is received, and at the
    # global edges the rows become the zero padding.
    #
    # Zero columns (fast tier, CUDA, the route's `zero_columns`): where the Triton kernel's row tiles do not
    # fit the rows, an unsharded width's padding is held in the buffer as one zero column a side,
    # which the kernel's wrapping tiles take; the buffer is then wider than the new frames, and the
    # steps after `input_buffer` are given the new frames' `width` to know it.

    def input_buffer(self, like: torch.Tensor, cache_x: torch.Tensor | None, halo_rows=None, shape=None):
        """(buffer, view, ready, front): this convolution's whole input, channels-last, with `cache_x`
        and the causal zero frames in front and room for the halo rows of a sharded request; the caller
        writes the new frames (shaped like `like`, or `shape` with `like`'s dtype and device) into the
        view, then calls `forward_buffer(buffer, ready=ready, front=front)`. Where box_conv's kernel
        reads the time padding from the cache where it lies (`front`, a conv3d.Front; else None)
        the buffer holds only the new frames (and their halo rows).

        Sharded, `cache_x` may be a shard's frames (diffusers' own caches) or the buffer's whole
        frames, halo rows included (a cache taken from an earlier buffer after its exchange, as the
        fast residual blocks keep theirs): the second is copied whole, one contiguous copy, and its
        frames need no exchange. `ready` counts the leading frames that hold their halo rows already
        (such a cache, or only causal zero frames, which are zero across the buffer). With zero
        columns (above) a cache taken from an earlier buffer holds them too."""
        ctx = current()
        tpad = self._padding[4]
        new = tuple(like.shape if shape is None else shape)
        rows = (
            (None, 0, 0) if ctx is None else (ctx.dim(new), *(self._halo_rows(ctx) if halo_rows is None else halo_rows))
        )
        # the cache has the buffer's rows and columns (taken from an earlier buffer: halo rows; columns
        # are asked of the route, which reads the cache where it lies only for a buffer without them)
        whole = cache_x is None or tuple(cache_x.shape[3:]) == buffer_shape(new, rows, 0, 0)[3:]
        way = self._route(ctx, like, new, cache_x if whole else None, causal=whole)
        columns = way.zero_columns
        whole = cache_x is None or tuple(cache_x.shape[3:]) == buffer_shape(new, rows, columns, 0)[3:]
        reads = way.front
        buf, core = self._allocate(like, new, rows, columns, 0 if reads is not None else tpad)
        if reads is not None:
            return buf, core, 0, reads
        return buf, core[:, :, tpad:], self._fill_front(buf, core, cache_x, whole), None

    def _route(self, ctx, like, new, cache_x, causal: bool, columns: bool = True):
        """The route (kernels/routing.py) of a buffer for `new` frames like `like` behind `cache_x`:
        zero columns (where `columns`) where the width is unsharded and padded by one column a side;
        the time padding read from `cache_x` where it lies where `causal` (the cache holds the
        buffer's rows and columns) and this convolution is causal in time, for the cache's samples
        and channels."""
        columns = columns and (ctx is None or ctx.axis != WIDTH) and tuple(self._padding[:2]) == (1, 1)
        causal = causal and self._causal_in_time() and (cache_x is None or tuple(cache_x.shape[:2]) == new[:2])
        return fast_tier.conv_route(
            self.weight,
            self.stride,
            (0, 0, int(columns)),
            self.dilation,
            self.groups,
            like=like,
            width=new[-1],
            causal=causal,
            cache=cache_x,
        )

    def _allocate(self, like, new, rows, columns, tpad):
        """(buffer, core): an uninitialised channels-last buffer for `new` frames behind `tpad` ones,
        with the halo rows and zero columns (zeroed) of `rows` and `columns`; the core is the buffer
        without them."""
        dim, before, _ = rows
        buf = torch.empty(
            buffer_shape(new, rows, columns, tpad),
            dtype=like.dtype,
            device=like.device,
            memory_format=fast_tier.channels_last_format(5),
        )
        core = buf if dim is None else buf.narrow(dim, before, new[dim])
        if columns:
            buf[..., :columns].zero_()
            buf[..., -columns:].zero_()
            core = core.narrow(-1, columns, new[-1])
        return buf, core

    def _fill_front(self, buf, core, cache_x, whole: bool) -> int:
        """The causal frames in front of a buffer's new frames: `cache_x`'s (whole: with the buffer's
        rows and columns), zeros before them; returns `ready` (see input_buffer)."""
        tpad = self._padding[4]
        cached = 0 if cache_x is None else cache_x.shape[2]
        region = buf if whole else core  # (a shard's cache: between the halo rows)
        if tpad > cached:
            region[:, :, : tpad - cached].zero_()
        if cached:
            region[:, :, tpad - cached : tpad].copy_(cache_x)
        return tpad if whole else 0

    def front(self, like: torch.Tensor, cache_x: torch.Tensor | None, shape=None):
        """The route's conv3d.Front for new frames like `like` (or of `shape`) behind `cache_x`
        (None: zero frames; else a cache of the frames' rows and columns, which the caller has
        checked), convolved where they lie, where the kernel reads this convolution's time padding
        from the cache, else None."""
        new = tuple(like.shape if shape is None else shape)
        return self._route(None, like, new, cache_x, causal=True, columns=False).front

    def forward_buffer(
        self,
        buf: torch.Tensor,
        with_bias: bool = True,
        halo_rows=None,
        ready: int = 0,
        add_to: torch.Tensor | None = None,
        norm=None,
        out: torch.Tensor | None = None,
        width: int | None = None,
        front=None,
    ) -> torch.Tensor:
        """The convolution of a buffer from `input_buffer` whose new frames (`width` columns; None:
        the buffer's, no zero columns) are written: halo rows exchanged for all but the first
        `ready` frames, then cuDNN applies the zero padding of the unsharded axis (no padded copy)
        unless the buffer holds it as zero columns; `front`: input_buffer's (the time padding read
        from the cache by box_conv's kernel).

        `with_bias=False`: the caller adds the bias itself (in a pass it makes anyway); a bias moved
        into the next norm (norms.move_bias_into_norm) is left out too. `add_to`: the result is added
        to that tensor in place, which is returned; `norm` (a conv3d.NormEpilogue) and `out`: that
        norm of the result written into `out`, which is returned (tier.conv_with_bias)."""
        ctx = current()
        if ctx is not None:
            before, after = self._halo_rows(ctx) if halo_rows is None else halo_rows
            if before or after:
                ctx.fill_halo(buf[:, :, ready:], ctx.dim(buf), before, after)
            else:
                ctx.zero_edges(buf, ctx.dim(buf), *self._halo_rows(ctx))
        bias = None if bias_moved(self) or not with_bias else self.bias
        return fast_tier.conv_with_bias(
            F.conv3d,
            buf,
            self.weight,
            bias,
            self.stride,
            self._buffer_padding(ctx, buf, width),
            self.dilation,
            self.groups,
            add_to=add_to,
            norm=norm,
            out=out,
            front=front,
        )

    def norms_in_epilogue(self, buf: torch.Tensor, width: int | None = None, front=None) -> bool:
        """Whether `forward_buffer(buf, norm=..., out=...)` computes the norm in the Triton kernel's
        epilogue when `out` is the new frames of another causal convolution's input buffer (a single
        sample's: with more, their frames do not follow each other there), else the norm kernel
        runs after the convolution (tier.conv_with_bias)."""
        bias = None if bias_moved(self) else self.bias
        return (
            buf.shape[0] == 1
            and fast_tier.conv_route(
                self.weight,
                self.stride,
                self._buffer_padding(current(), buf, width),
                self.dilation,
                self.groups,
                x=buf,
                bias=bias,
                front=front,
            ).norms_output
        )

    def output_shape(self, buf: torch.Tensor, width: int | None = None, front=None) -> tuple[int, ...]:
        """The shape `forward_buffer(buf, width=width, front=front)` gives (known before the buffer
        is written)."""
        pads = self._buffer_padding(current(), buf, width)
        dims = [
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, p, k, s, d in zip(buf.shape[2:], pads, self.kernel_size, self.stride, self.dilation)
        ]
        if front is not None:  # (the time padding in front, read from the cache)
            dims[0] += self._padding[4]
        return (buf.shape[0], self.out_channels, *dims)

    def _buffer_padding(self, ctx, buf: torch.Tensor | None = None, width: int | None = None) -> tuple[int, int, int]:
        """The (T, H, W) zero padding cuDNN applies to a buffer from `input_buffer` whose new frames
        have `width` columns: none in time (the buffer holds the causal frames), none on a sharded
        axis (halo rows), none in width where the buffer holds it (zero columns), the rest as
        diffusers'."""
        padding = list(self._padding)
        if ctx is not None:
            slot = self._slot(ctx)
            padding[slot] = padding[slot + 1] = 0
        if buf is not None and width is not None and buf.shape[-1] > width:  # halo or zero columns
            padding[0] = padding[1] = 0
        return (0, padding[2], padding[0])

    def _causal_in_time(self) -> bool:
        """Whether each output frame sees its own input frame and the `kernel - 1` before it (stride
        and dilation 1, causal padding of `kernel - 1`), so the input can be cut into parts whose
        cache is the frames before them. (The encoder's stride-2 time convolutions are not.)"""
        return self.stride[0] == 1 and self.dilation[0] == 1 and self._padding[4] == self.kernel_size[0] - 1

    def _forward_in_parts(self, x, cached, limit: int) -> torch.Tensor:
        """Fast tier, with a bound on the frames at once (`convolve`'s `limit`): the convolution of `x`
        on parts of at most `limit` frames, each part's cached frames being the ones before it, as a
        causal cache carries them from one decoder call to the next: the same values, with one part's
        input buffer alive at a time."""
        tpad = self._padding[4]
        outs = []
        for start in range(0, x.shape[2], limit):
            part = x[:, :, start : start + limit]
            outs.append(self._convolve(current(), part, cached))
            if tpad:  # the frames the next part's window reaches back to
                cached = part if cached is None or part.shape[2] >= tpad else torch.cat([cached, part], dim=2)
                cached = cached[:, :, -tpad:]
        return torch.cat(outs, dim=2)

    def _convolve(self, ctx, x: torch.Tensor, cached: torch.Tensor | None) -> torch.Tensor:
        """Fast tier: the convolution of `x` behind `cached` through an input buffer, or of `x` where
        it lies: without any padding (a 1x1x1 convolution: nothing to put around it, sharded or
        not), or unsharded where box_conv's kernel reads it and the time padding so (`front`)."""
        if not any(self._padding) and dense_channels_last(x):
            return self.forward_buffer(x, width=x.shape[-1])
        if ctx is None and dense_channels_last(x):
            front = self.front(x, cached)
            if front is not None:
                return self.forward_buffer(x, width=x.shape[-1], front=front)
        buf, new, ready, front = self.input_buffer(x, cached)
        copy_frames(new, x, 2)
        width = new.shape[-1]
        del new
        return self.forward_buffer(buf, ready=ready, width=width, front=front)

    @staticmethod
    def _slot(ctx) -> int:
        """Index in `_padding` of the sharded axis's leading pad (the trailing one follows it)."""
        return 2 if ctx.axis == HEIGHT else 0

    def _halo_rows(self, ctx) -> tuple[int, int]:
        slot = self._slot(ctx)
        return self._padding[slot], self._padding[slot + 1]


class HaloConv2d(HaloPaddedConv):
    """Mixin for a stride-1 zero-padded nn.Conv2d: halo rows replace the padding on the sharded axis
    (exact tier: `HaloPaddedConv`).

    Fast tier: channels-last input; sharded, the input is built in one buffer with room for the halo
    rows (`input_buffer` / `forward_buffer`, which a caller that produces the input itself, such as
    an upsampler writing into it, uses directly), and cuDNN applies the other axis's padding.
    """

    def forward(self, x):
        ctx = current()
        fast = fast_tier.enabled()
        if ctx is None and not fast:
            return super().forward(x)
        if fast and ctx is None:
            return fast_tier.conv_with_bias(
                F.conv2d,
                fast_tier.to_channels_last(x),
                self.weight,
                self.bias,
                self.stride,
                self.padding,
                self.dilation,
                self.groups,
            )
        if fast:
            buf, core = self.input_buffer(x)
            copy_frames(core, x, 0)
            return self.forward_buffer(buf)
        return self._sharded(ctx, x)  # exact tier: the halo rows in place of the sharded axis's padding

    def input_buffer(self, like: torch.Tensor, shape=None):
        """(buffer, view): this convolution's input (`shape`, default `like`'s; dtype and device of
        `like`), channels-last, with room for the halo rows of a sharded request. The caller writes
        the input into the view, then calls `forward_buffer(buffer)`."""
        ctx = current()
        shape = list(like.shape if shape is None else shape)
        dim, rows = None, 0
        if ctx is not None:
            dim, rows = ctx.dim(shape), self._halo_rows(ctx)
            shape[dim] += 2 * rows
        buf = torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=torch.channels_last)
        return buf, (buf if dim is None else buf.narrow(dim, rows, shape[dim] - 2 * rows))

    def forward_buffer(self, buf: torch.Tensor) -> torch.Tensor:
        """The convolution of a buffer from `input_buffer` whose input is written: halo rows
        exchanged, the other axis zero-padded by cuDNN."""
        ctx = current()
        pad_h, pad_w = self.padding
        if ctx is not None:
            rows = self._halo_rows(ctx)
            ctx.fill_halo(buf, ctx.dim(buf), rows, rows)
            pad_h, pad_w = (0, pad_w) if ctx.axis == HEIGHT else (pad_h, 0)
        return fast_tier.conv_with_bias(
            F.conv2d, buf, self.weight, self.bias, self.stride, (pad_h, pad_w), self.dilation, self.groups
        )

    def forward_by_phases(
        self, src: torch.Tensor, sub: int, limit: int | None = None, addend: upsample.Addend | None = None
    ) -> torch.Tensor | None:
        """Fast tier: this convolution of the nearest 2x upsampling of the frames `src` holds (a
        channels-last (F, sub * Cin, h, w) tensor whose frame f, or with `sub` = 2 whose channel
        halves of frame f, are frames f, or 2 f and 2 f + 1: an upsampling time convolution's
        output), computed from the source by its four phases (kernels/phases.py: one convolution of
        2x2 taps into 4 x Cout channels and one pass that interleaves them and adds the bias), so the
        upsampled frames are never made; a channels-last (F * sub, Cout, 2 h, 2 w) tensor. None where
        this is no 3x3 convolution with padding 1 (`phases.takes`). The source frames are copied only
        to take them out of channel halves, or sharded into a buffer with one halo row a side
        (received from the neighbours, zeros at the global edges), which replaces the padding on that
        axis. `limit` (the calling layer's bound, tier.layer_frames): the phases of at most that many
        output frames at a time (at least one source frame's); sharded, the source's halo rows are
        received once for all the parts and each part copies its own. `addend`
        (`phases.takes_addend`; its `first` is the output's first frame): added as the phases are
        interleaved."""
        if not upsample.takes(self):
            return None
        ctx = current()
        f, csrc, rows, cols = src.shape
        cin = csrc // sub
        phases = upsample.cached_phase_weight(self.weight)
        halo = (0, 0) if ctx is None else (1, 0) if ctx.axis == HEIGHT else (0, 1)
        out = torch.empty(
            (f * sub, self.out_channels, 2 * rows, 2 * cols),
            dtype=src.dtype,
            device=src.device,
            memory_format=torch.channels_last,
        )
        step = f if limit is None else max(1, limit // sub)
        # sharded in parts: the source's halo rows received once for all the parts
        edges = ctx.neighbour_rows(src, ctx.dim(src), 1, 1) if ctx is not None and step < f else None
        for a in range(0, f, step):
            part = src[a : a + step]
            n = part.shape[0]
            if ctx is not None or sub > 1:
                buf, core = self.input_buffer(part, (n * sub, cin, rows, cols))
                _place_frames(core, part, sub, cin)
                if ctx is not None and edges is None:
                    ctx.fill_halo(buf, ctx.dim(buf), 1, 1)
                elif ctx is not None:  # this part's rows of the received ones, zeros beyond a global edge
                    dim = ctx.dim(buf)
                    for received, at in zip(edges, (0, buf.shape[dim] - 1)):
                        target = buf.narrow(dim, at, 1)
                        if received is None:
                            target.zero_()
                        else:
                            _place_frames(target, received[a : a + n], sub, cin, one_copy=True)
                part = buf
            upsample.conv2d_by_phases(
                part,
                self.weight,
                self.bias,
                halo,
                phases,
                out=out[a * sub : (a + n) * sub],
                addend=None if addend is None else addend._replace(first=addend.first + a * sub),
            )
            del part
        return out

    def _halo_rows(self, ctx) -> int:
        return self.padding[0] if ctx.axis == HEIGHT else self.padding[1]


def _place_frames(dst: torch.Tensor, src: torch.Tensor, sub: int, cin: int, one_copy: bool = False) -> None:
    """`src`'s frames (HaloConv2d.forward_by_phases' source layout: with `sub` = 2 each frame's two
    channel halves of `cin` are two frames) copied into `dst` (frames of `cin` channels);
    `one_copy`: one copy kernel rather than `copy_frames`' one per frame (a few rows)."""
    if sub > 1:
        dst.unflatten(0, (src.shape[0], sub)).copy_(src.unflatten(1, (sub, cin)))
    elif one_copy:
        dst.copy_(src)
    else:
        copy_frames(dst, src, 0)
