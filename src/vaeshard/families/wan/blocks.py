"""Wan's fast-tier blocks: diffusers' forwards of the Wan-architecture residual block, decoder and
encoder, upsampler and up block, mirrored step for step with less data movement (the buffer
protocol of layers/buffers.py). Each names the diffusers function it mirrors, as do the families'
`mirrors` (Family.mirrors); tests/test_families/test_drift.py checks those functions' sources against the
versions these were written from.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ...kernels import conv3d as conv_kernel
from ...kernels import phases as upsample
from ...kernels.norm import add_bias_and_residual_, add_duplicated_, fused_bias_add_available, rms_norm
from ...layers import tier as fast
from ...layers.buffers import (
    CausalInput,
    causal_conv_step,
    causal_input,
    norm_into_causal_conv,
    same_layout,
    store_cache,
    upsample_into_buffer,
)
from ...layers.norms import bias_moved
from ...runtime import spatial as shard
from ...runtime.spatial import largest_frame_pixels


class FastResidualBlock:
    """Mixin for a Wan residual block: diffusers' computation, step for step, with less data movement.

    Fast tier, inference only: each fused norm (+ SiLU, + conv1's bias before norm2, see
    norms.move_bias_into_norm) writes straight into the next causal convolution's input buffer,
    behind the cached frames and between the halo rows (`HaloCausalConv3d.input_buffer`), so the
    activations are never copied to build that input; where the Triton kernel runs conv1 (CUDA, one
    sample, no bound on the block's frames), norm2 is computed in its epilogue into conv2's buffer, made
    before conv1 runs, so conv1's output is never stored; on CUDA, conv2's bias and the residual are
    added as the Triton convolution stores its output (`tier.conv_with_bias`'s `add_to`) or, after
    cuDNN, in one pass (kernels/norm.py `add_bias_and_residual_`), rounded as PyTorch's separate bias
    pass and residual add round.
    Where the layouts agree (on CUDA: channels-last both) the sum is written into the block's input
    (identity shortcut) or the shortcut's output, so the input, which diffusers' callers keep
    referenced until the block returns, is not a third full-size tensor beside the convolution's
    input and output; callers must not read the input afterwards (diffusers' never do; a forward
    hook on the block itself, which would see the input, turns this off).
    Sharded, conv1 receives two halo rows a side instead of one and computes one output row more a
    side: the rows conv2 would receive from its neighbours, so the block makes one halo exchange
    instead of two (Wan 2.1: 19 instead of 35.6 per latent frame). Where a shard holds fewer than two
    rows at the block's level, it exchanges twice.
    The values are exactly those of the fast tier without this mixin (tests compare the bits on CPU,
    one rank and sharded with two exchanges per block; on CUDA the one-pass add rounds as the two
    passes it replaces), except that a convolution over two more rows may round otherwise (fp32 on
    CPU: 1.8e-6 at most in the tests, within the tolerance).
    With a bound on a layer's frames (tier.layer_frames: `max_layer_frames`, or the default parts)
    a block given more frames runs on parts of at most that many, each part reusing the block's
    cache slots, which the part before it has just filled with its last frames: what a decoder call
    of that many frames would compute, with one part's activations alive at a time; with an
    identity shortcut each part's sum goes into its frames of the input, otherwise into one output
    for the block. Without `max_layer_frames`, a block whose convolutions read their caches where
    they lie (box_conv) takes parts of two frames where its frames are large (FastPlan.layer_frames,
    tuning.PART_FRAMES): each part's buffer, two new frames, becomes the convolution's next cache
    instead of being copied into the old one (`store_cache`). Sharded, the parts (by default or by
    the setting) share one halo exchange: the neighbours' raw rows of the block's input that conv1
    needs, from which each part computes its own halo rows (`_edges`); a block that makes two
    exchanges (a shard of fewer than two rows) takes no default parts.
    The feature-cache bookkeeping is diffusers' own (`WanResidualBlock.forward`, unchanged from
    diffusers 0.36 to 0.42), except that a cache entry of its steady shape is overwritten in place
    instead of replaced (`store_cache`; the same values) and, sharded, is taken after the halo
    exchange with the frames' halo rows (`CausalInput`), so the next call neither exchanges those
    frames again nor copies them strided. Otherwise (training, autograd, exact
    tier, or a forward hook on one of the block's layers, which this path would not call)
    diffusers' forward runs.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0]):  # noqa: B006 - diffusers' signature
        if not _fast_path(self):
            return super().forward(x, feat_cache, feat_idx)

        def suits() -> bool:  # sharded, the parts share the block's one halo exchange (`_edges`)
            return (shard.current() is None or _one_exchange(self, x)) and all(
                conv.front(x, None) is not None for conv in (self.conv1, self.conv2)
            )

        return self._forward_in_parts(x, feat_cache, feat_idx, fast.layer_frames(largest_frame_pixels(x), suits))

    def _forward_in_parts(self, x, feat_cache, feat_idx, limit: int | None):
        if limit is None or feat_cache is None or x.shape[2] <= limit:
            return self._fast_forward(x, feat_cache, feat_idx, limit)
        # in parts (tier.layer_frames): the block on parts of the frames; each part reuses the
        # block's cache slots, which the part before it has just filled with its own last frames
        edges = _edges(self, x)
        start, out = feat_idx[0], None
        for a in range(0, x.shape[2], limit):
            part = x[:, :, a : a + limit]
            feat_idx[0] = start
            part_edges = None if edges is None else tuple(e if e is None else e[:, :, a : a + limit] for e in edges)
            y = self._fast_forward(part, feat_cache, feat_idx, limit, part_edges)
            if out is None and _same_storage(y, part):
                continue  # the sum went into the input's frames (identity shortcut): nothing to place
            if out is None:  # an output of its own: place this part and any before it there
                layout = fast.channels_last_format(5)
                layout = layout if y.is_contiguous(memory_format=layout) else torch.contiguous_format
                out = torch.empty(
                    (*y.shape[:2], x.shape[2], *y.shape[3:]), dtype=y.dtype, device=y.device, memory_format=layout
                )
                if a:  # earlier parts wrote into the input's frames
                    out[:, :, :a].copy_(x[:, :, :a])
            out[:, :, a : a + y.shape[2]].copy_(y)
            del y
        return x if out is None else out

    def _fast_forward(self, x, feat_cache, feat_idx, limit: int | None, edges=None):
        """The block on `x` (all its frames, or a part of at most `limit`); `edges`: a part's rows of
        `_edges`."""
        h = (
            self.conv_shortcut.convolve(x, None, limit)
            if hasattr(self.conv_shortcut, "convolve")
            else self.conv_shortcut(x)
        )
        # sharded: conv1 receives two halo rows a side and computes one row more a side, the rows
        # conv2 needs from its neighbours, so a block makes one halo exchange instead of two
        one_exchange = edges is not None or _one_exchange(self, x)
        rows1, rows2 = ((CONV1_ROWS, CONV1_ROWS), (0, 0)) if one_exchange else (None, None)
        # each activation is dropped as soon as the next buffer holds what is needed of it, so a
        # block holds at most its input (the residual), one convolution input and one output (or,
        # where conv1 computes norm2 as it stores, the two convolutions' inputs)
        if edges is None:
            pending = norm_into_causal_conv(self.norm1, None, self.conv1, x, feat_cache, feat_idx, rows1)
        else:
            pending = _norm_with_edges_into_causal_conv(self.norm1, self.conv1, x, edges, feat_cache, feat_idx)
        fuse = fused_bias_add_available(x)  # conv2's bias and the residual in one pass (CUDA)
        del x
        pre_bias = self.conv1.bias if bias_moved(self.conv1) else None
        # (dropout sits between norm2 and conv2 in diffusers: the identity outside training)
        if fuse and limit is None and pending.norms_in_epilogue():
            # conv1 writes silu(norm2(its output + its bias)) straight into conv2's input buffer, in
            # the Triton kernel's epilogue: its output is never stored (conv2's buffer is made
            # first, in place of that output, so both inputs are alive during conv1: two cached
            # frames more than conv1's input and output. A block in parts (max_layer_frames, the
            # setting for a low peak, or the default parts) keeps the order below, one convolution
            # input at a time.)
            second = causal_input(self.conv2, pending.buf, feat_cache, feat_idx, rows2, pending.output_shape())
            n2 = self.norm2
            pending.convolve(
                norm=conv_kernel.NormEpilogue(n2.gamma, n2.bias, n2.scale, pre_bias=pre_bias), out=second.new
            )
            pending = second
            del second
        else:
            y = pending.convolve()
            pending = norm_into_causal_conv(self.norm2, pre_bias, self.conv2, y, feat_cache, feat_idx, rows2)
            del y
        # the sum goes into h where it has the convolution's output layout (on CUDA, channels-last
        # both): the block's output takes the storage of its input (or of the shortcut's output),
        # which diffusers' callers hold until the block returns and never read again (they reassign
        # it; Wan 2.2's up and down blocks clone it first), so no third full-size tensor stays
        # alive. (Another layout would change the layout, and on CPU the reduction order, of the
        # layers after it.) A hook on the block sees its input: then a new output.
        if fuse and not self._forward_hooks and h.is_contiguous(memory_format=fast.channels_last_format(5)):
            # into h by the convolution itself where its kernel can (conv3d's epilogue), else
            # by the one-pass bias + residual add after it
            return pending.convolve(add_to=h)
        y = pending.convolve(with_bias=not fuse)
        del pending
        into = same_layout(h, y) and not self._forward_hooks
        return add_bias_and_residual_(y, self.conv2.bias if fuse else None, h, into_residual=into)


class FastCoderHead:
    """Mixin for a Wan-style decoder or encoder (diffusers' `WanDecoder3d`, `WanEncoder3d` and Qwen-Image's):
    its forward, step for step, with the head (`norm_out`, the SiLU, `conv_out`) run as a residual
    block's norm and convolution are (`FastResidualBlock`).

    Fast tier, inference only, with diffusers' feature cache: the fused norm writes straight into
    conv_out's input buffer (`norm_into_causal_conv`), behind the cached frames or, where box_conv
    runs conv_out, with those read where they lie (the route's `front`), and the next call's cache is
    taken from that buffer after the convolution: sharded, with its halo rows, so the next call
    neither exchanges the cached frames again nor copies them strided. diffusers' forward clones
    the norm's output for the cache before the convolution and copies that clone into the next
    call's buffer; sharded, both copies are strided (a shard's rows between halo rows;
    benchmarks/memory_model.py --copies counts their bytes). The same values: a cached frame's halo
    rows are the ones the exchange would bring again. With
    `max_layer_frames` below the call's frames, conv_out takes its frames in parts from the norm's
    output as diffusers' head does (HaloCausalConv3d). Everything before the head is diffusers'
    forward (the same computation from 0.36 to 0.42 in Wan's and Qwen-Image's classes; Qwen-Image's
    slices its caches' frames as `-min(CACHE_T, t):`, the same frames). Otherwise (exact tier,
    training, autograd, no feature cache, a forward hook on a layer of the head, which this path
    would not call) diffusers' forward runs.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0], **kwargs):  # noqa: B006 - diffusers' signature
        if feat_cache is None or not _head_fast_path(self):
            return super().forward(x, feat_cache=feat_cache, feat_idx=feat_idx, **kwargs)
        x = causal_conv_step(self.conv_in, x, feat_cache, feat_idx)
        if hasattr(self, "up_blocks"):  # a decoder: middle, then upsamples (Wan's take `first_chunk`)
            x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
            for block in self.up_blocks:
                x = block(x, feat_cache=feat_cache, feat_idx=feat_idx, **kwargs)
        else:  # an encoder: downsamples, then middle
            for block in self.down_blocks:
                x = block(x, feat_cache=feat_cache, feat_idx=feat_idx)
            x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        limit = fast.max_layer_frames()
        if limit is not None and x.shape[2] > limit:  # conv_out in parts of the norm's output
            return causal_conv_step(self.conv_out, self.nonlinearity(self.norm_out(x)), feat_cache, feat_idx)
        pending = norm_into_causal_conv(self.norm_out, None, self.conv_out, x, feat_cache, feat_idx)
        del x  # (as diffusers' head drops the norm's input before its convolution)
        return pending.convolve()


def _head_fast_path(part: nn.Module) -> bool:
    """Whether a decoder's or encoder's head may run `FastCoderHead`'s way: `_fast_path`, with only
    the layers it does not call through their modules looked at for hooks (the norm, the SiLU,
    conv_out)."""
    return _fast_path(part, (part.norm_out, part.nonlinearity, part.conv_out))


class FastUpsample:
    """Mixin for a Wan upsampling `WanResample` (`upsample2d`, `upsample3d`): diffusers' computation
    with less data movement.

    Fast tier, inference only. diffusers interleaves the time convolution's two channel halves into
    twice the frames (`torch.stack`), lays the frames out as a batch (a second copy), upsamples them
    (a third tensor, 4x the input) and, sharded, copies that into a halo-padded input (a fourth).
    Here the 3x3 convolution is computed from the source frames by its four phases
    (`HaloConv2d.forward_by_phases`, kernels/phases.py; `tier.upsample_by_phases`): the upsampled frames
    are never made, the source is copied only to take the time convolution's channel halves apart
    or, sharded, into a buffer with its halo rows, and each output takes 16 products per input
    channel instead of 36 (the fast tier's tolerance: the phases' weights are rounded sums of
    taps). Where that is off, the frames are upsampled straight from their (strided) source into
    the 3x3 convolution's channels-last input buffer, between the halo rows: one copy; that
    convolution sees the same input, shapes and layout as without this mixin, so the values are the
    same bits (nearest 2x upsampling only copies values). With a bound on the layer's frames
    (tier.layer_frames: `max_layer_frames`, or the default parts), the phases are computed for at
    most that many output frames at a time, or the frames are upsampled and convolved one source
    frame at a time, into one output (no cache joins them). The feature-cache
    bookkeeping is diffusers' own (`WanResample.forward`, unchanged from diffusers 0.36 to 0.42),
    the time convolution's cache overwritten in place as in the residual blocks.
    """

    def forward(self, x, feat_cache=None, feat_idx=[0]):  # noqa: B006 - diffusers' signature
        if not (self.mode in ("upsample2d", "upsample3d") and _fast_path(self)):
            return super().forward(x, feat_cache, feat_idx)
        return self.upsample(x, feat_cache, feat_idx)[0]

    def upsample(self, x, feat_cache=None, feat_idx=None, shortcut=None) -> tuple[torch.Tensor, bool]:
        """The fast forward (the caller has checked `_fast_path` and the mode): (the output, whether
        `shortcut`, a (DupUp3D, its source) pair, was added into it as the phases were interleaved
        (`_dup_addend`; else the caller adds it)). Its output frames (4x the source's pixels) decide
        the parts (`tier.layer_frames`)."""

        def suits() -> bool:  # sharded, parts by phases share one halo exchange of their source
            # (forward_by_phases); a part upsampled into a buffer would make its own
            return shard.current() is None or (fast.upsample_by_phases(x) and upsample.takes(self.resample[1]))

        return self._upsample(x, feat_cache, feat_idx, shortcut, fast.layer_frames(4 * largest_frame_pixels(x), suits))

    def _upsample(self, x, feat_cache, feat_idx, shortcut, limit: int | None):
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4)  # (b, t, c, h, w): diffusers' batch of frames, not copied
        if self.mode == "upsample3d" and feat_cache is not None:
            idx = feat_idx[0]
            cached = feat_cache[idx]
            if cached is None:
                feat_cache[idx] = "Rep"
            else:
                x_in = x
                x = self.time_conv.convolve(x, None if isinstance(cached, str) else cached, limit)
                store_cache(feat_cache, idx, cached, x_in)  # once the time convolution has read the old cache
                del x_in
                # frame 2i + j is channel half j of the time convolution's frame i
                frames = x.unflatten(1, (2, c)).permute(0, 3, 1, 2, 4, 5)  # (b, t, 2, c, h, w)
                t *= 2
            feat_idx[0] += 1
        conv = self.resample[1]
        if fast.upsample_by_phases(x):  # from the source by phases (kernels/phases.py): no upsampled frames
            # each frame of x, or after the time convolution each half of its channels, is a frame
            src = x.transpose(1, 2).flatten(0, 1)  # (a view of channels-last x, as the convolutions give)
            addend = None if shortcut is None else _dup_addend(*shortcut, (b, conv.out_channels, t, 2 * h, 2 * w), x)
            y = conv.forward_by_phases(src, x.shape[1] // c, limit, addend)
            if y is not None:
                return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4), addend is not None
        if limit is None or t <= limit:
            buf = upsample_into_buffer(conv, x, frames, b, t, c, h, w)
            del x, frames
            y = conv.forward_buffer(buf)
        else:  # in parts: one source frame at a time (frames are independent here: no cache)
            per = t // frames.shape[1]  # output frames per source frame (2 after the time convolution)
            y = None
            for a in range(frames.shape[1]):
                yp = conv.forward_buffer(upsample_into_buffer(conv, x, frames[:, a : a + 1], b, per, c, h, w))
                if y is None:
                    y = torch.empty(
                        (b * t, *yp.shape[1:]), dtype=yp.dtype, device=yp.device, memory_format=torch.channels_last
                    )
                y.view(b, t, *yp.shape[1:])[:, a * per : (a + 1) * per].copy_(yp.view(b, per, *yp.shape[1:]))
                del yp
            del x, frames
        return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4), False


class FastResidualUpBlock:
    """Mixin for Wan 2.2's up block (diffusers' `WanResidualUpBlock`): diffusers' computation, with
    its duplicating shortcut (`DupUp3D`: each input voxel's channels spread over the output's
    channels and its 2 x 2 (x 2 in time) voxels) added into the upsampler's output in place, read
    from the block's input (on CUDA by the upsampler's own interleaving pass as it stores its output,
    `phases.Addend`, or where that does not run by one Triton pass after it, kernels/norm.py
    `add_duplicated_`; elsewhere through broadcasting views, `_dup_up_views`), instead of made as a
    tensor (a `repeat_interleave` and a permuted copy, each the size of the block's output) and added
    into a new one: one pass over the output instead of three, the same bits (one rounding per add
    either way), and none of those tensors at the decode's peak. diffusers clones the block's input first
    (also in the last block, which has no shortcut: a copy of the full-resolution input at the Wan
    2.2 decode's peak); here it is cloned only where the block has a shortcut and the first residual
    block writes its sum into its input (an identity shortcut, `FastResidualBlock`); with a
    convolution shortcut the input stays as it is.

    Fast tier, inference, no hooks inside the block, not for a shortcut's first decoder call (whose
    first frames it trims), and for channel counts whose duplication is a view (`_dup_up_views`;
    otherwise the shortcut is diffusers' own); diffusers' forward otherwise (the exact tier always)."""

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):  # noqa: B006 - diffusers' signature
        shortcut = self.avg_shortcut
        if (shortcut is not None and first_chunk) or not _fast_path(self) or self._forward_hooks:
            return super().forward(x, feat_cache, feat_idx, first_chunk)
        # the input is kept for the shortcut (diffusers clones it even for a block without one);
        # only an identity shortcut of the first residual block writes its sum into it
        writes_input = isinstance(self.resnets[0].conv_shortcut, nn.Identity)  # (FastResidualBlock's sum)
        source = None if shortcut is None else x.clone() if writes_input else x
        for resnet in self.resnets:
            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx) if feat_cache is not None else resnet(x)
        up = self.upsampler
        if (
            up is not None
            and shortcut is not None
            and isinstance(up, FastUpsample)
            and up.mode in ("upsample2d", "upsample3d")
            and _fast_path(up)
        ):
            # the shortcut added as the upsampler's phases are interleaved, where that pass can
            x, added = up.upsample(x, feat_cache, feat_idx, shortcut=(shortcut, source))
            if added:
                return x
        elif up is not None:
            x = up(x, feat_cache=feat_cache, feat_idx=feat_idx) if feat_cache is not None else up(x)
        if shortcut is None:
            return x
        views = _dup_up_views(shortcut, x, source)
        if views is None:
            return x + shortcut(source, first_chunk=first_chunk)
        # one Triton pass on CUDA, faster than PyTorch's add of the views (and the add in the
        # interleaving pass above faster still: docs/tuning.md, entry `kernels/phases.py takes_addend`)
        if not add_duplicated_(x, source, shortcut.factor_t, shortcut.factor_s, shortcut.repeats):
            target, duplicated = views
            target.add_(duplicated)
        return x


def _dup_addend(shortcut: nn.Module, source: torch.Tensor, out_shape: tuple[int, ...], like: torch.Tensor):
    """A `phases.Addend` of diffusers' `DupUp3D` (not first_chunk) of `source`, for an upsampler
    output of `out_shape` ((b, c, t, h, w); its frames laid out like `like`'s dtype and device), where
    the interleaving pass adds it (`phases.takes_addend`); else None."""
    ft, fs, repeats = shortcut.factor_t, shortcut.factor_s, shortcut.repeats
    b, cin, t, h, w = source.shape
    if (
        tuple(out_shape) != (b, shortcut.out_channels, t * ft, h * fs, w * fs)
        or cin * repeats != shortcut.out_channels * ft * fs * fs
    ):
        return None
    addend = upsample.Addend(source, ft, fs, repeats, frames=t * ft)
    return addend if upsample.takes_addend(like, addend) else None


def _dup_up_views(shortcut: nn.Module, out: torch.Tensor, source: torch.Tensor):
    """(a view of `out`, a broadcasting view of `source`) indexed alike by (sample, channel, time
    factor, row factor, column factor, frame, row, column), such that `out + shortcut(source)`
    (diffusers' `DupUp3D`, not first_chunk) is `out` with the second view added to the first; None
    where the duplication is no view: its repeats (each input channel's copies in a row of output
    channels) must be the product of the trailing ones of the (time, row, column) factors, as they
    are in Wan 2.2 (8 = 2 x 2 x 2 from 1024 to 1024 channels; 2, the column factor, from 1024 to 512).

    diffusers: the input's channel cc = cin * repeats + r is output channel c's sub-voxel
    q = (i * fs + j) * fs + k with cc = c * F + q (F = ft * fs * fs); output frame t * ft + i, row
    h * fs + j, column w * fs + k. So cin = c * (F / repeats) + q // repeats."""
    ft, fs, repeats = shortcut.factor_t, shortcut.factor_s, shortcut.repeats
    b, cin, t, h, w = source.shape
    cout = shortcut.out_channels
    if out.dim() != 5 or tuple(out.shape) != (b, cout, t * ft, h * fs, w * fs) or out.dtype != source.dtype:
        return None
    factors = (ft, fs, fs)
    lead = next((n for n in range(4) if math.prod(factors[n:]) == repeats), None)
    if lead is None or cin * repeats != cout * math.prod(factors):
        return None
    src = source.unflatten(1, (cout, *factors[:lead]))  # (b, cout, lead factors..., t, h, w)
    for _ in factors[lead:]:  # the repeated sub-voxels: broadcast
        src = src.unsqueeze(2 + lead)
    src = src.expand(b, cout, *factors, t, h, w)
    target = out.unflatten(2, (t, ft)).unflatten(4, (h, fs)).unflatten(6, (w, fs)).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return target, src


def _same_storage(y: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether `y` is `x`'s elements (the block wrote its sum into its input)."""
    return y.data_ptr() == x.data_ptr() and same_layout(y, x)


def _fast_path(block: nn.Module, layers=None) -> bool:
    """Whether `block` may run its fast-tier forward: fast tier, inference, no autograd, and no hook
    on a layer inside it (the fast forward calls those layers' computations directly; `layers`:
    only these and what they hold, where the fast forward calls the others as modules)."""
    return fast.enabled() and not block.training and not torch.is_grad_enabled() and not _hooked(block, layers)


def _hooked(block: nn.Module, layers=None) -> bool:
    """Whether a forward hook would see a layer inside the block (`layers`: among these and what
    they hold), which the fast forwards do not call."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    # runs on every block call: a plain walk of the submodules (a third of `modules()`'s cost)
    pending = list(block._modules.values() if layers is None else layers)
    while pending:
        m = pending.pop()
        if m is not None:
            if m._forward_hooks or m._forward_pre_hooks:
                return True
            pending.extend(m._modules.values())
    return False


# Halo rows a side that conv1 of a block making one halo exchange takes (`_one_exchange`): its own
# padding row and the row conv2 would otherwise receive.
CONV1_ROWS = 2


def _one_exchange(block: nn.Module, x: torch.Tensor) -> bool:
    """Whether a sharded residual block can make one halo exchange for its two convolutions: both
    pad one row each side of the sharded axis with a 3-wide kernel there, and every shard holds at
    least two rows at this level (conv1 receives two from each neighbour)."""
    ctx = shard.current()
    if ctx is None:
        return False
    slot = 2 if ctx.axis == shard.HEIGHT else 0  # in a causal conv's _padding (W, W, H, H, T, T)
    i = 1 if ctx.axis == shard.HEIGHT else 2  # in its kernel_size, stride, dilation (T, H, W)
    for conv in (block.conv1, block.conv2):
        if not hasattr(conv, "input_buffer") or tuple(conv._padding[slot : slot + 2]) != (1, 1):
            return False
        if (conv.kernel_size[i], conv.stride[i], conv.dilation[i]) != (3, 1, 1):
            return False
    return min(ctx.extents_at(x.shape[ctx.dim(x)])) >= CONV1_ROWS


def _edges(block: nn.Module, x: torch.Tensor):
    """Sharded, where `block` makes one halo exchange (`_one_exchange`): the rows of its input `x`
    that conv1 needs from the neighbours (two a side), received for all the parts of `x` at once,
    as (rows before, rows after), None beyond a global edge (Comm.neighbour_rows); else None. The
    norm before conv1 is computed voxel by voxel, so each part computes its halo rows from these
    (`_norm_with_edges_into_causal_conv`): the values its neighbours would send, with one exchange
    for all the parts instead of one per part."""
    ctx = shard.current()
    if ctx is None or not _one_exchange(block, x):
        return None
    return ctx.neighbour_rows(x, ctx.dim(x), CONV1_ROWS, CONV1_ROWS)


def _norm_with_edges_into_causal_conv(norm, conv, x, edges, feat_cache, feat_idx) -> CausalInput:
    """`norm_into_causal_conv` for a part of a sharded block's frames (`_forward_in_parts`) with
    conv1's two halo rows a side computed here: silu(norm(x)) between silu(norm(.)) of the part's
    rows of `edges` (`_edges`), zeros beyond a global edge, all written into conv1's input buffer,
    which then exchanges nothing (halo rows (0, 0): the buffer holds them)."""
    ctx = shard.current()
    dim, extent = ctx.dim(x), x.shape[ctx.dim(x)]
    shape = list(x.shape)
    shape[dim] += 2 * CONV1_ROWS
    pending = causal_input(conv, x, feat_cache, feat_idx, (0, 0), tuple(shape))
    rms_norm(x, norm.gamma, norm.bias, norm.scale, silu=True, out=pending.new.narrow(dim, CONV1_ROWS, extent))
    for rows, at in zip(edges, (0, extent + CONV1_ROWS)):
        target = pending.new.narrow(dim, at, CONV1_ROWS)
        if rows is None:
            target.zero_()
        else:
            rms_norm(rows, norm.gamma, norm.bias, norm.scale, silu=True, out=target)
    return pending
