"""Halo rows: the mixins (swapped onto diffusers' own modules, runtime/swap.py) that give a padded
convolution of a sharded feature map its neighbours' rows in place of its padding on the sharded axis,
named by how the module pads, and the one function that extends a shard by them (`extend_rows`).

- `HaloPaddedConv`: an nn.Conv2d / nn.Conv3d that pads itself (`padding`, in any of the modes zeros,
  reflect, replicate): LTX-Video's inner convolutions, CogVideoX's `CogVideoXSafeConv3d` (in its time
  chunks: `HaloSafeConv3d`); convs.py's `HaloConv2d` (the fast tier's) runs it sharded in the exact tier.
- `HaloPadThenConv`: a module that pads its input by an F.pad tuple (`time_causal_padding`, replicate
  mode) and then runs an unpadded child `conv`: HunyuanVideo's and HunyuanVideo 1.5's causal
  convolutions, and `CogVideoXCausalConv3d` in its "replicate" mode (Mochi 1's,
  `HaloPadThenCachedConv`, whose forward also takes and returns a time cache).
- `HaloFrameConv2d`: a single-frame "causal Conv3d", an nn.Conv2d over the squeezed frame padded by
  its F.pad tuple `_padding` (Qwen-Image 2.1's).
- `HaloZeroPad2d`: an nn.ZeroPad2d before a strided convolution (Wan's downsamplers).
- `HaloInlinePadConv2d`: an unpadded stride-2 nn.Conv2d whose caller pads (0, 1, 0, 1) inline
  (CogVideoX's downsampler).

Every forward first asks the current shard context (runtime/spatial.py): outside a sharded request
the original forward runs, so direct and tile requests are unaffected by the installation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.spatial import HEIGHT, current
from . import tier as fast_tier

PADDING_MODES = ("zeros", "reflect", "replicate")

# diffusers' CogVideoXSafeConv3d: inputs above this many GiB (counted at 2 bytes per value) go in parts
SAFE_CONV_GIB = 2


def extend_rows(ctx, x: torch.Tensor, dim: int, before: int, after: int, mode: str = "zeros") -> torch.Tensor:
    """`x` extended along the sharded `dim` by `before` rows of the previous rank and `after` of the
    next (one exchange), and at the global edges by what `mode` pads the whole map with there: zeros;
    the edge row repeated ("replicate"); the rows next to the edge mirrored ("reflect": they may lie
    on the next rank where a shard holds fewer rows than the padding needs). One new tensor in `x`'s
    memory format."""
    if not before and not after:
        return x
    if mode not in PADDING_MODES:
        raise ValueError(f"vaeshard's halo rows pad in the modes {PADDING_MODES}, not {mode!r}")
    out = ctx.halo_pad(x, dim, before, after)  # zeros at the global edges, made `mode`'s below
    if mode == "zeros":
        return out
    extent = x.shape[dim]
    if ctx.comm.rank == 0 and before:
        edge = out.narrow(dim, 0, before)
        if mode == "replicate":
            edge.copy_(x.narrow(dim, 0, 1).expand_as(edge))
        else:  # the map's rows 1..before, mirrored
            edge.copy_(out.narrow(dim, before + 1, before).flip(dim))
    if ctx.comm.rank == ctx.num_ranks - 1 and after:
        edge = out.narrow(dim, before + extent, after)
        if mode == "replicate":
            edge.copy_(x.narrow(dim, extent - 1, 1).expand_as(edge))
        else:  # the `after` rows before the map's last one, mirrored
            edge.copy_(out.narrow(dim, before + extent - 1 - after, after).flip(dim))
    return out


def extend_padding(ctx, x: torch.Tensor, padding, mode: str = "zeros") -> tuple[torch.Tensor, tuple[int, ...]]:
    """(`x` with halo rows, the padding left): `padding` an F.pad tuple (w_left, w_right, h_top,
    h_bottom, ...) of `x`; its entries for the sharded axis become rows of the neighbours
    (`extend_rows`) and zeros in the tuple returned."""
    padding = list(padding)
    slot = 2 if ctx.axis == HEIGHT else 0
    x = extend_rows(ctx, x, ctx.dim(x), padding[slot], padding[slot + 1], mode)
    padding[slot] = padding[slot + 1] = 0
    return x, tuple(padding)


class HaloPaddedConv:
    """Mixin for an nn.Conv2d or nn.Conv3d with spatial 'same' padding of its own (odd kernel, padding
    (k - 1) / 2 on the sharded axis, any stride) in any of PADDING_MODES: sharded, the sharded axis
    is extended by the rows its padding would cover (`extend_rows`, the convolution's own mode at the
    global edges) and the convolution runs without padding on that axis, the other axes padded as
    the convolution pads them."""

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        return self._sharded(ctx, x)

    def _sharded(self, ctx, x):
        dim = ctx.dim(x)
        slot = dim - x.dim() + len(self.padding)  # index in `padding` of the sharded axis
        padding = list(self.padding)
        x = extend_rows(ctx, x, dim, padding[slot], padding[slot], self.padding_mode)
        padding[slot] = 0
        return self._convolve(x, tuple(padding))

    def _convolve(self, x, padding):
        """The convolution of the extended `x` with `padding` left, in the convolution's mode."""
        conv = F.conv3d if self.weight.dim() == 5 else F.conv2d
        if self.padding_mode != "zeros":  # the other axes, as torch pads them
            x = F.pad(x, [p for p in reversed(padding) for _ in (0, 1)], mode=self.padding_mode)
            padding = 0
        return conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class HaloSafeConv3d(HaloPaddedConv):
    """Mixin for diffusers' `CogVideoXSafeConv3d` (zero 'same' padding): `HaloPaddedConv` in
    diffusers' time chunks (`safe_conv3d`). Time is never sharded, so its wrapper
    `CogVideoXCausalConv3d` pads time from its cache as diffusers does, each rank keeping the cache of
    its own rows; the halo rows are exchanged once for the whole input, cached frames included."""

    def _convolve(self, x, padding):
        return safe_conv3d(self, x, padding)


def safe_conv3d(
    conv, x: torch.Tensor, padding, add_to: torch.Tensor | None = None, leave_bias: bool = False
) -> torch.Tensor:
    """`conv` (an nn.Conv3d with zeros padding, stride 1 in time) of `x` with `padding`, in diffusers'
    CogVideoXSafeConv3d time chunks: above SAFE_CONV_GIB, `int(GiB / 2) + 1` chunks, each after the
    first led by the previous chunk's last `k_t - 1` frames; at most one chunk per `k_t` frames (where
    diffusers' chunks would be shorter than the kernel, and fail). The chunk count comes from this
    rank's input, which changes no value: each output frame sees the same input frames. `add_to`: a
    residual added to the result (in the bias pass of a single chunk, layers/tier.py `conv_module`);
    `leave_bias`: every chunk without the bias (`conv_module`)."""

    def run(part, residual=None):
        return fast_tier.conv_module(conv, part, padding, add_to=residual, leave_bias=leave_bias)

    gib = x.numel() * 2 / 1024**3
    if gib <= SAFE_CONV_GIB:
        return run(x, add_to)
    kt = conv.kernel_size[0]
    # torch.chunk's frames, each chunk after the first led by the frames before it: views of `x`,
    # the same frames diffusers concatenates
    size = -(-x.shape[2] // min(int(gib / SAFE_CONV_GIB) + 1, max(1, x.shape[2] // kt)))
    starts = range(0, x.shape[2], size)
    parts = [x.narrow(2, max(t - kt + 1, 0), min(t + size, x.shape[2]) - max(t - kt + 1, 0)) for t in starts]
    out = torch.cat([run(part) for part in parts], dim=2)
    return out if add_to is None else out + add_to


class HaloPadThenConv:
    """Mixin for a module that pads by replication (`F.pad(x, time_causal_padding, mode="replicate")`:
    time, the first frame repeated in front; height and width, the edge rows and columns) and then
    runs an unpadded Conv3d child `conv`. Replication pads each axis by clamping indices along it
    alone, so sharded, the sharded axis is extended first (`extend_rows`, the edge row repeated at the
    global edges only) and the other axes padded as in the original; time is never sharded.

    A child strided along the sharded axis (the encoders' downsamplers: stride 2, pads summing to the
    kernel less one) gives each rank its own output rows where every rank's extent is a multiple of
    the stride (shards are whole latent rows, so this holds above the latent's resolution); otherwise
    it raises."""

    def forward(self, hidden_states):
        ctx = current()
        if ctx is None:
            return super().forward(hidden_states)
        return self._sharded_forward(ctx, hidden_states)

    def _sharded_forward(self, ctx, hidden_states):
        dim = ctx.dim(hidden_states)
        stride = self.conv.stride[dim - 2]
        if stride > 1 and any(e % stride for e in ctx.extents_at(hidden_states.shape[dim])):
            raise RuntimeError(
                f"a causal convolution of stride {stride} along the sharded {ctx.axis} cannot run on shards of "
                f"{ctx.extents_at(hidden_states.shape[dim])} rows: each must be a multiple of the stride"
            )
        x, padding = extend_padding(ctx, hidden_states, self.time_causal_padding, "replicate")
        return self.conv(F.pad(x, padding, mode="replicate"))


class HaloPadThenCachedConv(HaloPadThenConv):
    """Mixin for `CogVideoXCausalConv3d` (`forward(inputs, conv_cache=None)` -> `(output, cache)`) in its
    "replicate" mode, where diffusers ignores the cache and returns None for it. Sharded in another
    mode it raises (use mode='tile')."""

    def forward(self, inputs, conv_cache=None):
        ctx = current()
        if ctx is None:
            return super(HaloPadThenConv, self).forward(inputs, conv_cache)
        if self.pad_mode != "replicate":
            raise ValueError(
                f"vaeshard shards {type(self).__name__} only in its 'replicate' padding mode, not {self.pad_mode!r} "
                "(frame-wise decoding); use mode='tile'"
            )
        return self._sharded_forward(ctx, inputs), None


def replicate_causal_problem(module) -> str | None:
    """What keeps `HaloPadThenConv` from sharding `module` exactly, or None: it must pad by
    replication, its child must not pad itself nor be dilated in space, and along each spatial axis
    the padding must be 'same' (kernel - 1, any stride) or kernel - stride (a patchify: kernel =
    stride, none)."""
    conv = module.conv
    w_left, w_right, h_top, h_bottom = module.time_causal_padding[:4]
    if module.pad_mode != "replicate":
        return f"a causal convolution padding in mode {module.pad_mode!r}, not 'replicate'"
    if any(conv.padding) or conv.dilation[1:] != (1, 1):
        return "a causal convolution whose child pads itself or is dilated in space"
    spatial = zip(conv.kernel_size[1:], conv.stride[1:], (h_top + h_bottom, w_left + w_right))
    for k, stride, pads in spatial:
        if pads != k - 1 and k - pads != stride:
            return "a causal convolution padded neither 'same' nor as a patchify (kernel - padding = stride)"
    return None


class HaloFrameConv2d:
    """Mixin for a single-frame causal convolution (an nn.Conv2d over x.squeeze(2), zero-padded by its
    F.pad tuple `_padding`; it refuses a time cache).

    Outside a sharded request, or given a time cache, the original forward runs. Sharded: halo rows
    in place of the sharded axis's padding (`extend_padding`), the other axis zero-padded as in the
    original (F.pad, then the unpadded convolution: diffusers' steps and layout in either tier).
    """

    def forward(self, x, cache_x=None):
        ctx = current()
        if ctx is None or cache_x is not None:
            return super().forward(x, cache_x)
        frame, padding = extend_padding(ctx, x.squeeze(2), tuple(self._padding))
        out = F.conv2d(F.pad(frame, padding), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return out.unsqueeze(2)


class HaloZeroPad2d:
    """Mixin for nn.ZeroPad2d before a strided conv (Wan's downsamplers pad (0, 1, 0, 1)).

    On the sharded axis the pad rows of an interior shard boundary are the neighbour's rows; the
    global edges keep their zeros. Shards start on even rows at every level (the split is in whole
    latent rows), so the strided convolution that follows lands on the global stride lattice.
    """

    def forward(self, x):
        ctx = current()
        if ctx is None:
            return super().forward(x)
        x, padding = extend_padding(ctx, x, self.padding)
        return F.pad(x, padding)


class HaloInlinePadConv2d:
    """Mixin for an unpadded convolution behind an inline zero pad by its caller of `inline_pad` =
    (rows before, rows after) on the sharded axis (CogVideoX's `CogVideoXDownsample3D`:
    `F.pad(x, (0, 1, 0, 1))`, then a 3x3 stride-2 Conv2d: (0, 1)).

    Its input is the caller's padded map, which only the convolution reads. Sharded, the pad rows at
    an interior shard boundary are the neighbours' rows (the zeros stay at the global edges), written
    in place; the other axes keep the caller's padding. With stride 2 (output row i reads input rows
    2 i .. 2 i + 2) every shard must start on an even row, which shards of whole latent rows do at
    each downsampling level: each rank then computes exactly its rows of the whole map's output."""

    inline_pad = (0, 1)

    def forward(self, x, *args):
        ctx = current()
        if ctx is None:
            return super().forward(x, *args)
        dim = ctx.dim(x)
        before, after = self.inline_pad
        rows = x.shape[dim] - before - after  # this rank's rows, between the caller's pad rows
        stride = self.stride[dim - x.dim()]
        if rows % stride:
            raise RuntimeError(
                f"a shard of {rows} rows before a stride-{stride} convolution: shards must start on even rows"
            )
        prev, nxt = ctx.neighbour_rows(x.narrow(dim, before, rows), dim, before, after)
        if prev is not None:  # not the first rank: the previous rank's last rows replace the zero pad
            x.narrow(dim, 0, before).copy_(prev)
        if nxt is not None:  # not the last rank: the next rank's first rows replace the zero pad
            x.narrow(dim, before + rows, after).copy_(nxt)
        return super().forward(x, *args)


class HaloInlineSamePadConv(HaloInlinePadConv2d):
    """`HaloInlinePadConv2d` for a stride-1 convolution whose caller zero-pads its input 'same' on the
    sharded axis, (k - 1) / 2 rows each side (Kandinsky 6 SR's causal convolution: `F.pad` of height
    and width, then its cached time frames, then this convolution)."""

    @property
    def inline_pad(self):
        half = (self.kernel_size[-1] - 1) // 2  # odd and square in space, which the caller checks
        return half, half
