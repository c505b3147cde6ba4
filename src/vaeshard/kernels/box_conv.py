"""The fast tier's 3x3x3 convolution for Wan 2.1's 96- and 192-channel layers and its 96 -> 3 head on
Hopper GPUs: a Gluon kernel that reads each input box from L2 once for the three row taps.

The Triton kernel (conv3d.py) loads, for each of the 27 taps, its own box of the input, so at 96
channels every input voxel crosses from L2 to shared memory 27 times, and that traffic bounds it
(docs/strategies.md, "The convolution kernel"). Here a program computes a patch of R rows x CW
columns of one output frame with a tile of output channels (all 96, or all 192 on half the rows)
and, for each (time tap, column tap, channel step), loads one box of R + 2 rows x CW columns; the
three row taps multiply three views of that box, CW voxels apart, so the input crosses from L2 9
times (and the weights' boxes serve R x CW voxels at once). Output channels beyond one tile are
further programs' channel tiles of the same patch (timed by benchmarks/conv_kernel.py --box-sweep,
not in PLANS). Gluon, Triton's lower-level language, exposes what this needs: the shared memory,
the TMA copies and the warp-group multiplies. One producer warp issues the copies into STAGES
slots; the two consumer warp groups (the default partition) multiply and store; the programs stay
resident and walk the tiles, so the producer copies the next tile's boxes while a tile is stored.
With `tma_out` (PLANS' 96 and 192 channels) the consumers write the output patch into a
shared-memory staging buffer and TMA copies store it (a residual to add comes into that buffer the
same way, halfway through the tile), so they start the next tile's multiplies at once: stored from
registers, the patches keep them from multiplying part of the time. With `a_regs` (192 channels)
each view's input rows are loaded into registers once for both channel tiles; each load waits until
the last step's multiplies of that view are done (a multiply reads its registers while it runs).
Both measured faster where PLANS uses them, alone and in the decode (docs/tuning.md, entry
`kernels/box_conv.py PLANS`).

What it computes is what conv3d.conv3d computes for the same arguments, with the same epilogues:
the fp32 sum of the 27 x Cin products plus the bias, rounded once; with `add_to` the residual added
and rounded again; with `norm` the next RMS norm + SiLU computed as it stores (norm_math's steps,
shared with the Triton kernels). Only the order of the sum differs. (The decode asks for no norm
here: conv3d.norms_in_epilogue says why.) The padding of the unsharded axes is the TMA box's
out-of-bounds zero fill, so every buffer layout the fast tier makes (halo rows, halo or zero
columns, rows of any width) is taken as it is. With `causal` (a causal convolution's time padding,
conv3d.Front) the input holds only the new frames and the producer copies the boxes of the two
frames before a sample's first from the cache tensor, through descriptors of its own (frames the
cache lacks: a frame coordinate of -1, the zero fill), so no cache is copied in front of the
frames: the same sums as on the copied buffer. Alone that runs slower at the 96-channel
full-resolution shapes (reading through the second descriptors, not where the data lies); in the
decode the copies saved outweigh it (docs/tuning.md, entry `kernels/conv3d.py reads_front`).

Where it runs (`runs`): a CUDA device of compute capability 9.0 and a Triton whose Gluon takes the
shifted views (`available`: a view of a shared-memory slot that starts CW rows in is a slice of CW
rows reinterpreted as the longer view; Triton 3.6 compiles it, Triton 3.9's verifier rejects it,
and vaeshard then runs the Triton kernel, with one warning). Triton's interpreter cannot run Gluon:
on CPU the tests compile it for sm_90 and check where it is chosen; its values are checked on the
GPU (benchmarks/gpu_parity.py, benchmarks/conv_kernel.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import NamedTuple

import torch

from .box_gluon import gluon
from .triton_support import frame_stride, launch, triton

if gluon is not None:
    from .box_gluon import GluonDescriptor, box_conv_kernel, gl


class BoxPlan(NamedTuple):
    """The kernel's tiling: output patches of `rows` x `cols` voxels, a program's output channels as
    two tiles (`block_n` + `block_n2`; more output channels than that are several programs' channel
    tiles of the same patch), `block_k` input channels per step, `stages` slots of copies in
    flight, `num_warps` consumer warps, `producer_regs` registers per thread of the producer warp;
    `a_regs`: each view's input rows multiplied from registers (loaded once for both channel
    tiles); `tma_out`: the output patch staged in shared memory and stored by TMA copies (a norm
    epilogue stores from registers regardless)."""

    rows: int = 16
    cols: int = 16
    block_n: int = 64
    block_n2: int = 32
    block_k: int = 32
    stages: int = 4
    num_warps: int = 8
    producer_regs: int = 40
    a_regs: bool = False
    tma_out: bool = False


# The tilings measured fastest on an H200, by output channels (docs/tuning.md, entry
# `kernels/box_conv.py PLANS`). 96 (Wan 2.1's full-resolution layers): 16 x 16 voxels, TMA stores, 3
# slots (the staging buffers, 16 x 16 voxels of 96 channels, leave no room for 4). 192 (its
# half-resolution layers): 8 x 16 voxels with all 192 channels, TMA stores and the rows in
# registers, 3 slots. Not here: 384 channels and Wan 2.2's 256, where it did not beat cuDNN
# (benchmarks/conv_kernel.py --box-sweep, where other tilings are measured before a count joins
# PLANS). 3 (the head's 96 -> 3 convolution, on cuDNN's Ampere-generation kernel otherwise): one
# accumulator of 16 channels, 13 of them the weights' zero fill, not stored.
PLAN = BoxPlan(stages=3, tma_out=True)
PLANS = {
    96: PLAN,
    192: BoxPlan(rows=8, block_n=128, block_n2=64, stages=3, tma_out=True, a_regs=True),
    3: BoxPlan(block_n=16, block_n2=0),
}


def available() -> bool:
    """Whether this Triton's Gluon compiles the kernel (for sm_90; no GPU needed): Gluon present and
    its verifier taking the kernel's shifted views. Checked once per process, with a warning where
    Gluon is present and the kernel does not compile."""
    return _compiles()


# Whether the fast tier's route hands convolutions to this kernel. Off: with another process
# decoding on the same GPU, decodes through it gave non-finite values in a stretch of frames (8 of 12
# decodes of Wan 2.1 480p, H100, Triton 3.6), the same decodes with the Triton kernel none (0 of 12);
# alone it gave none (docs/tuning.md, entry `kernels/box_conv.py ROUTED`). The kernel stays for its
# benchmark (benchmarks/conv_kernel.py --box-sweep) and its tests until the race is found.
ROUTED = False


def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `conv3d` runs for this input and weight: `ROUTED`, output channels in PLANS (96, 192, 3),
    input channels a multiple of the channel step, bf16 or fp16, a CUDA device of compute capability 9.0,
    and `available()`."""
    how = PLANS.get(weight.shape[0])
    return (
        ROUTED
        and how is not None
        and weight.shape[1] % how.block_k == 0
        and x.dtype in (torch.bfloat16, torch.float16)
        and _on_hopper(x)
        and available()
    )


def _on_hopper(x: torch.Tensor) -> bool:
    """Whether `x` lives on a CUDA device of compute capability 9.0 (the warp-group multiplies)."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)


def box_weight_of(weight: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin, 3, 3, 3) -> (Cout, 27 * Cin): each output channel's row of (tap, input channel),
    taps in (t, h, w) order (the weight tiles' input channels innermost, as the multiplies read them)."""
    return weight.detach().permute(0, 2, 3, 4, 1).reshape(weight.shape[0], -1).contiguous()


@functools.cache
def out_layout(channels: int):
    """The shared-memory layout of the TMA boxes of an output patch of `channels` channels (4-D; boxes
    of at most 64 channels, 128 bytes, the widest swizzle)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * channels), element_bitwidth=16, rank=4)


@functools.cache
def descriptor_layouts(how: BoxPlan = PLAN):
    """The shared-memory layouts of the input boxes (4-D) and weight tiles (2-D): rows of block_k
    channels, swizzled by their width."""
    swizzle = 2 * how.block_k
    return (
        gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=4),
        gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2),
    )


def conv3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding,
    out: torch.Tensor,
    box_weight: torch.Tensor,
    add: bool = False,
    norm=None,
    how: BoxPlan | None = None,
    causal: bool = False,
    cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """conv3d.conv3d's computation for a convolution `runs` takes, into `out` (a view
    conv3d.takes_out accepts; with `add`, `out` holds the residual and the sum replaces it);
    `norm`: a conv3d.NormEpilogue with its bias a tensor or None. `box_weight`:
    `box_weight_of(weight)`. `how`: PLANS' tiling for the output channels unless given. Returns `out`.
    `causal`: `x` holds only new frames (as many as the output) and the two frames before each
    sample's first are `cache`'s last ((N, C, 1 or 2, H, W) of `x`'s rows and columns, channels-last:
    conv3d.takes_front), zeros before them or without a cache: the time padding is read where
    it lies, never copied in front of the frames."""
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    how = how if how is not None else PLANS[cout]
    per_tile = how.block_n + how.block_n2
    if (cout > per_tile and cout % per_tile) or (norm is not None and cout > per_tile):
        raise ValueError(
            f"box_conv.conv3d: {cout} output channels in tiles of {per_tile}"
            + (" with the norm in the epilogue (one tile holds every channel)" if norm is not None else "")
        )
    _, ph, pw = padding
    tout, ho, wo = out.shape[2:]
    r, cw, bk = how.rows, how.cols, how.block_k
    box_layout, _ = descriptor_layouts(how)
    tma_out = how.tma_out and norm is None
    xl = x.permute(0, 2, 3, 4, 1)  # (N, T, H, W, C): the channels-last memory in order
    shape, strides = [n * tin, h, w, c], [h * w * c, w * c, c, 1]
    xd = GluonDescriptor(xl, shape, strides, [1, r, cw, bk], box_layout)
    xd2 = GluonDescriptor(xl, shape, strides, [1, 2, cw, bk], box_layout)
    wd, wd2 = _weight_descriptors(box_weight, how)
    cd, cd2, tc = xd, xd2, 0  # (stand-ins for the cache; without one, a causal frame is the zero fill)
    if causal and cache is not None:
        tc = cache.shape[2]
        cl = cache.permute(0, 2, 3, 4, 1)
        cshape = [n * tc, h, w, c]
        cd, cd2 = (GluonDescriptor(cl, cshape, strides, [1, rows, cw, bk], box_layout) for rows in (r, 2))
    od, od2 = xd, xd2  # (stand-ins, not read, without TMA stores)
    if tma_out:  # the output as (N * T, H, W, C) (conv3d.takes_out: samples follow each other's frames)
        ol = out.permute(0, 2, 3, 4, 1)
        oshape, ostrides = [n * tout, ho, wo, cout], [frame_stride(out), out.stride(3), out.stride(4), 1]
        od, od2 = (
            GluonDescriptor(ol, oshape, ostrides, [1, r, cw, min(64, bn)], out_layout(bn))
            for bn in (how.block_n, how.block_n2 or how.block_n)
        )
    tiles_w = triton.cdiv(wo, cw)
    tiles = triton.cdiv(ho, r) * tiles_w
    total = n * tout * tiles * triton.cdiv(cout, per_tile)
    programs = min(total, _multiprocessors(x.device))
    unused = box_weight  # a pointer for the arguments a launch does not read
    gamma = unused if norm is None else norm.gamma
    norm_bias = None if norm is None else norm.bias
    pre_bias = None if norm is None else norm.pre_bias
    launch(
        box_conv_kernel,
        (programs,),
        xd,
        xd2,
        cd,
        cd2,
        wd,
        wd2,
        od,
        od2,
        out,
        unused if bias is None else bias,
        gamma,
        unused if norm_bias is None else norm_bias,
        unused if pre_bias is None else pre_bias,
        float(1.0 if norm is None else norm.scale),
        float(1e-12 if norm is None else norm.eps),
        tin,
        tout,
        tc,
        ho,
        wo,
        ph,
        pw,
        tiles_w,
        tiles,
        total,
        frame_stride(out),
        out.stride(3),
        out.stride(4),
        CIN=c,
        COUT=cout,
        R=r,
        CW=cw,
        BK=bk,
        BN=how.block_n,
        BN2=how.block_n2,
        HAS_BIAS=bias is not None,
        ADD=add,
        NORM=norm is not None,
        NORM_BIAS=norm_bias is not None,
        PRE_BIAS=pre_bias is not None,
        SILU=bool(norm is not None and norm.silu),
        STAGES=how.stages,
        PRODUCER_REGS=how.producer_regs,
        A_REGS=how.a_regs,
        TMA_OUT=tma_out,
        CAUSAL=causal,
        num_warps=how.num_warps,
    )
    return out


_WEIGHT_DESCRIPTORS = "_vaeshard_box_descriptors"


def _weight_descriptors(box_weight: torch.Tensor, how: BoxPlan):
    """The descriptors of the weight's two channel tiles for the plan `how`, made once per weight
    layout tensor (kept on it: conv3d.cached_box_weight keeps that tensor from call to call)
    instead of at every launch, which the host pays for at every convolution."""
    kept = box_weight.__dict__.setdefault(_WEIGHT_DESCRIPTORS, {})
    if how not in kept:
        cout, k = box_weight.shape
        _, w_layout = descriptor_layouts(how)
        kept[how] = tuple(
            GluonDescriptor(box_weight, [cout, k], [k, 1], [bn, how.block_k], w_layout)
            for bn in (how.block_n, how.block_n2 or how.block_n)
        )
    return kept[how]


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def compile_for_hopper(
    how: BoxPlan = PLAN,
    cin: int = 96,
    cout: int = 96,
    add: bool = False,
    norm: bool = False,
    bias: bool | None = None,
    causal: bool = False,
):
    """The kernel compiled for sm_90 without a GPU (Triton's own ptxas), for `available` and the tests;
    `bias`: whether it adds one (default: unless `norm`, whose pre-bias it then adds); `causal`: the
    time padding read from a cache (conv3d's `causal`)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    box_layout, w_layout = descriptor_layouts(how)
    r, cw, bk = how.rows, how.cols, how.block_k

    def desc(block, layout):
        return f"tensordesc<bf16[{', '.join(map(str, block))}],{layout!r}>"

    kernel = box_conv_kernel
    tma_out = how.tma_out and not norm
    bn2 = how.block_n2 or how.block_n
    constants = dict(
        CIN=cin,
        COUT=cout,
        R=r,
        CW=cw,
        BK=bk,
        BN=how.block_n,
        BN2=how.block_n2,
        TMA_OUT=tma_out,
        HAS_BIAS=not norm if bias is None else bias,
        ADD=add,
        NORM=norm,
        NORM_BIAS=False,
        PRE_BIAS=norm,
        SILU=True,
        STAGES=how.stages,
        PRODUCER_REGS=how.producer_regs,
        A_REGS=how.a_regs,
        CAUSAL=causal,
        num_warps=how.num_warps,
    )
    types = {
        "xd": desc([1, r, cw, bk], box_layout),
        "xd2": desc([1, 2, cw, bk], box_layout),
        "cd": desc([1, r, cw, bk], box_layout),
        "cd2": desc([1, 2, cw, bk], box_layout),
        "wd": desc([how.block_n, bk], w_layout),
        "wd2": desc([bn2, bk], w_layout),
        "od": desc([1, r, cw, min(64, how.block_n)], out_layout(how.block_n))
        if tma_out
        else desc([1, r, cw, bk], box_layout),
        "od2": desc([1, r, cw, min(64, bn2)], out_layout(bn2)) if tma_out else desc([1, 2, cw, bk], box_layout),
        "y_ptr": "*bf16",
        "b_ptr": "*bf16",
        "g_ptr": "*bf16",
        "nb_ptr": "*bf16",
        "p_ptr": "*bf16",
        "scale": "fp32",
        "eps": "fp32",
    }
    names = kernel.arg_names
    types = {a: types.get(a, "constexpr" if a in constants else "i32") for a in names}
    source = GluonASTSource(kernel, types, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": how.num_warps})


@functools.cache
def _compiles() -> bool:
    if gluon is None or triton is None:
        return False
    try:
        with _quiet_stderr():  # (the compiler's own diagnostics for the failure; the warning says it)
            compile_for_hopper()
    except Exception as err:  # noqa: BLE001 - any failure means: not with this Triton
        warnings.warn(
            f"vaeshard: the Gluon convolution kernel does not compile with Triton {triton.__version__} "
            f"({type(err).__name__}); the Triton kernel and cuDNN run Wan's 96- and 192-channel convolutions and its "
            "head instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


@contextlib.contextmanager
def _quiet_stderr():
    """The process's stderr (file descriptor 2, where MLIR prints) sent to the null device for a while."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
