"""The fast tier's single-head attention: scores by a matrix product, softmax by a Triton kernel.

Wan's mid-block attention has one head of 384 channels (Qwen-Image's VAE the same), more than
PyTorch's flash and cuDNN attention kernels take (256 at most), so `F.scaled_dot_product_attention`
runs its memory-efficient kernel, far below the GPU's peak (docs/strategies.md, "The attention").
Here a block of query rows at a time: the scores Q Kt as one cuBLAS product with fp32 output, the
row softmax of the scaled scores in one Triton pass that writes the probabilities in the input
dtype over the scores' own memory, then their product with V written into the output: faster than
the memory-efficient kernel at Wan's shapes (docs/tuning.md, entry `kernels/attention.py
SCORES_BYTES`); the scores of one block live in a buffer of at most `SCORES_BYTES`.

Values: the scores are the fp32 sums of the products (cuBLAS), scaled by 1/sqrt(d) in fp32, the
softmax is computed in fp32 and rounded once to the dtype, and the product with V sums in fp32 and
rounds once: the steps of the memory-efficient kernel, in another order of summation (within the
fast tier's tolerances, not bit-identical). On CPU, Triton's interpreter runs the kernel (tests),
and the scores are an fp32 product of the upcast operands.
"""

from __future__ import annotations

import torch

from .triton_support import launch, runs_on, tl, triton

# the most bytes of fp32 scores one block of query rows holds (its probabilities are written over them)
SCORES_BYTES = 256 << 20
# row lengths up to this are read once; longer rows are read twice (running max and sum, then normalise)
ROW_BLOCK = 16384


def available(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention` takes these (batch, heads, tokens, channels) tensors: CUDA (or Triton's
    interpreter), bf16 or fp16 all, at least one key, no autograd."""
    return (
        runs_on(q)
        and q.dim() == 4
        and k.dim() == 4
        and v.dim() == 4
        and q.dtype in (torch.bfloat16, torch.float16)
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and k.shape[2] > 0
        and not (q.requires_grad or k.requires_grad or v.requires_grad)
    )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v)` (no mask, no dropout, the default scale) for
    (batch, heads, tokens, channels) tensors `available` takes, as a new contiguous tensor."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    rows = max(1, min(lq, SCORES_BYTES // (4 * lk)))
    scores = torch.empty((rows, lk), dtype=torch.float32, device=q.device)
    scale = d**-0.5
    for i in range(b):
        for j in range(h):
            kt = k[i, j].t()
            for r0 in range(0, lq, rows):
                n = min(rows, lq - r0)
                s = scores[:n]
                _scores(q[i, j, r0 : r0 + n], kt, s)
                p = softmax_(s, scale, q.dtype)
                torch.mm(p, v[i, j], out=out[i, j, r0 : r0 + n])
    return out


def _scores(q: torch.Tensor, kt: torch.Tensor, out: torch.Tensor) -> None:
    if q.is_cuda:
        torch.mm(q, kt, out_dtype=torch.float32, out=out)
    else:  # (CPU has no mixed-precision product: the same fp32 sums of the exact products)
        torch.mm(q.float(), kt.float(), out=out)


def softmax_(s: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scale * s) along the rows of the fp32 matrix `s` (contiguous rows), rounded to `dtype`
    and written over the first half of each row's bytes: returned as a view of `s`'s memory."""
    n, lk = s.shape
    p = s.view(dtype)[:, :lk]  # row i's probabilities over the first half of row i's scores
    single = lk <= ROW_BLOCK
    block = triton.next_power_of_2(lk) if single else ROW_BLOCK
    launch(
        _softmax_rows_kernel,
        (n,),
        s,
        p,
        lk,
        s.stride(0),
        p.stride(0),
        float(scale),
        BLOCK=block,
        SINGLE=single,
        BLOCKS=triton.cdiv(lk, block),
        num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4,
    )
    return p


if triton is not None:

    @triton.jit
    def _softmax_rows_kernel(
        s_ptr, p_ptr, L, stride_s, stride_p, scale, BLOCK: tl.constexpr, SINGLE: tl.constexpr, BLOCKS: tl.constexpr
    ):
        # one row per program; its probabilities overwrite its own scores' first bytes only after the
        # scores they cover have been read (by block, in order)
        row = tl.program_id(0).to(tl.int64)
        src = s_ptr + row * stride_s
        dst = p_ptr + row * stride_p
        offs = tl.arange(0, BLOCK)
        if SINGLE:
            x = tl.load(src + offs, mask=offs < L, other=-float("inf")) * scale
            e = tl.exp(x - tl.max(x, axis=0))
            tl.store(dst + offs, (e / tl.sum(e, axis=0)).to(p_ptr.dtype.element_ty), mask=offs < L)
        else:
            m = tl.full((BLOCK,), -float("inf"), tl.float32)
            total = tl.zeros((BLOCK,), tl.float32)
            for blk in range(BLOCKS):  # (a constant count: Triton's interpreter takes no run-time loop bound)
                start = blk * BLOCK
                x = tl.load(src + start + offs, mask=start + offs < L, other=-float("inf")) * scale
                new = tl.maximum(m, x)
                total = total * tl.exp(tl.where(new == -float("inf"), 0.0, m - new)) + tl.where(
                    x == -float("inf"), 0.0, tl.exp(x - new)
                )
                m = new
            top = tl.max(m, axis=0)
            total = tl.sum(total * tl.exp(tl.where(m == -float("inf"), -float("inf"), m - top)), axis=0)
            for blk in range(BLOCKS):
                start = blk * BLOCK
                x = tl.load(src + start + offs, mask=start + offs < L, other=-float("inf")) * scale
                p = tl.exp(x - top) / total
                tl.store(dst + start + offs, p.to(p_ptr.dtype.element_ty), mask=start + offs < L)
