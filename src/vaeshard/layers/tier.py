"""The fast tier's request scope, and the calls through which layers reach the kernels.

A request runs in the fast tier unless the VAE was parallelized with `exact=True` (then every layer
runs diffusers' own computation, bit for bit). The tier is request-scoped (ContextVars), so code
outside a vaeshard request always sees the original layers.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from ..kernels import attention as attention_kernel
from ..kernels import conv3d as conv_kernel
from ..kernels.norm import add_bias_, add_bias_and_residual_, fused_bias_add_available, rms_norm


_fast: contextvars.ContextVar[bool] = contextvars.ContextVar("vaeshard_fast", default=False)


_frames_per_step: contextvars.ContextVar[int | str] = contextvars.ContextVar("vaeshard_frames_per_step", default="auto")


_max_layer_frames: contextvars.ContextVar[int | None] = contextvars.ContextVar("vaeshard_max_layer_frames", default=None)


_triton_convs: contextvars.ContextVar[bool] = contextvars.ContextVar("vaeshard_triton_convs", default=True)


_cuda_graphs: contextvars.ContextVar[bool | str] = contextvars.ContextVar("vaeshard_cuda_graphs", default=False)


_keep_cuda_graphs: contextvars.ContextVar[bool] = contextvars.ContextVar("vaeshard_keep_cuda_graphs", default=False)


def enabled() -> bool:
    return _fast.get()


# frames_per_step="auto" (the default) takes AUTO_STEP_FRAMES latent frames per decoder call where a
# decode runs on CUDA with output frames of at most AUTO_STEP_MAX_PIXELS pixels (sharded: the largest
# rank's), else 1. There a call's fixed costs (the host's launches, and sharded its halo exchanges,
# once per call whatever its frames) weigh most against its GPU work. Measured on one H200, a rank's
# share timed alone with its communication stood in, 1 against 2 frames interleaved in each process
# (BENCHMARKS.md): Wan 2.1 480p rank 0 of 2 (832 x 240 pixels) 0.309 / 0.332 s against 0.291 / 0.319
# s, peak 1.48 against 1.91 GiB; 720p rank 1 of 4 (1280 x 180) 0.402 / 0.381 against 0.348 / 0.324 s,
# 1.69 against 2.19 GiB; rank 1 of 8 0.232 / 0.237 against 0.206 / 0.194 s, 0.89 against 1.14 GiB.
# Larger frames keep 1: their memory is what runs out first (Wan 2.1 720p on 2 GPUs, 460,800 pixels a
# rank: 2 frames per step took 3.62 -> 5.97 GiB per rank for 6% of time). On the CPU a call's work
# dwarfs its fixed costs: 1. With max_layer_frames set (a setting for a low peak): 1.
AUTO_STEP_FRAMES = 2


AUTO_STEP_MAX_PIXELS = 1 << 18


AUTO_STEP_DEVICES: tuple[str, ...] = ("cuda",)


def frames_per_step(frame_pixels: int, device: torch.device) -> int:
    """Latent frames a causal video decoder takes per call after the first, in this request (1
    outside the fast tier): the setting where it is a number; for "auto", AUTO_STEP_FRAMES where
    `device`'s type is in AUTO_STEP_DEVICES, the output frames hold at most AUTO_STEP_MAX_PIXELS
    pixels (`frame_pixels`: on the rank that holds the most, so every rank of a sharded request
    decides alike) and max_layer_frames is None, else 1."""
    if not _fast.get():
        return 1
    setting = _frames_per_step.get()
    if setting != "auto":
        return setting
    small = device.type in AUTO_STEP_DEVICES and frame_pixels <= AUTO_STEP_MAX_PIXELS
    return AUTO_STEP_FRAMES if small and _max_layer_frames.get() is None else 1


def max_layer_frames() -> int | None:
    """The most frames a causal layer of a video decoder takes at once in this request (None: all it
    is given; always None outside the fast tier)."""
    return _max_layer_frames.get() if _fast.get() else None


# Fast tier, max_layer_frames None (the default): where a rank's frames hold at least
# PARTS_FROM_PIXELS pixels (a 512 x 512 frame; sharded, the largest rank's frames and at least
# SHARDED_PARTS_FROM_PIXELS), a causal video decoder's upsamplers, and its residual blocks whose
# causal convolutions read their caches where they lie (box_conv's kernel), run on parts of
# PART_FRAMES frames (None: never by default). One part's activations are alive at a time where
# they are largest; such a block's part buffer of two frames becomes its convolution's next cache,
# so the parts copy no cache (`families/wan.py`, `_store_cache`); two such frames are still hundreds
# of the kernels' tiles. Sharded, a layer makes one halo exchange for all its parts, but the parts
# add launches, which a rank's host pays where its GPU work per frame is small: Wan 2.1 720p, a
# rank's share timed alone with its communication stood in (BENCHMARKS.md), rank 0 of 2 (460,800
# pixels a frame) ran at its GPU's pace, 0.605-0.607 s with the parts against 0.612-0.613 s without,
# and rank 1 of 3 (311,040 pixels, the largest rank's) at its host's, 0.440 / 0.615 s with them
# against 0.438 / 0.575 s without. SHARDED_PARTS_FROM_PIXELS lies between the two.
PARTS_FROM_PIXELS = 1 << 18


SHARDED_PARTS_FROM_PIXELS = 3 << 17


PART_FRAMES: int | None = 2


@contextlib.contextmanager
def frames_for_layer(frame_pixels: int, sharded: bool, suits=None):
    """Inside: `max_layer_frames()` for a layer (residual block, upsampler) that makes frames of
    `frame_pixels` pixels (`sharded`: on the rank that holds most, the same number on every rank):
    the request's setting where it has one; else, in the fast tier, PART_FRAMES where
    `frame_pixels` >= PARTS_FROM_PIXELS (and, `sharded`, >= SHARDED_PARTS_FROM_PIXELS) and `suits()`
    (the layer's: whether parts pay there, e.g. a residual block's convolutions read their caches
    where they lie, `causal_front`, and, sharded, the parts cost no halo exchanges of their own;
    asked last, None: yes); else None."""
    least = max(PARTS_FROM_PIXELS, SHARDED_PARTS_FROM_PIXELS) if sharded else PARTS_FROM_PIXELS
    if (not _fast.get() or _max_layer_frames.get() is not None or PART_FRAMES is None
            or frame_pixels < least or (suits is not None and not suits())):
        yield
        return
    token = _max_layer_frames.set(PART_FRAMES)
    try:
        yield
    finally:
        _max_layer_frames.reset(token)


def cuda_graphs() -> bool | str:
    """Whether a causal video decoder replays its steady calls as a CUDA graph in this request: True,
    False or "auto" (graphs.wanted decides from the frame size; False outside the fast tier)."""
    return _cuda_graphs.get() if _fast.get() else False


def keep_cuda_graphs() -> bool:
    """Whether a request that replays CUDA graphs keeps them for the next request of the same shapes
    (False outside the fast tier; graphs.KeptCalls)."""
    return _keep_cuda_graphs.get() if _fast.get() else False


def settings_signature() -> tuple:
    """This request's fast-tier settings, the module's thresholds that choose a decoder's path and
    PyTorch's switches that choose its kernels (cuDNN's benchmark mode, TF32): a kept CUDA graph
    serves only a request that would run the same kernels."""
    return (_fast.get(), _frames_per_step.get(), _max_layer_frames.get(), _triton_convs.get(),
            torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            PART_FRAMES, PARTS_FROM_PIXELS, SHARDED_PARTS_FROM_PIXELS, AUTO_STEP_FRAMES, AUTO_STEP_MAX_PIXELS,
            AUTO_STEP_DEVICES)


@contextlib.contextmanager
def tier(fast: bool, cudnn_benchmark: bool = True, frames_per_step: int | str = "auto",
         max_layer_frames: int | None = None, triton_convs: bool = True, cuda_graphs: bool | str = "auto",
         keep_cuda_graphs: bool = False):
    """Run a request in the fast tier (`fast=True`) or exactly as diffusers computes (`fast=False`).

    `cudnn_benchmark` (fast tier only): cuDNN's benchmark mode for the request, the caller's setting
    restored afterwards. The first convolution of each new shape then times cuDNN's algorithms once
    per process and later ones reuse the fastest. The exact tier leaves cuDNN as the caller set it.
    `frames_per_step`, `max_layer_frames` (fast tier only): see the functions of those names and
    VaeParallelConfig.
    `cuda_graphs`, `keep_cuda_graphs` (fast tier only): see the functions of those names and
    VaeParallelConfig.
    `triton_convs` (fast tier only): the convolutions `conv_kernel.plan` takes run as that module's
    Triton kernel instead of cuDNN (False: cuDNN everywhere).
    """
    token = _fast.set(fast)
    convs = _triton_convs.set(triton_convs)
    graphed = _cuda_graphs.set(cuda_graphs)
    kept = _keep_cuda_graphs.set(keep_cuda_graphs)
    steps = _frames_per_step.set(frames_per_step)
    parts = _max_layer_frames.set(max_layer_frames)
    benchmark = torch.backends.cudnn.benchmark
    if fast and cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark
        _keep_cuda_graphs.reset(kept)
        _cuda_graphs.reset(graphed)
        _max_layer_frames.reset(parts)
        _frames_per_step.reset(steps)
        _triton_convs.reset(convs)
        _fast.reset(token)


def channels_last_format(ndim: int):
    return torch.channels_last_3d if ndim == 5 else torch.channels_last


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=channels_last_format(x.ndim))


def conv_with_bias(conv, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *args,
                   add_to: torch.Tensor | None = None, norm: conv_kernel.NormEpilogue | None = None,
                   out: torch.Tensor | None = None, front: conv_kernel.Front | None = None) -> torch.Tensor:
    """`conv(x, weight, bias, *args)` (F.conv2d, F.conv3d; args: stride, padding, dilation, groups);
    with `add_to`, that result added to `add_to` in place and `add_to` returned (`add_to + conv(...)`,
    rounded after the bias and after the sum as PyTorch's separate adds round). With `norm` (and
    `out`, a tensor of the result's shape: the next convolution's input frames, say), `rms_norm` of
    that result as `norm` says, written into `out`, which is returned: by the Triton kernel as it
    stores (`conv_kernel.norms_in_epilogue`), so the convolution's output is never stored, else by
    `rms_norm` after the convolution.

    In the fast tier, a 3-D convolution `conv_kernel.plan` takes runs as the Triton kernel of
    `conv_kernel` (bias added before its single rounding; `add_to` added in its epilogue where
    `conv_kernel.adds_in_epilogue` and the tensor has the kernel's output layout, else by one pass
    after it). Otherwise on CUDA the bias is added afterwards by
    `add_bias_` (or with `add_to` by `add_bias_and_residual_`, one pass) instead of PyTorch's own
    bias pass: the same bits (PyTorch's cuDNN path adds the bias in a separate pass too, rounding
    once), in one vectorised pass over the channels-last output instead of PyTorch's broadcasting
    kernel (benchmarks/norm_kernel.py times both). Elsewhere the plain call (then `add_to.add_`).

    `front` (a causal 3-D convolution whose input `x` holds only its new frames, from `causal_front`): the
    time padding read from the cache where it lies (`conv_kernel.Front`), by box_conv's kernel,
    which must take the convolution (ValueError otherwise: the caller asked `causal_front` first)."""
    if norm is not None:
        if out is None or add_to is not None:
            raise ValueError("conv_with_bias: a norm needs `out` and takes no `add_to`")
        return _conv_then_norm(conv, x, weight, bias, args, norm, out, front)
    how = _kernel_plan(conv, x, weight, bias, args, front)
    if how is not None:
        into = add_to if add_to is not None and conv_kernel.adds_in_epilogue(how) and conv_kernel.takes_add_to(
            add_to, conv_kernel.out_shape(x, weight, args[1], front), x.dtype) else None
        y = conv_kernel.conv3d(x, weight, bias, args[1], how, conv_kernel.cached_weight_for(how, weight), into,
                               front=front)
        return y if into is not None or add_to is None else add_bias_and_residual_(y, None, add_to, True)
    if front is not None:
        raise ValueError("conv_with_bias: no kernel here reads a causal convolution's cache where it lies "
                         "(fast.causal_front)")
    if add_to is not None:
        fused = bias is not None and bias.dtype == x.dtype and fused_bias_add_available(x)
        y = conv(x, weight, None if fused else bias, *args)
        return add_bias_and_residual_(y, bias if fused else None, add_to, into_residual=True)
    if bias is None or bias.dtype != x.dtype or not fused_bias_add_available(x):  # (PyTorch's checks, errors)
        return conv(x, weight, bias, *args)
    return add_bias_(conv(x, weight, None, *args), bias)


def _kernel_plan(conv, x, weight, bias, args, front=None) -> conv_kernel.ConvPlan | None:
    """The Triton kernel's plan for `conv(x, weight, bias, *args)` (behind `front`) in this request,
    or None (not the fast tier, triton_convs off, a bias of another dtype, which PyTorch's own call
    rejects, or a convolution `conv_kernel.plan` leaves to cuDNN)."""
    if conv is F.conv3d and _kernels_on() and (bias is None or bias.dtype == x.dtype):
        return conv_kernel.plan(x, weight, *args, front=front)
    return None


def causal_front(like: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor | None) -> conv_kernel.Front | None:
    """A `conv_kernel.Front` of `cache` where, in this request, a causal 3x3x3 convolution with
    `weight` of new frames like `like` reads its time padding from its cache where it lies
    (`conv_kernel.reads_front`: box_conv's kernel runs it) instead of a copy in front of the frames;
    else None."""
    return conv_kernel.Front(cache) if _kernels_on() and conv_kernel.reads_front(like, weight, cache) else None


def _kernels_on() -> bool:
    """Whether this request may run the Triton convolution kernels: the fast tier, triton_convs."""
    return _fast.get() and _triton_convs.get()


def zero_columns(like: torch.Tensor, weight: torch.Tensor, width: int) -> bool:
    """Whether a 3x3x3 convolution's input buffer of `width` columns, in this request, holds the
    convolution's column padding as zero columns for the Triton kernel's wrapping tiles (fast tier,
    triton_convs, `conv_kernel.wants_zero_columns`)."""
    return _kernels_on() and conv_kernel.wants_zero_columns(like, weight, width)


def upsample_by_phases(x: torch.Tensor) -> bool:
    """Whether, in this request, the 3x3 convolution after a nearest 2x upsampling of `x`'s frames
    runs by phases from the source (upsample.py, `HaloConv2d.forward_by_phases`): the fast tier, on
    every device. (Wan 2.1 and 2.2 at 720p on an H200: 1.211 against 1.267 s for the Triton kernel that
    read the source for all nine taps, 3.090 against 3.339 s for the upsampled copy and cuDNN;
    BENCHMARKS.md.)"""
    return _fast.get()


def norm_in_epilogue(conv, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *args, front=None):
    """The Triton kernel's plan if `conv_with_bias(conv, x, weight, bias, *args, norm=..., out=...,
    front=front)` would compute the norm in the kernel's epilogue (given an `out` that
    `conv_kernel.takes_out`), else None."""
    how = _kernel_plan(conv, x, weight, bias, args, front)
    return how if how is not None and conv_kernel.norms_in_epilogue(how) else None


def _conv_then_norm(conv, x, weight, bias, args, norm: conv_kernel.NormEpilogue, out: torch.Tensor,
                    front=None) -> torch.Tensor:
    """conv_with_bias's `norm`: in the kernel's epilogue where it takes this convolution and `out`,
    else the convolution, then `rms_norm` into `out`."""
    how = norm_in_epilogue(conv, x, weight, bias, *args, front=front)
    if how is not None and conv_kernel.takes_out(out, conv_kernel.out_shape(x, weight, args[1], front), x.dtype):
        return conv_kernel.conv3d(x, weight, bias, args[1], how, conv_kernel.cached_weight_for(how, weight),
                                  norm=norm, out=out, front=front)
    y = conv_with_bias(conv, x, weight, bias, *args, front=front)
    return rms_norm(y, norm.gamma, norm.bias, norm.scale, norm.silu, norm.eps, norm.pre_bias, out=out)


def attention_kernel_available(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention` runs vaeshard's own attention for these tensors (`attention.available`)."""
    return attention_kernel.available(q, k, v)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v)`; in the fast tier, where `attention_kernel_available`,
    vaeshard's own (attention.py), within the tier's tolerances."""
    if enabled() and attention_kernel_available(q, k, v):
        return attention_kernel.attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)
