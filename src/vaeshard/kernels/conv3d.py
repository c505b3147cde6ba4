"""The fast tier's own convolution kernel: a 3x3x3 convolution as one Triton implicit GEMM on CUDA.

cuDNN's kernels for Wan's 96-channel full-resolution convolutions tile the output channels by 64 (by
their names), so 96 channels take two tiles of which the second half idles, and each input tile is
read once per channel tile: they run well below its kernels for 192 and 384 channels
(docs/tuning.md, entry `kernels/conv3d.py TILES`). This kernel computes all output channels of a
tile of output voxels at once, with the input loaded by the GPU's tensor-memory accelerator (TMA)
straight from the channels-last buffer the fast tier builds: each of the 27 taps is a (voxels
x input channels) box of that buffer, shifted by the tap, and the zero padding of the unsharded axes
is the box's out-of-bounds fill, so nothing is padded or copied. For 3 x 2^k output channels (Wan's
96 and 192) a program keeps two accumulators, 2^(k+1) and 2^k channels wide, fed by the same input
box, so no column of the matrix multiply idles (Triton's tiles are powers of two); the 192-channel
half-resolution layers, too, run faster this way than on cuDNN.

It runs only where it measured faster than cuDNN (`plan`): CUDA, bf16/fp16, stride 1, 3x3x3, 96 or
192 output channels or a power of two up to 128, and a tile that does not straddle rows with
padding: either rows of a multiple of the tile's voxels (Wan 2.1 at 720p on one GPU, or sharded by
height), or a width-sharded buffer, whose halo columns make its rows contiguous so that a tile may
wrap from one row into the next (its outputs past a row's end are computed and not stored).
Elsewhere `plan` returns None and cuDNN runs. On Hopper GPUs, where box_conv's Gluon kernel runs
(the output channel counts of box_conv.PLANS: 96 and 192), `plan` hands the convolution to it
instead (a plan with `box`), for rows of any width.

Values: each output is the fp32 sum of all 27 x Cin products plus the bias, rounded once to the
output dtype (cuDNN rounds the sum, then PyTorch adds the bias and rounds again), in a different
order of summation than cuDNN's: within the fast tier's tolerances, not bit-identical, so the exact
tier never uses it. A residual block's second convolution adds its result to the block's residual
in place (`add_to`): the bias-added sum is rounded, then the residual added and rounded again, the
roundings of PyTorch's bias pass and residual add, and the separate pass over the convolution's
output that those adds took otherwise is gone. A residual block's first convolution computes the
block's second RMS norm + SiLU as it stores (`norm`, `NormEpilogue`: a program holds every output
channel of its voxels), from the output rounded as it would have been stored, with the norm kernel's
roundings (norm_math), into the second convolution's input buffer (`out`): that output is never
stored, and the norm's pass over it is gone. On CPU, tests run the kernel in Triton's interpreter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import box_conv, norm_math, weights
from .triton_support import frame_stride, launch, runs_on, tl, triton

if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor


class ConvPlan(NamedTuple):
    """How `conv3d` tiles one convolution: `wrap` = tiles run along the flattened (row, column) order
    of a buffer without padding columns; otherwise each tile lies within one row. `box`: the
    convolution runs as box_conv's Gluon kernel instead (its own tiling, box_conv.PLANS)."""

    wrap: bool
    block_m: int = 256  # output voxels per tile
    block_n: int = 128  # output channels per tile (the first block_n, with block_n2)
    block_k: int = 32  # input channels per step
    block_n2: int = 0  # a second channel tile after the first (96 = 64 + 32), in the same program
    stages: int = 4  # TMA loads in flight
    num_warps: int = 8
    box: bool = False


class Front(NamedTuple):
    """A causal 3x3x3 convolution's time padding read where it lies: the input holds only the new
    frames, and the two frames before each sample's first are the last frames of `cache` ((N, C, 1 or
    2, H, W) with the input's rows and columns, `takes_front`), zeros before them (`cache` None:
    zeros only), as if they had been copied in front of the input. Only box_conv's kernel takes one
    (`reads_front`), and then no causal cache is copied into the convolution's input buffer."""

    cache: torch.Tensor | None = None


class NormEpilogue(NamedTuple):
    """What `conv3d` computes from each output voxel before it stores it: Wan's RMS norm over the
    voxel's channels (+ SiLU), as kernels/norm.py's `rms_norm(y, gamma, bias, scale, silu, eps,
    pre_bias)` computes it from the convolution's rounded output `y` (norm_math's steps).
    `pre_bias`: a per-channel bias added to `y` first and rounded (a convolution's bias moved into
    the norm after it)."""

    gamma: torch.Tensor
    bias: torch.Tensor | float | None  # (diffusers' norms without a bias hold 0.0)
    scale: float
    silu: bool = True
    eps: float = 1e-12
    pre_bias: torch.Tensor | None = None


# The tiles, by output channels, that `benchmarks/conv_kernel.py --sweep` measured fastest on an
# H200 (docs/tuning.md, entry `kernels/conv3d.py TILES`): for up to 128 channels 256 voxels by one
# tile of the channels, 32 input channels per step, 4 steps in flight, 8 warps (`TILE`); for 3 x 2^k
# channels (Wan 2.1's 96 and 192) two tiles, 2^(k+1) and 2^k channels wide, in one program on the
# same input boxes, so no column idles: 96 = 64 + 32 on 256 voxels, 3 steps in flight; 192 = 128 + 64
# on 128 voxels (fewer accumulator registers), 64 input channels per step, 3 in flight. (Wan 2.2's
# 256 channels: one 256-wide tile barely beat cuDNN alone and its whole decode was no faster: left to
# cuDNN.)
TILE = ConvPlan(wrap=False)
TILES = {
    96: ConvPlan(wrap=False, block_n=64, block_n2=32, stages=3),
    192: ConvPlan(wrap=False, block_m=128, block_n=128, block_n2=64, block_k=64, stages=3),
}


def plan(
    x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups, front: Front | None = None
) -> ConvPlan | None:
    """The tiling `conv3d` would use for `F.conv3d(x, weight, None, stride, padding, dilation, groups)`,
    or None where cuDNN is used instead (this kernel was not measured faster there, or cannot run).
    With `front`, for that convolution of `x` behind its time padding (`Front`): box_conv's plan or
    None."""
    if not _runs(x, weight, 5):
        return None
    if (
        front is not None
        and front.cache is not None
        and not (takes_front(front.cache, x.dtype, x.device) and _front_fits(front.cache, x))
    ):
        return None
    cout, cin, kt, kh, kw = weight.shape
    if (kt, kh, kw) != (3, 3, 3) or groups != 1 or _triple(stride) != (1, 1, 1) or _triple(dilation) != (1, 1, 1):
        return None
    pt, ph, pw = _triple(padding)
    if pt != 0 or ph not in (0, 1) or pw not in (0, 1):
        return None
    tile = _tile_for(cout, TILES)
    box = box_conv.runs(x, weight)  # (its own channel counts: Wan's 96 and 192, and the 3 of its head)
    if x.shape[1] != cin or not (box or (tile is not None and cin % tile.block_k == 0)):
        return None
    if front is not None and not box:  # (only box_conv reads a Front)
        return None
    if not dense_channels_last(x):
        return None
    if x.shape[2] + (kt - 1) * (front is not None) < kt or x.shape[3] + 2 * ph < kh or x.shape[4] + 2 * pw < kw:
        return None
    if box:  # any rows: the box's zero fill is the padding
        return (tile or TILE)._replace(box=True)
    if pw == 0:  # no padding columns: a tile may run on into the next row
        return tile._replace(wrap=True)
    if x.shape[4] % tile.block_m == 0:  # whole tiles per row
        return tile
    return None


def reads_front(like: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor | None) -> bool:
    """Whether a causal 3x3x3 convolution with `weight` (stride 1, 2 frames of time padding) of new
    frames in a channels-last buffer of `like`'s dtype and device can read its time padding from
    `cache` (or zeros, None) where it lies (`Front`): box_conv's kernel runs it and takes the cache.
    Where it can, it does: the decode measured faster and its peak lower than with the cache copied
    in front of the frames (docs/tuning.md, entry `kernels/conv3d.py reads_front`)."""
    return (
        _runs(like, weight, 5)
        and tuple(weight.shape[2:]) == (3, 3, 3)
        and box_conv.runs(like, weight)
        and (cache is None or takes_front(cache, like.dtype, like.device))
    )


def takes_front(cache: torch.Tensor, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether box_conv's kernel can read a causal cache as it lies: 1 or 2 frames of `dtype` on
    `device`, channels-last with its samples' frames one after another, 16-byte aligned."""
    return (
        cache.dim() == 5
        and 1 <= cache.shape[2] <= 2
        and cache.dtype == dtype
        and cache.device == device
        and dense_channels_last(cache)
    )


def dense_channels_last(t: torch.Tensor) -> bool:
    """Whether a 5-D tensor is channels-last and dense (its samples' frames one after another), 16-byte
    aligned: the layout the kernels read through TMA descriptors, and the one they write."""
    return t.dim() == 5 and t.permute(0, 2, 3, 4, 1).is_contiguous() and t.data_ptr() % 16 == 0


def _front_fits(cache: torch.Tensor | None, x: torch.Tensor) -> bool:
    """Whether a cache's samples, channels, rows and columns are `x`'s."""
    return cache is None or (cache.shape[:2] == x.shape[:2] and cache.shape[3:] == x.shape[3:])


def wants_zero_columns(like: torch.Tensor, weight: torch.Tensor, width: int) -> bool:
    """Whether a buffer of `width` columns (channels-last, `like`'s dtype and device) for a 3x3x3
    convolution with `weight` (stride 1, zero padding of one column a side) should hold that padding
    as one zero column a side, so that `plan` takes it with the wrapping tiles (no padding columns
    for cuDNN: a tile may run on into the next row) where the row tiles do not fit its rows (`width`
    not a multiple of the tile's voxels: Wan 2.1 at 480p, 832 columns). With zero columns the wrapping
    tiles measured faster than cuDNN at 96 channels, and the 480p decode faster (docs/tuning.md, entry
    `kernels/conv3d.py wants_zero_columns`)."""
    if not _runs(like, weight, 5) or tuple(weight.shape[2:]) != (3, 3, 3) or box_conv.runs(like, weight):
        return False  # (box_conv's kernel takes any row width)
    tile = _tile_for(weight.shape[0], TILES)
    return tile is not None and weight.shape[1] % tile.block_k == 0 and width % tile.block_m != 0


def _runs(x: torch.Tensor, weight: torch.Tensor, dims: int) -> bool:
    """Whether the kernels can take `x` and `weight` (both `dims`-D) at all: CUDA (or Triton's
    interpreter), bf16 or fp16 both, no autograd."""
    return (
        runs_on(x)
        and x.dim() == dims
        and weight.dim() == dims
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and not x.requires_grad
    )


def _tile_for(cout: int, tiles: dict) -> ConvPlan | None:
    """The measured tile for `cout` output channels in `tiles`, else TILE where TMA's 16-byte aligned
    rows (8 channels) and one channel tile hold them, else None."""
    return tiles.get(cout) or (TILE if cout % 8 == 0 and cout <= TILE.block_n else None)


def conv3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding,
    how: ConvPlan,
    kernel_weight: torch.Tensor | None = None,
    add_to: torch.Tensor | None = None,
    norm: NormEpilogue | None = None,
    out: torch.Tensor | None = None,
    front: Front | None = None,
) -> torch.Tensor:
    """`F.conv3d(x, weight, bias, 1, padding)` for a plan from `plan`, as a new channels-last tensor,
    or written into `out` (a view of the output's shape and dtype, see `takes_out`), which is returned.

    With `add_to` (a channels-last tensor of the output's shape and dtype, see `takes_add_to`) the
    result is added to it in place instead, `add_to` returned: `add_to + F.conv3d(...)` rounded after
    the bias and after the sum, as PyTorch's bias pass followed by a residual add rounds.
    With `norm`, what is stored is that norm (+ SiLU) of the rounded result (`NormEpilogue`), as the
    norm would compute it after the convolution, without the convolution's output ever being stored.
    `kernel_weight`: the weight in the layout the plan's kernel reads, if the caller keeps it
    (`cached_weight_for(how, weight)`; box_conv's layout is the transpose of the Triton kernel's).
    `front`: the convolution of `x` behind its causal time padding (`Front`; a box_conv plan from
    `plan(..., front=front)`), as many output frames as `x` has."""
    n, c, tin, h, w = x.shape
    if front is not None and not (how.box and _front_fits(front.cache, x)):
        raise ValueError(
            "conv3d: a Front is read by box_conv's plans only, its cache of the input's samples, "
            "channels, rows and columns (plan(..., front=front))"
        )
    cout = weight.shape[0]
    if kernel_weight is not None:
        want = (cout, 27 * c) if how.box else (27 * c, cout)
        if tuple(kernel_weight.shape) != want:
            raise ValueError(
                f"conv3d: kernel_weight for this plan is {want} (cached_weight_for(how, weight)), got "
                f"{tuple(kernel_weight.shape)}"
            )
    _, ph, pw = _triple(padding)
    shape = out_shape(x, weight, padding, front)
    tout, ho, wo = shape[2:]
    if add_to is not None and (out is not None or norm is not None):
        raise ValueError("conv3d: add_to adds the convolution into itself; it takes no out and no norm")
    if add_to is not None:
        if not takes_add_to(add_to, shape, x.dtype):
            raise ValueError(
                f"conv3d: add_to must be a channels-last {tuple(shape)} {x.dtype} tensor, got "
                f"{tuple(add_to.shape)} {add_to.dtype} with strides {add_to.stride()}"
            )
        out = add_to
    elif out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    elif not takes_out(out, shape, x.dtype):
        raise ValueError(
            f"conv3d: out must be a {tuple(shape)} {x.dtype} view with the channels innermost, "
            f"16-byte aligned, frames evenly spaced; got {tuple(out.shape)} {out.dtype} with strides "
            f"{out.stride()}"
        )
    if out.numel() == 0:
        return out
    if norm is not None and not (norm.bias is None or isinstance(norm.bias, torch.Tensor) or norm.bias == 0):
        raise ValueError(f"conv3d: a norm's bias is a tensor or 0, got {norm.bias!r}")
    if how.box:
        norm = None if norm is None else norm._replace(bias=norm.bias if isinstance(norm.bias, torch.Tensor) else None)
        boxed = kernel_weight if kernel_weight is not None else box_conv.box_weight_of(weight)
        return box_conv.conv3d(
            x,
            weight,
            bias,
            (0, ph, pw),
            out,
            boxed,
            add_to is not None,
            norm,
            causal=front is not None,
            cache=None if front is None else front.cache,
        )
    wk = kernel_weight if kernel_weight is not None else gemm_weight_of(weight)
    bm, bn, bk = how.block_m, how.block_n, how.block_k
    xl = x.permute(0, 2, 3, 4, 1)  # (N, T, H, W, C): the channels-last memory in order
    if how.wrap:
        xd = TensorDescriptor(xl, [n * tin, h * w, c], [h * w * c, c, 1], [1, bm, bk])
        tiles = triton.cdiv(ho * w, bm)
    else:
        xd = TensorDescriptor(xl, [n * tin, h, w, c], [h * w * c, w * c, c, 1], [1, 1, bm, bk])
        tiles = ho * triton.cdiv(wo, bm)
    y = out.permute(0, 2, 3, 4, 1)
    # the output's frames, rows and columns may lie apart (a view into a larger buffer); samples and
    # frames are one axis of the store (`takes_out`: a single sample, or samples right after each other)
    sf, sr, sc = frame_stride(out), out.stride(3), out.stride(4)

    def boxes(width):  # the weight's and the output's descriptors for a channel tile of `width`
        return (
            TensorDescriptor(wk, [27 * c, cout], [cout, 1], [bk, width]),
            TensorDescriptor(y, [n * tout, ho, wo, cout], [sf, sr, sc, 1], [1, 1, bm, width]),
        )

    wd, yd = boxes(bn)
    wd2, yd2 = boxes(how.block_n2) if how.block_n2 else (wd, yd)
    unused = wk  # a pointer for the arguments a launch does not read
    g = norm if norm is not None else NormEpilogue(unused, None, 1.0)
    g = g._replace(bias=g.bias if isinstance(g.bias, torch.Tensor) else None)
    launch(
        _conv3x3x3_kernel,
        (n * tout * tiles,),
        xd,
        wd,
        yd,
        wd2,
        yd2,
        y,
        wk if bias is None else bias,
        tin,
        tout,
        h,
        w,
        ho,
        wo,
        ph,
        pw,
        tiles,
        sf,
        sr,
        sc,
        g.gamma,
        unused if g.bias is None else g.bias,
        unused if g.pre_bias is None else g.pre_bias,
        float(g.scale),
        float(g.eps),
        CIN=c,
        COUT=cout,
        BM=bm,
        BN=bn,
        BN2=how.block_n2,
        BK=bk,
        WRAP=how.wrap,
        HAS_BIAS=bias is not None,
        ADD=add_to is not None,
        NORM=norm is not None,
        NORM_BIAS=g.bias is not None,
        PRE_BIAS=g.pre_bias is not None,
        SILU=bool(g.silu),
        STAGES=how.stages,
        num_warps=how.num_warps,
    )
    return out


def out_shape(x: torch.Tensor, weight: torch.Tensor, padding, front: Front | None = None) -> tuple[int, ...]:
    """The shape of `conv3d(x, weight, ..., padding, ..., front=front)`'s result."""
    n, _, tin, h, w = x.shape
    _, ph, pw = _triple(padding)
    return (n, weight.shape[0], tin - 2 * (front is None), h + 2 * ph - 2, w + 2 * pw - 2)


def adds_in_epilogue(how: ConvPlan) -> bool:
    """Whether `conv3d` should take `add_to` for a plan (else its caller adds the residual in a pass
    after it): row tiles, and wrapping tiles of at most 128 voxels (192 channels). Against cuDNN plus
    that pass, every row tile measured faster with the add in its epilogue; the wrapping tiles, which
    load and store through pointers, did on 128 voxels but not on 256 (96 channels: twice the
    registers per thread in the epilogue), where the kernel without the residual, followed by the
    pass, is faster (docs/tuning.md, entry `kernels/conv3d.py adds_in_epilogue`)."""
    return not how.wrap or how.block_m <= 128


def takes_add_to(t: torch.Tensor, shape, dtype: torch.dtype) -> bool:
    """Whether `conv3d` can add its result to `t` in place: `shape` and `dtype`, channels-last,
    dense, 16-byte aligned (the layout of the outputs it makes; with one frame, any stride of the
    frame axis: `frame_stride`)."""
    return tuple(t.shape) == tuple(shape) and t.dtype == dtype and dense_channels_last(t)


def norms_in_epilogue(how: ConvPlan) -> bool:
    """Whether `conv3d` should take a `norm` for a plan (else its caller runs the norm kernel after
    it): every Triton plan, no box_conv plan. For the Triton kernel the norm in its epilogue measured
    faster than the kernel then the norm kernel at 96 channels, and at 192 no slower (its wrapping
    tiles' pointer stores spill registers), and the convolution's output is never allocated. In
    box_conv's epilogue the norm is faster alone, but the next convolution's input buffer must exist
    before the convolution runs: with buffers that hold the cached frames, two convolution inputs are
    then alive at once and the peak is higher; with buffers that hold only the new frames (`Front`)
    that costs no memory, but the decode measured slower. So box_conv leaves the norm to the norm
    kernel (docs/tuning.md, entry `kernels/conv3d.py norms_in_epilogue`)."""
    return not how.box


def takes_out(t: torch.Tensor, shape, dtype: torch.dtype) -> bool:
    """Whether `conv3d` can write its result into `t`: `shape` and `dtype`, the channels innermost
    and contiguous, 16-byte aligned rows, columns and frames, and a single sample or samples that
    follow each other's frames (the output's frames and samples are one axis of its store) - such
    as the new frames of a convolution's channels-last input buffer, between its halo rows."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.dim() != 5 or t.stride(1) != 1:
        return False
    size = t.element_size()
    if t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[2:]):
        return False
    return t.shape[0] == 1 or t.stride(0) == t.shape[2] * frame_stride(t)


def gemm_weight_of(weight: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin, 3, 3, 3) -> (27 * Cin, Cout): row (tap, input channel), taps in (t, h, w) order."""
    cout = weight.shape[0]
    taps = tuple(range(2, weight.dim()))
    return weight.detach().permute(*taps, 1, 0).reshape(-1, cout).contiguous()


def cached_gemm_weight(weight: torch.Tensor) -> torch.Tensor:
    """`gemm_weight_of(weight)`, kept on the weight tensor (kernels/weights.py)."""
    return weights.kept(weight, "gemm", gemm_weight_of)


def cached_box_weight(weight: torch.Tensor) -> torch.Tensor:
    """`box_conv.box_weight_of(weight)`, kept on the weight tensor (kernels/weights.py)."""
    return weights.kept(weight, "box", box_conv.box_weight_of)


def cached_weight_for(how: ConvPlan, weight: torch.Tensor) -> torch.Tensor:
    """The weight in the layout `conv3d` reads for the plan `how` (box_conv's or the Triton
    kernel's), kept on the weight tensor: the `kernel_weight` argument of `conv3d`."""
    return cached_box_weight(weight) if how.box else cached_gemm_weight(weight)


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


if triton is not None:

    @triton.jit
    def _conv3x3x3_kernel(
        xd,
        wd,
        yd,
        wd2,
        yd2,
        y_ptr,
        b_ptr,
        Tin,
        Tout,
        H,
        W,
        Ho,
        Wo,
        PH,
        PW,
        TILES,
        SF,
        SR,
        SC,
        g_ptr,
        nb_ptr,
        p_ptr,
        scale,
        eps,
        CIN: tl.constexpr,
        COUT: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BN2: tl.constexpr,
        BK: tl.constexpr,
        WRAP: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ADD: tl.constexpr,
        NORM: tl.constexpr,
        NORM_BIAS: tl.constexpr,
        PRE_BIAS: tl.constexpr,
        SILU: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        # One program: BM output voxels of one output frame, all COUT channels (BN, then BN2 more in
        # a second accumulator fed by the same input box). Input frame t + kt feeds output frame t
        # (the buffer holds the causal frames: no time padding).
        pid = tl.program_id(0)
        tile = pid % TILES
        nt = pid // TILES  # sample * Tout + output frame
        t_in = (nt // Tout) * Tin + nt % Tout
        if WRAP:  # BM voxels in (row, column) order from q0, rows of W input columns, no column padding
            q0 = tile * BM
        else:  # BM voxels of one row from w0
            h0 = tile // tl.cdiv(Wo, BM)
            w0 = (tile % tl.cdiv(Wo, BM)) * BM
        CH: tl.constexpr = CIN // BK
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN2 if BN2 > 0 else 16), dtype=tl.float32)
        for i in tl.range(0, 27 * CH, num_stages=STAGES):
            tap = i // CH
            c0 = (i % CH) * BK
            kt = tap // 9
            kh = (tap // 3) % 3
            kw = tap % 3
            if WRAP:  # rows above the first and below the last fall outside the box: zeros
                a = xd.load([t_in + kt, q0 + (kh - PH) * W + kw, c0]).reshape(BM, BK)
            else:  # padding rows and columns fall outside the box: zeros
                a = xd.load([t_in + kt, h0 + kh - PH, w0 + kw - PW, c0]).reshape(BM, BK)
            acc, acc2 = _dot_channel_tiles(a, wd, wd2, tap * CIN + c0, acc, acc2, BN, BN2)
        # (ADD: the output's old values added; each program reads and writes only its own tile)
        bias_on_store: tl.constexpr = HAS_BIAS and not NORM
        if NORM:  # every output channel of a voxel is in this program: normalise before storing
            dt = y_ptr.dtype.element_ty
            acc, offs_n = _with_bias(acc, b_ptr, 0, COUT, BN, HAS_BIAS)
            acc = acc.to(dt).to(tl.float32)  # the convolution's output as it would have been stored
            if PRE_BIAS:
                acc = norm_math.plus_bias(acc, p_ptr, offs_n, COUT, dt)
            squares = tl.sum(acc * acc, axis=1)
            if BN2 > 0:
                acc2, offs_n2 = _with_bias(acc2, b_ptr, BN, COUT, BN2, HAS_BIAS)
                acc2 = acc2.to(dt).to(tl.float32)
                if PRE_BIAS:
                    acc2 = norm_math.plus_bias(acc2, p_ptr, offs_n2, COUT, dt)
                squares += tl.sum(acc2 * acc2, axis=1)
            inv = norm_math.inverse_norm(squares, eps)
            acc = norm_math.normalized(acc, inv, g_ptr, nb_ptr, offs_n, COUT, scale, NORM_BIAS, SILU, dt)
            if BN2 > 0:
                acc2 = norm_math.normalized(acc2, inv, g_ptr, nb_ptr, offs_n2, COUT, scale, NORM_BIAS, SILU, dt)
        if WRAP:
            _store_wrapped(acc, y_ptr, b_ptr, q0, nt, W, Ho, Wo, SF, SR, SC, 0, COUT, BM, BN, bias_on_store, ADD)
            if BN2 > 0:
                _store_wrapped(acc2, y_ptr, b_ptr, q0, nt, W, Ho, Wo, SF, SR, SC, BN, COUT, BM, BN2, bias_on_store, ADD)
        else:
            _store_row(acc, yd, b_ptr, nt, h0, w0, 0, COUT, BM, BN, bias_on_store, ADD)
            if BN2 > 0:
                _store_row(acc2, yd2, b_ptr, nt, h0, w0, BN, COUT, BM, BN2, bias_on_store, ADD)

    @triton.jit
    def _dot_channel_tiles(a, wd, wd2, row, acc, acc2, BN: tl.constexpr, BN2: tl.constexpr):
        # one step of the K loop: the input box `a` times the weight rows from `row` for the first
        # channel tile, and for the second (BN2 > 0) from the same box
        acc = tl.dot(a, wd.load([row, 0]), acc)
        if BN2 > 0:
            acc2 = tl.dot(a, wd2.load([row, BN]), acc2)
        return acc, acc2

    @triton.jit
    def _with_bias(acc, b_ptr, n0, COUT, BN: tl.constexpr, HAS_BIAS: tl.constexpr):
        offs_n = n0 + tl.arange(0, BN)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < COUT, other=0.0).to(tl.float32)[None, :]
        return acc, offs_n

    @triton.jit
    def _plus(acc, old, dt):
        # (conv + bias) rounded to the dtype, plus the old value, rounded again: PyTorch's two adds
        return acc.to(dt).to(tl.float32) + old.to(tl.float32)

    @triton.jit
    def _store_row(
        acc,
        yd,
        b_ptr,
        nt,
        h0,
        w0,
        n0,
        COUT,
        BM: tl.constexpr,
        BN: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ADD: tl.constexpr,
    ):
        # the box store leaves out what lies past the row's end and the channels
        acc, offs_n = _with_bias(acc, b_ptr, n0, COUT, BN, HAS_BIAS)
        if ADD:
            acc = _plus(acc, yd.load([nt, h0, w0, n0]).reshape(BM, BN), yd.dtype)
        yd.store([nt, h0, w0, n0], acc.to(yd.dtype).reshape(1, 1, BM, BN))

    @triton.jit
    def _store_wrapped(
        acc,
        y_ptr,
        b_ptr,
        q0,
        nt,
        W,
        Ho,
        Wo,
        SF,
        SR,
        SC,
        n0,
        COUT,
        BM: tl.constexpr,
        BN: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ADD: tl.constexpr,
    ):
        # outputs in the last W - Wo columns of a row are not outputs: masked out
        acc, offs_n = _with_bias(acc, b_ptr, n0, COUT, BN, HAS_BIAS)
        q = q0 + tl.arange(0, BM)
        row = q // W
        col = q % W
        off = nt.to(tl.int64) * SF + row * SR + col * SC
        mask = (col < Wo)[:, None] & (row < Ho)[:, None] & (offs_n < COUT)[None, :]
        at = y_ptr + off[:, None] + offs_n[None, :]
        if ADD:
            acc = _plus(acc, tl.load(at, mask=mask, other=0.0), y_ptr.dtype.element_ty)
        tl.store(at, acc.to(y_ptr.dtype.element_ty), mask=mask)
