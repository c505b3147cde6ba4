"""Norm layers of the fast tier and of sharded requests.

Fast tier: Wan's RMS norm fused with the SiLU after it (and the bias of the convolution before it);
the SiLU module then passes its input on; Wan's nearest upsampler runs in the input dtype. Sharded:
GroupNorm with the statistics of the whole, unsharded map (image VAEs such as Stable Diffusion's and FLUX's).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .. import tuning
from ..kernels import group_norm, group_norm_same
from ..kernels.norm import rms_norm
from ..runtime.comm import all_reduce_sum
from ..runtime.spatial import ShardContext, current
from .tier import enabled, same_kernels


class FusedRMSNormSiLU:
    """Mixin for a Wan RMS norm that is always followed by SiLU (residual blocks, output head).

    Fast tier: norm and SiLU in one pass; the SiLU module after it (`PassThroughSiLU`) then passes
    its input on. Exact tier: diffusers' norm, and the SiLU module applies SiLU as usual.
    """

    def forward(self, x):
        if not enabled():
            return super().forward(x)
        conv = self.__dict__.get(_BIAS_FROM)
        pre_bias = conv.bias if conv is not None else None
        return rms_norm(x, self.gamma, self.bias, self.scale, silu=True, pre_bias=pre_bias)


_BIAS_TO_NEXT = "_vaeshard_bias_to_next"  # on the convolution: leave the bias out in the fast tier


_BIAS_FROM = "_vaeshard_bias_from"  # on the norm: the convolution whose bias it adds first


def move_bias_into_norm(conv, norm) -> None:
    """In the fast tier, `conv` (whose output only `norm` reads) leaves out its bias and `norm` adds it.

    Stored outside nn.Module's registries (no new parameters, submodules or state_dict entries).
    """
    if getattr(conv, "bias", None) is None:
        return
    conv.__dict__[_BIAS_TO_NEXT] = True
    norm.__dict__[_BIAS_FROM] = conv


def bias_moved(conv) -> bool:
    """Whether `conv` leaves its bias to the norm after it (in the fast tier)."""
    return conv.__dict__.get(_BIAS_TO_NEXT, False)


def forget_moved_bias(module) -> None:
    module.__dict__.pop(_BIAS_TO_NEXT, None)
    module.__dict__.pop(_BIAS_FROM, None)


class PassThroughSiLU:
    """Mixin for the SiLU that follows a `FusedRMSNormSiLU`: identity in the fast tier."""

    def forward(self, x):
        if not enabled():
            return super().forward(x)
        return x


class NearestUpsample:
    """Mixin for Wan's nearest-exact 2x upsample: in the input dtype and memory format in the fast tier.

    Nearest upsampling only copies values, so skipping diffusers' fp32 round trip is exact.
    """

    def forward(self, x):
        if not enabled():
            return super().forward(x)
        return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode)


def global_group_norm(ctx: ShardContext, x: torch.Tensor, num_groups: int, weight, bias, eps: float) -> torch.Tensor:
    """GroupNorm of this rank's slice `x` (B, C, ...) with the statistics of the whole, unsharded map.

    Corrected two-pass over the shard ranks: a first all-reduce of per-(sample, group) sums and the
    element count gives a global mean estimate `shift`; a second one of the sums of d = x - shift and
    of d^2 gives the residual mean and the variance. The deviations are small next to the spread, so
    nothing cancels even where the mean is far larger than the spread (the naive E[x^2] - E[x]^2 loses
    every digit there). Statistics are combined in float64; the map is normalized in float32 (or in
    the input dtype if wider) and returned in the input dtype, as torch's group_norm does.
    """
    b, c = x.shape[0], x.shape[1]
    groups = num_groups
    compute = torch.promote_types(x.dtype, torch.float32)
    x_bgn = x.reshape(b, groups, -1)
    first = torch.empty(b * groups + 1, dtype=torch.float64, device=x.device)
    first[:-1] = x_bgn.sum(dim=-1, dtype=compute).flatten()
    first[-1] = x_bgn.shape[-1]
    all_reduce_sum(ctx.comm, first)
    count = first[-1]
    shift_bg1 = (first[:-1] / count).to(compute).view(b, groups, 1)

    d_bgn = x_bgn.to(compute) - shift_bg1  # a new tensor: it becomes the output
    second = torch.cat([d_bgn.sum(dim=-1).flatten(), torch.linalg.vector_norm(d_bgn, dim=-1).flatten()]).to(
        torch.float64
    )
    second[b * groups :] = second[b * groups :].square()
    all_reduce_sum(ctx.comm, second)
    mean_d = second[: b * groups] / count
    var = (second[b * groups :] / count - mean_d.square()).clamp_min(0)
    rstd_bg1 = (var + eps).rsqrt().view(b, groups, 1)

    # y = (d - mean_d) * rstd * weight + bias = d * scale + offset, per (sample, channel)
    per_group = c // groups
    scale_bgc = rstd_bg1.expand(b, groups, per_group)
    if weight is not None:
        scale_bgc = scale_bgc * weight.to(torch.float64).view(1, groups, per_group)
    offset_bgc = -mean_d.view(b, groups, 1) * scale_bgc
    if bias is not None:
        offset_bgc = offset_bgc + bias.to(torch.float64).view(1, groups, per_group)
    y = d_bgn.view(b, groups, per_group, -1)
    y.mul_(scale_bgc.to(compute).unsqueeze(-1)).add_(offset_bgc.to(compute).unsqueeze(-1))
    return y.view(x.shape).to(x.dtype)


def whole_map_sum():
    """For kernels/group_norm.py's `reduce`: None outside a sharded request; sharded, the in-place sum
    over the shard's ranks that makes a rank's statistics the whole map's."""
    ctx = current()
    return None if ctx is None else functools.partial(all_reduce_sum, ctx.comm)


def runs_same(norm, x: torch.Tensor, variant: str = "plain") -> bool:
    """Whether `same_group_norm(norm, x)` runs kernels/group_norm_same.py as `variant` applies it
    (group_norm_same.VARIANTS: alone, with SiLU, scaled and shifted before SiLU, of x plus a bias
    before SiLU, or both): the request allows those kernels (tier.same_kernels), it is not sharded, `x`
    is large enough for them to pay (tuning.GROUP_NORM_SAME_MIN_ELEMENTS), PyTorch would read it
    channels-first (itself, or a contiguous copy of it), and the kernels take it and agree with PyTorch
    on its device."""
    if current() is not None or not same_kernels() or x.numel() < tuning.GROUP_NORM_SAME_MIN_ELEMENTS:
        return False
    if not _copied_channels_first(x) or not group_norm_same.takes(x, norm.num_groups, copy=True):
        return False
    return group_norm_same.agrees(x.device, x.dtype, variant)


def _copied_channels_first(x: torch.Tensor) -> bool:
    """Whether PyTorch's GroupNorm reads a copy of `x` in the channels-first layout (its
    `input.contiguous(input.suggest_memory_format())`), certainly: x is already so, or it is not
    contiguous and its channels lie farther apart than its columns, which no channels-last layout
    has. (A contiguous copy of x is then what the kernels read too, with PyTorch's bits.)"""
    if x.is_contiguous():
        return True
    return x.dim() in (4, 5) and x.shape[-1] > 1 and x.shape[1] > 1 and x.stride(1) > x.stride(-1)


def same_group_norm(
    norm,
    x: torch.Tensor,
    silu: bool = False,
    out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    pre_bias: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The nn.GroupNorm `norm` of `x` (plus `pre_bias` first, one value per channel, rounded as a bias
    pass rounds it, where given; times `scale` plus `shift`, where given; then SiLU, where `silu`) by
    kernels/group_norm_same.py, PyTorch's bits, written into `out` where given; None (nothing written)
    where not `runs_same(norm, x, variant)` for that variant."""
    variant = "scaled" if scale is not None else "biased" if pre_bias is not None else "silu" if silu else "plain"
    variant = "scaled-biased" if scale is not None and pre_bias is not None else variant
    if pre_bias is not None and not silu:
        raise ValueError("same_group_norm: a pre_bias is taken with SiLU only (the checked variant)")
    if not runs_same(norm, x, variant):
        return None
    # (the contiguous copy PyTorch's GroupNorm makes of a map that is not: `_copied_channels_first`)
    args = (x.contiguous(), norm.num_groups, norm.weight, norm.bias, norm.eps)
    return group_norm_same.group_norm(*args, silu=silu, out=out, scale=scale, shift=shift, pre_bias=pre_bias)


class GlobalGroupNorm:
    """Mixin for nn.GroupNorm: sharded, the statistics are those of the whole map (small all-reduces:
    in the fast tier one, by kernels/group_norm.py where its kernels take the map; else two).

    A GroupNorm couples every pixel of a group, so per-slice statistics would differ from the
    unsharded decode; the normalization itself stays local. Unsharded, where the request allows it
    (tier.same_kernels): PyTorch's GroupNorm bit for bit by kernels/group_norm_same.py, where those
    kernels agree with PyTorch on the device.
    """

    def forward(self, x):
        ctx = current()
        if ctx is None:
            y = same_group_norm(self, x)
            return super().forward(x) if y is None else y
        if enabled() and group_norm.takes(x, self.num_groups):
            args = (self.num_groups, self.weight, self.bias, self.eps)
            return group_norm.group_norm(x, *args, silu=False, reduce=whole_map_sum())
        return global_group_norm(ctx, x, self.num_groups, self.weight, self.bias, self.eps)
