"""The fast tier's ViT block kernels (kernels/token_block.py) compile for the GPUs they run on (sm_90:
H100, H200), with Triton's own ptxas and no GPU, at MiniMax-H3's real widths and in the dtypes a bf16
checkpoint as diffusers loads it hands them. What they compute is checked in Triton's interpreter
against diffusers' decode (tests/test_families/test_minimax_h3.py, the fused token blocks)."""

from __future__ import annotations

import pytest


def _compile(kernel, types: dict, constants: dict, num_warps: int) -> bytes:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    names = kernel.arg_names
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
    source = ASTSource(kernel, signature, constexprs={(names.index(c),): v for c, v in constants.items()})
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["cubin"]


@pytest.mark.parametrize("stream", ["*bf16", "*fp32"])
@pytest.mark.parametrize("delta", [True, False])
def test_residual_rms_compiles_for_hopper(stream, delta):
    pytest.importorskip("triton")
    from vaeshard.kernels import token_block

    types = {"h_ptr": stream, "d_ptr": "*bf16", "s_ptr": "*fp32", "w_ptr": "*fp32", "h_out_ptr": "*fp32"}
    types.update({"y_ptr": "*bf16", "eps": "fp32", "rows": "i32"})
    constants = dict(N=2048, BLOCK_R=token_block.ROWS, DELTA=delta, ROUND=False)
    assert len(_compile(token_block._residual_rms_kernel, types, constants, 8)) > 0
    types["h_out_ptr"] = "*bf16"  # a bf16 stream (a model cast whole): the update rounded as diffusers'
    constants["ROUND"] = delta
    assert len(_compile(token_block._residual_rms_kernel, types, constants, 8)) > 0


def test_qk_norm_rope_and_swiglu_compile_for_hopper():
    pytest.importorskip("triton")
    from vaeshard.kernels import token_block

    types = {"x_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "y_ptr": "*bf16", "eps": "fp32"}
    for t in ("i32", "i64"):  # token counts and strides past 2**31 pass as 64-bit
        types.update({"tokens": t, "L": "i32", "scn": t, "sct": "i32"})
        # MiniMax-H3: 32 heads of 64 channels, the first 48 rotated
        constants = dict(H=32, D=64, HALF=24, HB=32, PB=16, BLOCK_T=token_block.TOKENS)
        assert len(_compile(token_block._qk_norm_rope_kernel, types, constants, 4)) > 0
        swiglu = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n": t, "width": "i32"}
        assert len(_compile(token_block._swiglu_kernel, swiglu, dict(BLOCK=token_block.SWIGLU_BLOCK), 4)) > 0
