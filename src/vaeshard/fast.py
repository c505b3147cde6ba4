"""The fast tier: layer implementations that trade bit-identity for speed, within DESIGN.md tolerances.

A request runs in the fast tier unless the VAE was parallelized with `exact=True` (then every layer
runs diffusers' own computation, bit for bit). The tier is request-scoped (a ContextVar), so code
outside a vaeshard request always sees the original layers. What changes in the fast tier:

- RMS norm + SiLU of the residual blocks and the output head run as one pass (a Triton kernel on
  CUDA; eager PyTorch elsewhere) instead of diffusers' six passes (fp32 upcast, normalize,
  downcast, scale, shift, SiLU). The kernel rounds to the tensor dtype at the same steps as
  diffusers, so results track diffusers' own bf16 decode, not only the exact math.
- Spatial convolutions run channels-last (NDHWC / NHWC), so cuDNN needs no layout transposes of the
  activations, and cuDNN applies the spatial zero padding, so no padded copy of the input is made.
- cuDNN runs in benchmark mode unless parallelized with `cudnn_benchmark=False` (see `tier`): each
  convolution shape is timed once per process and its fastest algorithm reused, instead of cuDNN's
  heuristic pick.
- On CUDA, the 3x3x3 convolutions `conv_kernel.plan` takes (Wan 2.1's 96- and 192-channel layers
  where the buffer's rows suit its tiles) run as vaeshard's own Triton implicit GEMM, which adds the
  bias before its single rounding and, for a residual block's second convolution, the residual as
  it stores (rounded as PyTorch's bias pass and residual add round; `conv_with_bias`'s `add_to`);
  on Hopper GPUs the 96-channel ones, rows of any width, as box_conv's Gluon kernel, which reads
  each input box once for three taps (`triton_convs=False`: cuDNN everywhere).
- The single-head attention of Wan's (and Qwen-Image's) mid block runs as vaeshard's own on CUDA
  (`attention.py`: the scores by one fp32-output matrix product per block of queries, their softmax
  by a Triton kernel, then the product with V) instead of PyTorch's memory-efficient kernel, which
  is the one PyTorch has for its 384-channel head.
- The 3x3 convolution after a nearest 2x upsampling (Wan's upsamplers) is computed from the source
  frames by its four phases (upsample.py: one convolution of 2x2 taps into four times the output
  channels, then one pass that interleaves them and adds the bias), so the upsampled frames are
  never made and each output takes 16 products per input channel instead of 36; the phases'
  weights are sums of the 3x3 taps rounded to the weight's dtype (`upsample_by_phases`). Where it
  does not apply, the upsampling runs in the input dtype (exact: it only copies values) instead of
  fp32, written straight into the convolution's input buffer.
- A residual block's first convolution leaves out its bias and the fused norm after it adds the bias
  as it loads the values, rounding the sum to the tensor dtype as PyTorch's separate bias add does
  (on CUDA, PyTorch adds a cuDNN convolution's bias in a second pass), so one pass over the
  convolution's output is saved.
- Every other convolution the fast tier runs (shortcuts, the causal convolutions outside
  residual blocks) gets its bias from `add_bias_` on CUDA: the same single rounding as PyTorch's own
  bias pass, in one vectorised pass over the channels-last output instead of PyTorch's broadcasting
  kernel.
- Where box_conv runs a causal convolution (Wan 2.1's 96- and 192-channel layers and its head), it
  reads the two cached frames from the cache where it lies (`causal_front`, conv_kernel.Front), so
  that convolution's input buffer holds only the new frames. A causal VAE's head (its output norm
  and `conv_out`) is run as a residual block's convolutions are: the norm writes into the
  convolution's input buffer, whose new frames, sharded with their halo rows, become the next
  call's cache (families/wan.py, `FastCoderHead`).
  Causal convolutions without padding (1x1x1) read their input where it lies. Wan 2.2's up blocks
  add their duplicating shortcut read from their input as the upsampler's interleaving pass stores
  (on CUDA; through views of the input elsewhere: families/wan.py, `FastResidualUpBlock`). All of
  these give the same bits as the copies they replace.
- Causal video VAEs (Wan, Qwen-Image) decode through the family's own frame loop: the same decoder
  calls as diffusers by default, each call's output clamped into one preallocated output instead of
  a growing concatenation, and with `frames_per_step` > 1 several latent frames per call. With
  `max_layer_frames` set, their residual blocks, upsamplers and causal convolutions run on at most
  that many frames at once, the causal cache handed from part to part (less activation memory).
  Without it, the layers with the largest frames take parts of two (`frames_for_layer`): the
  upsamplers, and the residual blocks whose convolutions box_conv runs, whose part buffers then
  become their caches instead of being copied into them; sharded, such a layer makes one halo
  exchange for all its parts.
  Their residual blocks and upsamplers overwrite each causal cache in place once it has its steady
  shape, instead of making a new tensor per decoder call (the same values, less memory reserved).
  On CUDA their steady decoder calls (all but the first two and a shorter last one) are replayed
  as one CUDA graph per request where a rank's frames are small (`cuda_graphs="auto"`; True: always,
  False: never; graphs.py: the same kernels, one launch from the host instead of hundreds), and
  with `keep_cuda_graphs=True` kept for the next request of the same shapes, which then replays
  its first two calls too and captures nothing.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from . import attention as attention_kernel
from . import conv_kernel, norm_math
from .triton_support import launch, runs_on, tl, triton

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


# --- memory format ----------------------------------------------------------------------------------


def channels_last_format(ndim: int):
    return torch.channels_last_3d if ndim == 5 else torch.channels_last


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=channels_last_format(x.ndim))


# --- fused RMS norm (+ SiLU) ----------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _voxel_block(S, C, D1, D2, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr):
        # This program's sample n, its BLOCK_S voxels split into (i0, i1, i2) over the spatial dims
        # (D0 x D1 x D2 = S), all channels, and the mask of the ones that exist. Index arithmetic in
        # 64 bits only where an element offset can pass 2**31 (WIDE); 32-bit division is cheaper.
        if WIDE:
            n = tl.program_id(1).to(tl.int64)
            offs_s = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
        else:
            n = tl.program_id(1)
            offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        offs_c = tl.arange(0, BLOCK_C)
        i2 = offs_s % D2
        i1 = (offs_s // D2) % D1
        i0 = offs_s // (D2 * D1)
        mask = (offs_s[:, None] < S) & (offs_c[None, :] < C)
        return n, offs_c, i0, i1, i2, mask

    @triton.jit
    def _offsets(n, offs_c, i0, i1, i2, sn, sc, s0, s1, s2):
        return n * sn + (i0 * s0 + i1 * s1 + i2 * s2)[:, None] + offs_c[None, :] * sc

    @triton.jit
    def _rms_norm_silu_kernel(
        x_ptr, y_ptr, w_ptr, b_ptr, p_ptr, S, C, D1, D2,
        sxn, sxc, sx0, sx1, sx2, syn, syc, sy0, sy1, sy2, scale, eps,
        HAS_BIAS: tl.constexpr, PRE_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr, CHUNKS: tl.constexpr, WIDE: tl.constexpr,
    ):
        # One program: one sample n and BLOCK_S voxels, all C channels (_voxel_block), held as
        # CHUNKS blocks of BLOCK_C channels (1 to 3; C = CHUNKS * BLOCK_C, or C <= BLOCK_C with
        # CHUNKS == 1). Wan's channel counts are 3 x 2^k: three full blocks keep every lane busy
        # where one block of the next power of two would leave a quarter of them masked, and this
        # kernel is bound by its instruction count, not by memory (benchmarks/kernel_sass.py counts
        # them, benchmarks/norm_kernel.py times the kernel against a copy).
        # Every spatial dim has its own stride, so x and y may be any strided views (a slice of a
        # larger buffer, too). Channels-last tensors load contiguous channel rows, contiguous ones
        # contiguous voxel rows; both coalesce.
        # The arithmetic is norm_math's (diffusers' WanRMS_norm step by step, with its roundings).
        # PRE_BIAS: the preceding convolution's bias, added to x first and rounded to the dtype.
        dt = y_ptr.dtype.element_ty
        n, offs_c, i0, i1, i2, mask = _voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
        x_at = _offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2)
        y_at = _offsets(n, offs_c, i0, i1, i2, syn, syc, sy0, sy1, sy2)
        x0 = _norm_load(x_ptr, x_at, p_ptr, offs_c, mask, C, PRE_BIAS, dt)
        squares = tl.sum(x0 * x0, axis=1)
        if CHUNKS >= 2:
            x1 = _norm_load(x_ptr + BLOCK_C * sxc, x_at, p_ptr + BLOCK_C, offs_c, mask, C, PRE_BIAS, dt)
            squares += tl.sum(x1 * x1, axis=1)
        if CHUNKS >= 3:
            x2 = _norm_load(x_ptr + 2 * BLOCK_C * sxc, x_at, p_ptr + 2 * BLOCK_C, offs_c, mask, C, PRE_BIAS, dt)
            squares += tl.sum(x2 * x2, axis=1)
        inv = norm_math.inverse_norm(squares, eps)
        _norm_store(x0, inv, y_ptr, y_at, w_ptr, b_ptr, offs_c, mask, C, scale, HAS_BIAS, SILU, dt)
        if CHUNKS >= 2:
            _norm_store(x1, inv, y_ptr + BLOCK_C * syc, y_at, w_ptr + BLOCK_C, b_ptr + BLOCK_C, offs_c, mask, C, scale,
                        HAS_BIAS, SILU, dt)
        if CHUNKS >= 3:
            _norm_store(x2, inv, y_ptr + 2 * BLOCK_C * syc, y_at, w_ptr + 2 * BLOCK_C, b_ptr + 2 * BLOCK_C, offs_c,
                        mask, C, scale, HAS_BIAS, SILU, dt)

    @triton.jit
    def _norm_load(x_ptr, at, p_ptr, offs_c, mask, C, PRE_BIAS: tl.constexpr, dt):
        # one block of channels in fp32 (0 where masked), the convolution's bias added and rounded
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if PRE_BIAS:
            x = tl.where(mask, norm_math.plus_bias(x, p_ptr, offs_c, C, dt), 0.0)
        return x

    @triton.jit
    def _norm_store(x, inv, y_ptr, at, w_ptr, b_ptr, offs_c, mask, C, scale, HAS_BIAS: tl.constexpr,
                    SILU: tl.constexpr, dt):
        y = norm_math.normalized(x, inv, w_ptr, b_ptr, offs_c, C, scale, HAS_BIAS, SILU, dt)
        tl.store(y_ptr + at, y.to(dt), mask=mask)


if triton is not None:

    @triton.jit
    def _bias_residual_kernel(
        x_ptr, h_ptr, b_ptr, S, C, D1, D2, sxn, sxc, sx0, sx1, sx2, shn, shc, sh0, sh1, sh2,
        BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, INTO_H: tl.constexpr, RESIDUAL: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        # x <- (x + bias) + h in place (h <- it with INTO_H), rounding to the dtype after each add as
        # PyTorch's two separate adds do (a convolution's bias pass, then the residual add).
        # Without RESIDUAL: x <- x + bias (h is not read), as PyTorch's bias pass alone.
        dt = x_ptr.dtype.element_ty
        n, offs_c, i0, i1, i2, mask = _voxel_block(S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)
        x_at = _offsets(n, offs_c, i0, i1, i2, sxn, sxc, sx0, sx1, sx2)
        x = tl.load(x_ptr + x_at, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
        if RESIDUAL:
            x = (x + b[None, :]).to(dt).to(tl.float32)
            h_at = _offsets(n, offs_c, i0, i1, i2, shn, shc, sh0, sh1, sh2)
            h = tl.load(h_ptr + h_at, mask=mask, other=0.0).to(tl.float32)
            if INTO_H:
                tl.store(h_ptr + h_at, (x + h).to(dt), mask=mask)
            else:
                tl.store(x_ptr + x_at, (x + h).to(dt), mask=mask)
        else:
            tl.store(x_ptr + x_at, (x + b[None, :]).to(dt), mask=mask)


if triton is not None:

    @triton.jit
    def _add_duplicated_kernel(
        out_ptr, src_ptr, V, C, T2, H2, W2, son, sot, soh, sow, ssn, sst, ssh, ssw,
        FT: tl.constexpr, FS: tl.constexpr, PER: tl.constexpr, REPEATS: tl.constexpr, BLOCK_V: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # out[n, c, t * FT + i, h * FS + j, w * FS + k] += src[n, c * PER + q // REPEATS, t, h, w] with
        # q = (i * FS + j) * FS + k (PER * REPEATS = FT * FS * FS): a program takes BLOCK_V output voxels
        # (T2 x H2 x W2 of sample n = program_id(2)) and BLOCK_C channels, both tensors channels-last;
        # the sum in fp32, rounded once, as PyTorch's add
        dt = out_ptr.dtype.element_ty
        n = tl.program_id(2).to(tl.int64)
        v = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        w2 = v % W2
        h2 = (v // W2) % H2
        t2 = v // (W2 * H2)
        q = ((t2 % FT) * FS + h2 % FS) * FS + w2 % FS
        out_at = n * son + t2 * sot + h2 * soh + w2 * sow
        src_at = n * ssn + (t2 // FT) * sst + (h2 // FS) * ssh + (w2 // FS) * ssw + q // REPEATS
        mask = (v < V)[:, None] & (c < C)[None, :]
        o = tl.load(out_ptr + out_at[:, None] + c[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.load(src_ptr + src_at[:, None] + (c * PER)[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_at[:, None] + c[None, :], (o + x).to(dt), mask=mask)


def add_duplicated_(out: torch.Tensor, src: torch.Tensor, factor_t: int, factor_s: int, repeats: int) -> bool:
    """out[n, c, t * ft + i, h * fs + j, w * fs + k] += src[n, c * per + q // repeats, t, h, w] with
    q = (i * fs + j) * fs + k and per = ft * fs * fs / repeats (Wan 2.2's duplicating shortcut, see
    families/wan.py `_dup_up_views`), in place, by one Triton pass where it runs (CUDA or the
    interpreter; both tensors `conv_kernel.dense_channels_last`, of one dtype). Returns whether it ran (else the
    caller adds through views, with the same bits: one fp32 add rounded once)."""
    factor = factor_t * factor_s * factor_s
    if (not runs_on(out) or out.dtype != src.dtype or out.dim() != 5 or src.dim() != 5 or factor % repeats
            or out.numel() == 0 or not (conv_kernel.dense_channels_last(out) and conv_kernel.dense_channels_last(src))):
        return False
    n, c, t2, h2, w2 = out.shape
    block_c = min(128, triton.next_power_of_2(c))
    block_v = max(1, 4096 // block_c)
    grid = (triton.cdiv(t2 * h2 * w2, block_v), triton.cdiv(c, block_c), n)
    launch(_add_duplicated_kernel, grid,
        out, src, t2 * h2 * w2, c, t2, h2, w2, out.stride(0), out.stride(2), out.stride(3), out.stride(4),
        src.stride(0), src.stride(2), src.stride(3), src.stride(4), FT=factor_t, FS=factor_s, PER=factor // repeats,
        REPEATS=repeats, BLOCK_V=block_v, BLOCK_C=block_c, num_warps=4,
    )
    return True


def fused_bias_add_available(x: torch.Tensor) -> bool:
    """Whether `add_bias_and_residual_` and `add_bias_` run as one kernel for `x` (CUDA with Triton).
    Only there is it worth leaving a convolution's bias out: PyTorch adds it in a separate pass on
    CUDA anyway, while CPU convolutions fold it in (so leaving it out on CPU would cost a pass and
    change bits)."""
    return runs_on(x)


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


def add_bias_(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x <- x + bias in place (one value per channel), rounded once to x's dtype as PyTorch's add
    rounds; one Triton pass on CUDA. Returns `x`."""
    if not _bias_kernel_takes(x):
        return x.add_(_per_channel(bias, x))
    _bias_pass(x, bias, None, False)
    return x


def add_bias_and_residual_(
    x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, into_residual: bool = False
) -> torch.Tensor:
    """x <- (x + bias) + residual in place (bias: one value per channel), in one pass on CUDA.

    Rounds after each add exactly as `conv(...)` with its bias followed by `+ residual` does in
    PyTorch (whose cuDNN path adds a convolution's bias in a separate pass). Returns `x`; with
    `into_residual` the sum is written into `residual` instead (the same bits: addition commutes)
    and `residual` is returned, so the caller can drop `x`.
    """
    if bias is None or not _bias_kernel_takes(x) or residual.shape != x.shape or residual.dtype != x.dtype:
        if bias is not None:
            x.add_(_per_channel(bias, x))
        return residual.add_(x) if into_residual else x.add_(residual)
    _bias_pass(x, bias, residual, into_residual)
    return residual if into_residual else x


def _per_channel(bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return bias.reshape(1, -1, *([1] * (x.ndim - 2)))


def _bias_kernel_takes(x: torch.Tensor) -> bool:
    return fused_bias_add_available(x) and x.numel() > 0 and 3 <= x.ndim <= 5


def _bias_pass(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None, into_residual: bool) -> None:
    """One launch of `_bias_residual_kernel`: x + bias, plus `residual` where one is given."""
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = _spatial_strides(x)
    shn, shc, sh0, sh1, sh2 = _spatial_strides(residual)[3] if residual is not None else (sxn, sxc, sx0, sx1, sx2)
    s = d0 * d1 * d2
    block_s, block_c, options = _tile(c)
    launch(_bias_residual_kernel, (triton.cdiv(s, block_s), n),
        x, x if residual is None else residual, bias.reshape(-1), s, c, d1, d2, sxn, sxc, sx0, sx1, sx2,
        shn, shc, sh0, sh1, sh2, BLOCK_S=block_s, BLOCK_C=block_c, INTO_H=into_residual,
        RESIDUAL=residual is not None, WIDE=_wide(x) if residual is None else _wide(x, residual), **options,
    )


# The per-program tile of the two kernels above: all channels of up to `max_voxels` voxels, about
# `elements` elements (counting the channels padded to a power of two), run by `num_warps` warps.
# benchmarks/norm_kernel.py times the choices on a GPU (BENCHMARKS.md: this one was the fastest summed
# over the Wan 2.1 720p shapes on an H200, by 3% over 8192 / 128 / 4).
TILE = {"elements": 4096, "max_voxels": 128, "num_warps": 2}


def _tile(c: int):
    """(voxels per program, channel block, launch options) for `c` channels: one block of the next
    power of two (the bias + residual kernel)."""
    block_c = triton.next_power_of_2(c)
    block_s = max(1, min(TILE["max_voxels"], TILE["elements"] // block_c))
    return block_s, block_c, {"num_warps": TILE["num_warps"]}


def _channel_blocks(c: int) -> tuple[int, int]:
    """(channel block, blocks) covering `c` channels in the norm kernel: `c` itself if a power of two,
    three blocks of c/3 if that is one of at least 16 (Wan's 96, 192, 384), otherwise one masked
    block of the next power of two."""
    if c & (c - 1) == 0:
        return c, 1
    third = c // 3
    if c % 3 == 0 and third >= 16 and third & (third - 1) == 0:
        return third, 3
    return triton.next_power_of_2(c), 1


def _wide(*tensors: torch.Tensor) -> bool:
    """Whether the kernels' index arithmetic needs 64 bits: an element offset of one of the tensors,
    or of a tile's masked overrun past its last voxel, can reach 2**31."""
    return any(t.numel() + sum(d * abs(st) for d, st in zip(t.shape, t.stride())) >= 2**31 for t in tensors)


def _spatial_strides(x: torch.Tensor):
    """(N, C, (D0, D1, D2), (stride n, stride c, strides of D0, D1, D2)) of a 3- to 5-D tensor."""
    if not 3 <= x.ndim <= 5:
        return None
    pad = 5 - x.ndim  # missing leading spatial dims: extent 1, stride 0
    dims = (1,) * pad + tuple(x.shape[2:])
    strides = (0,) * pad + tuple(x.stride()[2:])
    return x.shape[0], x.shape[1], dims, (x.stride(0), x.stride(1), *strides)


def rms_norm(
    x: torch.Tensor, gamma: torch.Tensor, bias, scale: float, silu: bool, eps: float = 1e-12, pre_bias=None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """silu?(x / max(||x||_C, eps) * scale * gamma + bias) in one pass, rounded as diffusers rounds.

    `pre_bias` (one value per channel) is added to `x` first, as a convolution's bias would have been.
    The result goes to a new tensor in the input's memory format, or into `out` (same shape as `x`,
    any strides, e.g. the new-frames view of a convolution's input buffer; `x` itself works too, as
    each voxel's channels are read before they are written); the tensor written is returned.
    """
    use_triton = runs_on(x) and x.numel() > 0
    geometry = _spatial_strides(x) if use_triton else None
    if geometry is None:  # the same steps in eager PyTorch (CPU, or shapes the kernel does not take)
        if pre_bias is not None:
            x = x + pre_bias.reshape(1, -1, *([1] * (x.ndim - 2)))
        y = F.normalize(x.float(), dim=1, eps=eps).to(x.dtype) * scale * gamma + bias
        y = F.silu(y) if silu else y
        return out.copy_(y) if out is not None else y
    n, c, (d0, d1, d2), (sxn, sxc, sx0, sx1, sx2) = geometry
    y = out if out is not None else torch.empty_like(x)  # same memory format
    if y.shape != x.shape or y.dtype != x.dtype:
        raise ValueError(f"rms_norm: out must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(y.shape)}, {y.dtype}")
    _, _, _, (syn, syc, sy0, sy1, sy2) = _spatial_strides(y)
    s = d0 * d1 * d2
    block_s, _, options = _tile(c)
    block_c, chunks = _channel_blocks(c)
    has_bias = isinstance(bias, torch.Tensor)
    grid = (triton.cdiv(s, block_s), n)
    launch(_rms_norm_silu_kernel, grid,
        x, y, gamma.reshape(-1), bias.reshape(-1) if has_bias else gamma,
        pre_bias.reshape(-1) if pre_bias is not None else gamma, s, c, d1, d2,
        sxn, sxc, sx0, sx1, sx2, syn, syc, sy0, sy1, sy2,
        float(scale), float(eps), HAS_BIAS=has_bias, PRE_BIAS=pre_bias is not None, SILU=silu,
        BLOCK_S=block_s, BLOCK_C=block_c, CHUNKS=chunks, WIDE=_wide(x, y), **options,
    )
    return y


# --- swapped layers (mixins; see shard.swap) ----------------------------------------------------------


class FusedRMSNormSiLU:
    """Mixin for a Wan RMS norm that is always followed by SiLU (residual blocks, output head).

    Fast tier: norm and SiLU in one pass; the SiLU module after it (`PassThroughSiLU`) then passes
    its input on. Exact tier: diffusers' norm, and the SiLU module applies SiLU as usual.
    """

    def forward(self, x):
        if not _fast.get():
            return super().forward(x)
        conv = self.__dict__.get(_BIAS_FROM)
        pre_bias = conv.bias if conv is not None else None
        return rms_norm(x, self.gamma, self.bias, self.scale, silu=True, pre_bias=pre_bias)


# --- a convolution's bias moved into the norm after it ------------------------------------------------

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
        if not _fast.get():
            return super().forward(x)
        return x


class NearestUpsample:
    """Mixin for Wan's nearest-exact 2x upsample: in the input dtype and memory format in the fast tier.

    Nearest upsampling only copies values, so skipping diffusers' fp32 round trip is exact.
    """

    def forward(self, x):
        if not _fast.get():
            return super().forward(x)
        return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode)
