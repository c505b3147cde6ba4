"""The voxel addressing the fast tier's elementwise kernels share (norm.py, group_norm.py,
d2s_shortcut.py): a program's block of voxels of one sample, all channels, over a 3- to 5-D tensor of
any strides; a block of an upsampled map's voxels with each one's phase; and when index arithmetic
needs 64 bits."""

from __future__ import annotations

import torch

from .triton_support import tl, triton

if triton is not None:

    @triton.jit
    def voxel_block(S, C, D1, D2, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr):
        # This program's sample n, its BLOCK_S voxels split into (i0, i1, i2) over the spatial dims
        # (D0 x D1 x D2 = S), all channels, and the mask of the ones that exist.
        return voxel_block_at(tl.program_id(0), S, C, D1, D2, BLOCK_S, BLOCK_C, WIDE)

    @triton.jit
    def voxel_block_at(block, S, C, D1, D2, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr):
        # `voxel_block` for the program's `block`-th block of voxels. Index arithmetic in 64 bits only
        # where an element offset can pass 2**31 (WIDE); 32-bit division is cheaper. (the channel
        # index too: a channels-first map's channel stride times the channel passes 2**31)
        if WIDE:
            n = tl.program_id(1).to(tl.int64)
            offs_s = block.to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
            offs_c = tl.arange(0, BLOCK_C).to(tl.int64)
        else:
            n = tl.program_id(1)
            offs_s = block * BLOCK_S + tl.arange(0, BLOCK_S)
            offs_c = tl.arange(0, BLOCK_C)
        i2 = offs_s % D2
        i1 = (offs_s // D2) % D1
        i0 = offs_s // (D2 * D1)
        mask = (offs_s[:, None] < S) & (offs_c[None, :] < C)
        return n, offs_c, i0, i1, i2, mask

    @triton.jit
    def upsampled_block(V, C, H2, W2, FT: tl.constexpr, FS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        # This program's BLOCK_V voxels (64-bit offsets) of a map upsampled FT x FS x FS (V = T2 x H2 x
        # W2 voxels of sample program_id(2)) and BLOCK_C channels: (sample, channels, frame, row and
        # column of each voxel, its phase (i * FS + j) * FS + k in its source voxel, the mask of the ones
        # that exist).
        n = tl.program_id(2).to(tl.int64)
        v = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        w2 = v % W2
        h2 = (v // W2) % H2
        t2 = v // (W2 * H2)
        q = ((t2 % FT) * FS + h2 % FS) * FS + w2 % FS
        mask = (v < V)[:, None] & (c < C)[None, :]
        return n, c, t2, h2, w2, q, mask

    @triton.jit
    def offsets(n, offs_c, i0, i1, i2, sn, sc, s0, s1, s2):
        return n * sn + (i0 * s0 + i1 * s1 + i2 * s2)[:, None] + offs_c[None, :] * sc


def wide(*tensors: torch.Tensor) -> bool:
    """Whether the kernels' index arithmetic needs 64 bits: an element offset of one of the tensors,
    or of a tile's masked overrun past its last voxel, can reach 2**31."""
    return any(t.numel() + sum(d * abs(st) for d, st in zip(t.shape, t.stride())) >= 2**31 for t in tensors)


def spatial_strides(x: torch.Tensor):
    """(N, C, (D0, D1, D2), (stride n, stride c, strides of D0, D1, D2)) of a 3- to 5-D tensor."""
    if not 3 <= x.ndim <= 5:
        return None
    pad = 5 - x.ndim  # missing leading spatial dims: extent 1, stride 0
    dims = (1,) * pad + tuple(x.shape[2:])
    strides = (0,) * pad + tuple(x.stride()[2:])
    return x.shape[0], x.shape[1], dims, (x.stride(0), x.stride(1), *strides)
