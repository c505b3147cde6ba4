"""The fast tier's request scope, and the calls through which layers reach the kernels.

A request runs in the fast tier unless the VAE was parallelized with `exact=True`, the mode is
`tile`, or hooks replace its layers' forwards; then every layer runs diffusers' own computation, bit
for bit. `vaeshard.plan` resolves a fast-tier request's choices once, before any work, into a
`FastPlan`; `active(plan)` makes it the request's (the running request's `fast`, runtime/requests.py,
so code outside a vaeshard request always sees the original layers), and the layers read it, never
change it. Where a layer runs its frames in parts, it passes the part size to what it calls.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import tuning
from ..kernels import attention as attention_kernel
from ..kernels import conv3d as conv_kernel
from ..kernels import triton_support
from ..kernels.norm import add_bias_, add_bias_and_residual_, fused_bias_add_available, rms_norm
from ..kernels.routing import Route, route
from ..runtime import requests


@dataclass(frozen=True)
class FastPlan:
    """A fast-tier request's choices, resolved once by `vaeshard.plan` from numbers every rank shares
    (so every rank makes the same calls and exchanges). `reasons`: (choice, why) pairs.

    frames_per_step:  latent frames per decoder call after the first (causal video VAEs).
    cuda_graphs:      the steady decoder calls replay one CUDA graph; keep_cuda_graphs: it is kept.
    max_layer_frames: the user's bound on the frames a layer takes at once (None: none).
    part_frames:      without that bound, the frames per part of a layer whose frames hold at least
                      `parts_from_pixels` pixels (on the largest rank) where parts suit it; None: none.
    frame_pixels:     the largest rank's output frame in pixels (decode), or input frame (encode).
    cudnn_benchmark:  cuDNN's benchmark mode for the request; triton_convs: vaeshard's convolutions.
    norm_into_conv:   a family's declared norms + SiLU write into the next convolution's padded input
                      buffer (fast/producers.py).
    """

    frames_per_step: int = 1
    cuda_graphs: bool = False
    keep_cuda_graphs: bool = False
    max_layer_frames: int | None = None
    part_frames: int | None = None
    parts_from_pixels: int = 0
    frame_pixels: int = 0
    cudnn_benchmark: bool = True
    triton_convs: bool = True
    norm_into_conv: bool = False
    reasons: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # (not a choice: the same plan)

    def layer_frames(self, pixels: int, suits=None) -> int | None:
        """The most frames a layer (residual block, upsampler) whose frames hold `pixels` pixels on the
        largest rank takes at once: `max_layer_frames` where set; else `part_frames` from
        `parts_from_pixels` where `suits()` (the layer's: whether parts pay there; asked last, None:
        yes); else None (all it is given)."""
        if self.max_layer_frames is not None:
            return self.max_layer_frames
        if self.part_frames is None or pixels < self.parts_from_pixels or (suits is not None and not suits()):
            return None
        return self.part_frames

    def explain(self) -> str:
        """The choices and their reasons, one per line."""
        return "\n".join(f"{name}: {why}" for name, why in self.reasons)


def current() -> FastPlan | None:
    """This request's fast-tier choices, or None (the exact tier, or outside a vaeshard request)."""
    request = requests.current()
    return None if request is None else request.fast


def enabled() -> bool:
    return current() is not None


def same_kernels() -> bool:
    """Whether this request's layers may run PyTorch's arithmetic through vaeshard's kernels that give
    its bits (kernels/group_norm_same.py): the fast tier, and the exact tier of a request that asked
    for the fast tier (policy.Plan.same_kernels); never with exact=True, in mode `tile` or with hooks;
    nowhere while tuning.GROUP_NORM_SAME_KERNELS is off."""
    request = requests.current()
    if request is None or not tuning.GROUP_NORM_SAME_KERNELS:
        return False
    return request.fast is not None or (request.plan is not None and request.plan.same_kernels)


@contextlib.contextmanager
def active(plan: FastPlan | None):
    """Run a request with `plan` (None: exactly as diffusers computes). With `cudnn_benchmark`, cuDNN's
    benchmark mode is on for the request, the caller's setting restored afterwards: the first
    convolution of each new shape times cuDNN's algorithms once per process and later ones reuse the
    fastest. The exact tier leaves cuDNN as the caller set it."""
    benchmark = torch.backends.cudnn.benchmark
    with requests.scoped(fast=plan):
        if plan is not None and plan.cudnn_benchmark:
            torch.backends.cudnn.benchmark = True
        try:
            yield plan
        finally:
            torch.backends.cudnn.benchmark = benchmark


def max_layer_frames() -> int | None:
    """The user's bound on the frames a layer takes at once in this request (None: none; always None
    outside the fast tier)."""
    plan = current()
    return None if plan is None else plan.max_layer_frames


def layer_frames(pixels: int, suits=None) -> int | None:
    """`FastPlan.layer_frames` of this request (None outside the fast tier)."""
    plan = current()
    return None if plan is None else plan.layer_frames(pixels, suits)


def signature() -> tuple:
    """This request's fast-tier choices and PyTorch's switches that choose its kernels (cuDNN's
    benchmark mode, TF32): a kept CUDA graph serves only a request that would run the same kernels."""
    return (
        current(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    )


def kernels_on() -> bool:
    """Whether this request may run vaeshard's convolution kernels: the fast tier with triton_convs."""
    plan = current()
    return plan is not None and plan.triton_convs


def kernels_unavailable(device: torch.device) -> str | None:
    """Why a fast-tier request on `device` runs none of vaeshard's Triton kernels in this installation
    (kernels/triton_support.py: Triton missing, or a version it does not support), or None: they may
    run there, or the device never runs them (CPU outside Triton's interpreter)."""
    if device.type != "cuda" and not triton_support.interpreting():
        return None
    return triton_support.unavailable()


def conv_route(weight: torch.Tensor, stride, padding, dilation, groups, **question) -> Route:
    """`kernels.routing.route` of a 3-D convolution in this request."""
    return route(F.conv3d, weight, stride, padding, dilation, groups, kernels_on=kernels_on(), **question)


# --- memory format ----------------------------------------------------------------------------------


def channels_last_format(ndim: int):
    return torch.channels_last_3d if ndim == 5 else torch.channels_last


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=channels_last_format(x.ndim))


def conv_with_bias(
    conv,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *args,
    add_to: torch.Tensor | None = None,
    norm: conv_kernel.NormEpilogue | None = None,
    out: torch.Tensor | None = None,
    front: conv_kernel.Front | None = None,
) -> torch.Tensor:
    """`conv(x, weight, bias, *args)` (F.conv2d, F.conv3d; args: stride, padding, dilation, groups),
    run by the kernel its route names (kernels/routing.py); with `add_to`, that result added to
    `add_to` in place and `add_to` returned (`add_to + conv(...)`, rounded after the bias and after the
    sum as PyTorch's separate adds round). With `norm` (and `out`, a tensor of the result's shape: the
    next convolution's input frames, say), `rms_norm` of that result as `norm` says, written into
    `out`, which is returned: by the kernel as it stores where its route `norms_output`, so the
    convolution's output is never stored, else by `rms_norm` after the convolution.

    A vaeshard kernel adds the bias before its single rounding, and `add_to` in its epilogue where its
    route `adds_residual` and the tensor has the kernel's output layout (else one pass after it).
    Otherwise on CUDA the bias is added afterwards by `add_bias_` (or with `add_to` by
    `add_bias_and_residual_`, one pass) instead of PyTorch's own bias pass: the same bits (PyTorch's
    cuDNN path adds the bias in a separate pass too, rounding once), in one vectorised pass over the
    channels-last output. Elsewhere the plain call (then `add_to.add_`).

    `front` (a causal 3-D convolution whose input `x` holds only its new frames): the time padding
    read from the cache where it lies (conv3d.Front), by box_conv's kernel, which must take the
    convolution (ValueError otherwise: the caller's route gave the front)."""
    way = route(conv, weight, *args, kernels_on=kernels_on(), x=x, bias=bias, front=front)
    if norm is not None:
        if out is None or add_to is not None:
            raise ValueError("conv_with_bias: a norm needs `out` and takes no `add_to`")
        if way.norms_output and conv_kernel.takes_out(out, conv_kernel.out_shape(x, weight, args[1], front), x.dtype):
            return conv_kernel.conv3d(
                x,
                weight,
                bias,
                args[1],
                way.plan,
                conv_kernel.cached_weight_for(way.plan, weight),
                norm=norm,
                out=out,
                front=front,
            )
        y = conv_with_bias(conv, x, weight, bias, *args, front=front)
        return rms_norm(y, norm.gamma, norm.bias, norm.scale, norm.silu, norm.eps, norm.pre_bias, out=out)
    how = way.plan
    if how is not None:
        into = (
            add_to
            if add_to is not None
            and way.adds_residual
            and conv_kernel.takes_add_to(add_to, conv_kernel.out_shape(x, weight, args[1], front), x.dtype)
            else None
        )
        y = conv_kernel.conv3d(
            x, weight, bias, args[1], how, conv_kernel.cached_weight_for(how, weight), into, front=front
        )
        return y if into is not None or add_to is None else add_bias_and_residual_(y, None, add_to, True)
    if front is not None:
        raise ValueError(
            "conv_with_bias: no kernel here reads a causal convolution's cache where it lies (its route gave no front)"
        )
    if add_to is not None:
        fused = bias is not None and bias.dtype == x.dtype and fused_bias_add_available(x)
        y = conv(x, weight, None if fused else bias, *args)
        return add_bias_and_residual_(y, bias if fused else None, add_to, into_residual=True)
    if bias is None or bias.dtype != x.dtype or not fused_bias_add_available(x):  # (PyTorch's checks, errors)
        return conv(x, weight, bias, *args)
    return add_bias_(conv(x, weight, None, *args), bias)


def leaves_bias(conv, x: torch.Tensor, exact_too: bool = False) -> bool:
    """Whether `conv_module(conv, x, ..., leave_bias=True)` leaves `conv`'s bias out of its output (for
    the reader of that output to add as it reads, rounded as the bias pass rounds: kernels/group_norm.py
    `pre_bias`): where the fast tier adds the bias in a pass of its own anyway; with `exact_too`, also
    in the exact tier of a request allowed vaeshard's kernels with PyTorch's bits (`same_kernels`),
    where PyTorch adds it in a pass of its own (CUDA)."""
    bias = conv.bias
    tiers = enabled() or (exact_too and same_kernels())
    return tiers and bias is not None and bias.dtype == x.dtype and fused_bias_add_available(x)


def conv_module(
    conv, x: torch.Tensor, padding, add_to: torch.Tensor | None = None, leave_bias: bool = False
) -> torch.Tensor:
    """`F.conv3d` (`F.conv2d`) of `x` with `conv`'s weight, bias, stride, dilation and groups and zero
    `padding`, plus `add_to` where given (a residual: `conv(x) + add_to`, `add_to` left as it is). In
    the fast tier on CUDA PyTorch's convolution without its bias, then `add_bias_` (with `add_to` of the
    output's shape and dtype, in any layout, `add_bias_and_residual_`): one vectorised pass where PyTorch's
    own bias pass over a channels-last 3-D output is a strided one, and the same bits (PyTorch's cuDNN
    path adds the bias in a pass of its own too, rounding once, and each add rounds as PyTorch's).
    It asks for no vaeshard kernel: these convolutions (the other families' than Wan's) keep cuDNN's
    until their shapes are measured with them. In the exact tier of a request allowed vaeshard's kernels
    with PyTorch's bits (`same_kernels`), with `add_to`, the same one pass after diffusers' convolution
    without its bias (`leaves_bias(exact_too=True)`). Elsewhere PyTorch's calls. `leave_bias` (no `add_to`):
    where `leaves_bias(exact_too=True)`, the output without the bias (ValueError elsewhere: the caller
    asks first)."""
    fn = F.conv3d if conv.weight.dim() == 5 else F.conv2d
    bias = conv.bias
    # the bias in a pass of its own (in the exact tier only to add a residual in that pass)
    separate = leaves_bias(conv, x, exact_too=add_to is not None)
    if leave_bias:
        if add_to is not None or not leaves_bias(conv, x, exact_too=True):
            raise ValueError("conv_module: the bias is left out only where leaves_bias(conv, x), without add_to")
        return fn(x, conv.weight, None, conv.stride, padding, conv.dilation, conv.groups)
    if separate:
        y = fn(x, conv.weight, None, conv.stride, padding, conv.dilation, conv.groups)
        if add_to is not None and add_to.shape == y.shape and add_to.dtype == y.dtype:
            return add_bias_and_residual_(y, bias, add_to)
        y = add_bias_(y, bias)
    else:
        y = fn(x, conv.weight, bias, conv.stride, padding, conv.dilation, conv.groups)
    return y if add_to is None else y + add_to


def upsample_by_phases(x: torch.Tensor) -> bool:
    """Whether, in this request, the 3x3 convolution after a nearest 2x upsampling of `x`'s frames
    runs by phases from the source (kernels/phases.py, `HaloConv2d.forward_by_phases`): the fast tier,
    on every device."""
    return enabled()


def attention_kernel_available(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention` runs vaeshard's own attention for these tensors (`attention.available`)."""
    return attention_kernel.available(q, k, v)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v)`; in the fast tier, where `attention_kernel_available`,
    vaeshard's own (kernels/attention.py), within the tier's tolerances."""
    if enabled() and attention_kernel_available(q, k, v):
        return attention_kernel.attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)
