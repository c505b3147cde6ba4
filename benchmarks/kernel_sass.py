#!/usr/bin/env python3
"""Machine instructions of the fast tier's Triton kernels, compiled for Hopper (sm_90) without a GPU.

    python3 benchmarks/kernel_sass.py                 # the norm kernel at Wan's three channel counts
    python3 benchmarks/kernel_sass.py --channels 96 --dump norm96.sass

Compiles kernels/norm.py's `_rms_norm_silu_kernel` (and the bias + residual kernel) with the tile it would
launch for each channel count, as Triton's launcher specialises a channels-last bf16 tensor (channel
stride 1; pointers, other strides and sizes divisible by 16), disassembles the cubin with the
`nvdisasm` Triton ships, and counts the instructions of one program. Both kernels have no loops, so
the count divided by the elements one thread handles is the instructions issued per element: where
that times the elements exceeds what the SMs issue in the time a copy takes, the kernel is bound by
its instructions, not by memory (benchmarks/norm_kernel.py times them).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

from vaeshard.kernels import norm as norm_kernels

ALIGNED = {
    "x_ptr",
    "y_ptr",
    "w_ptr",
    "b_ptr",
    "p_ptr",
    "h_ptr",
    "S",
    "C",
    "D1",
    "D2",
    "sxn",
    "sx0",
    "sx1",
    "sx2",
    "syn",
    "sy0",
    "sy1",
    "sy2",
    "shn",
    "sh0",
    "sh1",
    "sh2",
}
ONE = {"sxc": 1, "syc": 1, "shc": 1}  # channels-last: the channel stride is 1


def sass(kernel, constants: dict, num_warps: int) -> list[str]:
    names = kernel.arg_names
    # (constants a kernel does not have are left out: an older library's kernels have fewer)
    constants = {k: v for k, v in {**ONE, **constants}.items() if k in names}
    types = {
        n: "*bf16"
        if n.endswith("_ptr")
        else "fp32"
        if n in ("scale", "eps")
        else "constexpr"
        if n in constants
        else "i32"
        for n in names
    }
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ALIGNED and n not in constants}
    source = ASTSource(kernel, types, constexprs={(names.index(k),): v for k, v in constants.items()}, attrs=attrs)
    compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].strip() for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def opcode(line: str) -> str:
    return (line.split()[1] if line.startswith("@") else line.split()[0]).split(".")[0].rstrip(";")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", default="96,192,384", help="channel counts (default Wan's 96,192,384)")
    ap.add_argument("--dump", help="write the last kernel's instructions here")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; set to silence its notice
    warps = norm_kernels.TILE["num_warps"]
    print(f"{'kernel':34} {'C':>4} {'tile':>16} {'instr.':>7} {'per element':>11}  most frequent")
    for c in (int(v) for v in args.channels.split(",")):
        block_s, padded, _ = norm_kernels._tile(c)
        # (a library from before the channel blocks, commit 2de46c2 or older: one block of `padded`)
        blocks = getattr(norm_kernels, "_channel_blocks", None)
        block_c, chunks = blocks(c) if blocks else (padded, None)
        norm = dict(HAS_BIAS=False, PRE_BIAS=True, SILU=True, BLOCK_S=block_s, BLOCK_C=block_c, WIDE=False)
        launches = [
            (
                "rms_norm (+SiLU, conv bias first)",
                norm_kernels._rms_norm_silu_kernel,
                {**norm, "CHUNKS": chunks} if chunks else norm,
                f"{block_s}x{chunks or 1}x{block_c}",
            ),
            (
                "bias + residual",
                norm_kernels._bias_residual_kernel,
                dict(BLOCK_S=block_s, BLOCK_C=padded, INTO_H=True, RESIDUAL=True, WIDE=False),
                f"{block_s}x{padded}",
            ),
        ]
        for label, kernel, constants, tile in launches:
            lines = sass(kernel, constants, warps)
            per_thread = block_s * c / (32 * warps)  # real elements (channels < C masked) per thread
            ops = ", ".join(f"{op} {n}" for op, n in Counter(map(opcode, lines)).most_common(6))
            print(f"{label:34} {c:4} {tile:>16} {len(lines):7} {len(lines) / per_thread:11.1f}  {ops}")
            if args.dump:
                with open(args.dump, "w") as f:
                    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
