"""The fast tier's own convolution kernel: a 3x3x3 convolution as one Triton implicit GEMM on CUDA.

cuDNN's kernels for Wan's 96-channel full-resolution convolutions tile the output channels by 64, so
96 channels take two tiles of which the second half idles, and each input tile is read once per
channel tile; about 400 TFLOP/s on an H200 where its 192- and 384-channel kernels reach 560-740
(BENCHMARKS.md, "The convolution kernel"). This kernel computes all output channels of a tile of 256
output voxels at once (one 128-wide tile: the idle quarter stays, the second read of the input goes),
with the input tiles loaded by the GPU's tensor-memory accelerator (TMA) straight from the
channels-last buffer the fast tier builds: each of the 27 taps is a (256 voxels x 32 channels) box of
that buffer, shifted by the tap, and the zero padding of the unsharded axes is the box's
out-of-bounds fill, so nothing is padded or copied.

It runs only where it measured faster than cuDNN (`plan`): CUDA, bf16/fp16, stride 1, 3x3x3, at most
128 output channels, and a tile that does not straddle rows with padding: either rows of a multiple of
256 voxels (Wan 2.1 at 720p on one GPU, or sharded by height), or a width-sharded buffer, whose
halo columns make its rows contiguous so that a tile may wrap from one row into the next (its outputs
past a row's end are computed and not stored). Elsewhere `plan` returns None and cuDNN runs.

Values: each output is the fp32 sum of all 27 x Cin products plus the bias, rounded once to the
output dtype (cuDNN rounds the sum, then PyTorch adds the bias and rounds again), in a different
order of summation than cuDNN's: within the fast tier's tolerances, not bit-identical, so the exact
tier never uses it. On CPU, tests run the kernel in Triton's interpreter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # pragma: no cover - depends on the installation
    triton = None


class ConvPlan(NamedTuple):
    """How `conv3d` tiles one convolution: `wrap` = tiles run along the flattened (row, column) order
    of a buffer without padding columns; otherwise each tile lies within one row."""

    wrap: bool
    block_m: int = 256  # output voxels per tile
    block_n: int = 128  # output channels per tile
    block_k: int = 32  # input channels per step
    stages: int = 4  # TMA loads in flight
    num_warps: int = 8


# 256 voxels x 128 channels x 32 input channels per step, 4 steps in flight, 8 warps: the fastest of the
# tiles `benchmarks/conv_kernel.py` times on an H200 for Wan 2.1's 96-channel shapes.
TILE = ConvPlan(wrap=False)


def plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups) -> ConvPlan | None:
    """The tiling `conv3d` would use for `F.conv3d(x, weight, None, stride, padding, dilation, groups)`,
    or None where cuDNN is used instead (this kernel was not measured faster there, or cannot run)."""
    if triton is None or not (x.is_cuda or _interpreting()) or x.dim() != 5 or weight.dim() != 5:
        return None
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype or x.requires_grad:
        return None
    cout, cin, kt, kh, kw = weight.shape
    if (kt, kh, kw) != (3, 3, 3) or groups != 1 or _triple(stride) != (1, 1, 1) or _triple(dilation) != (1, 1, 1):
        return None
    pt, ph, pw = _triple(padding)
    if pt != 0 or ph not in (0, 1) or pw not in (0, 1):
        return None
    # TMA: 16-byte aligned rows (8 channels), one 128-wide channel tile, 32 input channels per step
    if cout % 8 or cout > TILE.block_n or cin % TILE.block_k or x.shape[1] != cin:
        return None
    if not x.permute(0, 2, 3, 4, 1).is_contiguous() or x.data_ptr() % 16:
        return None
    if x.shape[2] < kt or x.shape[3] + 2 * ph < kh or x.shape[4] + 2 * pw < kw:
        return None
    if pw == 0:  # no padding columns: a tile may run on into the next row
        return TILE._replace(wrap=True)
    if x.shape[4] % TILE.block_m == 0:  # whole tiles per row
        return TILE
    return None


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding, how: ConvPlan,
           gemm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """`F.conv3d(x, weight, bias, 1, padding)` for a plan from `plan`, as a new channels-last tensor.
    `gemm_weight`: `gemm_weight(weight)` if the caller keeps it (see `cached_gemm_weight`)."""
    n, c, tin, h, w = x.shape
    cout = weight.shape[0]
    _, ph, pw = _triple(padding)
    tout, ho, wo = tin - 2, h + 2 * ph - 2, w + 2 * pw - 2
    out = torch.empty((n, cout, tout, ho, wo), dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    if out.numel() == 0:
        return out
    wk = gemm_weight if gemm_weight is not None else gemm_weight_of(weight)
    bm, bn, bk = how.block_m, how.block_n, how.block_k
    xl = x.permute(0, 2, 3, 4, 1)  # (N, T, H, W, C): the channels-last memory in order
    if how.wrap:
        xd = TensorDescriptor(xl, [n * tin, h * w, c], [h * w * c, c, 1], [1, bm, bk])
        tiles = triton.cdiv(ho * w, bm)
    else:
        xd = TensorDescriptor(xl, [n * tin, h, w, c], [h * w * c, w * c, c, 1], [1, 1, bm, bk])
        tiles = ho * triton.cdiv(wo, bm)
    wd = TensorDescriptor(wk, [27 * c, cout], [cout, 1], [bk, bn])
    y = out.permute(0, 2, 3, 4, 1)
    yd = TensorDescriptor(y, [n * tout, ho, wo, cout], [ho * wo * cout, wo * cout, cout, 1], [1, 1, bm, bn])
    _conv3x3x3_kernel[(n * tout * tiles,)](
        xd, wd, yd, y, wk if bias is None else bias, tin, tout, h, w, ho, wo, ph, pw, tiles,
        CIN=c, COUT=cout, BM=bm, BN=bn, BK=bk, WRAP=how.wrap, HAS_BIAS=bias is not None,
        STAGES=how.stages, num_warps=how.num_warps,
    )
    return out


def gemm_weight_of(weight: torch.Tensor) -> torch.Tensor:
    """(Cout, Cin, 3, 3, 3) -> (27 * Cin, Cout): row (tap, input channel), taps in (t, h, w) order."""
    cout, cin = weight.shape[:2]
    return weight.detach().permute(2, 3, 4, 1, 0).reshape(27 * cin, cout).contiguous()


_GEMM_WEIGHT = "_vaeshard_gemm_weight"


def cached_gemm_weight(weight: torch.Tensor) -> torch.Tensor:
    """`gemm_weight_of(weight)`, kept on the weight tensor and made again when the weight changes
    (in-place updates bump its version; a new tensor has no copy)."""
    key = (weight._version, weight.dtype, weight.device, weight.data_ptr())
    held = getattr(weight, _GEMM_WEIGHT, None)
    if held is None or held[0] != key:
        held = (key, gemm_weight_of(weight))
        setattr(weight, _GEMM_WEIGHT, held)
    return held[1]


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _conv3x3x3_kernel(
        xd, wd, yd, y_ptr, b_ptr, Tin, Tout, H, W, Ho, Wo, PH, PW, TILES,
        CIN: tl.constexpr, COUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        WRAP: tl.constexpr, HAS_BIAS: tl.constexpr, STAGES: tl.constexpr,
    ):
        # One program: BM output voxels of one output frame, all COUT channels. Input frame t + kt
        # feeds output frame t (the buffer holds the causal frames: no time padding).
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
            b = wd.load([tap * CIN + c0, 0])
            acc = tl.dot(a, b, acc)
        offs_n = tl.arange(0, BN)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < COUT, other=0.0).to(tl.float32)[None, :]
        out = acc.to(y_ptr.dtype.element_ty)
        if WRAP:  # outputs in the last W - Wo columns of a row are not outputs: masked out
            q = q0 + tl.arange(0, BM)
            row = q // W
            col = q % W
            off = (nt * Ho + row).to(tl.int64) * (Wo * COUT) + col * COUT
            mask = (col < Wo)[:, None] & (row < Ho)[:, None] & (offs_n < COUT)[None, :]
            tl.store(y_ptr + off[:, None] + offs_n[None, :], out, mask=mask)
        else:  # the box store leaves out what lies past the row's end and the channels
            yd.store([nt, h0, w0, 0], out.reshape(1, 1, BM, BN))
