"""The fast tier's single-head attention (attention.py): its values against PyTorch's fp32 attention,
run by Triton's CPU interpreter; when the fast tier takes it; that its kernel compiles for Hopper."""

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F

from vaeshard.kernels import attention
from vaeshard.layers import tier

from .. import interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VALUES = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from vaeshard.kernels import attention

    torch.manual_seed(0)
    seen = []
    kernel = attention._softmax_rows_kernel
    class Spy:  # which softmax path ran (one pass over a row, or two)
        def __getitem__(self, grid):
            def launch(*a, **k):
                seen.append(k["SINGLE"])
                return kernel[grid](*a, **k)
            return launch
    attention._softmax_rows_kernel = Spy()
    # (batch, query tokens, key tokens, channels, row block, scores bytes): one block of queries, rows
    # read once; rows longer than the row block (read twice, the last block partial); blocks of 7
    # and of 1 query rows (the scores buffer's limit), the last block shorter
    cases = [(2, 70, 90, 48, 16384, 256 << 20), (1, 33, 90, 48, 32, 256 << 20), (2, 70, 90, 16, 16384, 90 * 4 * 7),
             (1, 9, 40, 16, 16, 1)]
    for b, lq, lk, d, row_block, scores_bytes in cases:
        attention.ROW_BLOCK, attention.SCORES_BYTES = row_block, scores_bytes
        for dtype, ulp in ((torch.float16, 2.0 ** -10), (torch.bfloat16, 2.0 ** -7)):
            q = torch.randn(b, 1, lq, d).to(dtype)
            k = (3 * torch.randn(b, 1, lk, d)).to(dtype)  # scores of several units: a peaked softmax
            v = torch.randn(b, 1, lk, d).to(dtype)
            want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            got = attention.attention(q, k, v)
            assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
            # the probabilities rounded once (relative half an ulp each), the output rounded once:
            # within an ulp of the largest |v| plus an ulp of the value, at every output
            bound = ulp * (v.float().abs().amax(dim=2, keepdim=True) + want.abs()) + 1e-4
            err = (got.float() - want).abs()
            assert bool((err <= bound).all()), (b, lq, lk, d, row_block, scores_bytes, dtype, err.max().item())
    assert True in seen and False in seen, seen
    print("attention ok")
    """
)


VALUES_JOB = interpreter.script("attention-values", VALUES)


@pytest.mark.background(VALUES_JOB)
def test_attention_values_through_the_interpreter():
    pytest.importorskip("triton")
    run = interpreter.result(VALUES_JOB, timeout=240)
    assert run.returncode == 0 and "attention ok" in run.stdout, run.stdout + run.stderr


def test_fast_attention_is_pytorchs_outside_the_fast_tier_and_where_the_kernel_cannot_run(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "attention", lambda q, k, v: calls.append(q.shape) or "own")
    q = torch.randn(1, 1, 12, 8, dtype=torch.float16)
    k, v = torch.randn(1, 1, 10, 8, dtype=torch.float16), torch.randn(1, 1, 10, 8, dtype=torch.float16)
    monkeypatch.setattr(attention, "runs_on", lambda x: True)  # CPU tensors stand in for CUDA ones
    with tier.active(tier.FastPlan()):
        assert tier.attention(q, k, v) == "own"
        got = tier.attention(q.float(), k.float(), v.float())  # fp32: PyTorch's
        assert torch.equal(got, F.scaled_dot_product_attention(q.float(), k.float(), v.float()))
    with tier.active(None):  # the exact tier: PyTorch's, bit for bit
        assert torch.equal(tier.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
        empty = torch.empty(1, 1, 0, 8, dtype=torch.float16)  # no keys: PyTorch's, whatever it gives
        assert torch.equal(tier.attention(q, empty, empty), F.scaled_dot_product_attention(q, empty, empty))
    monkeypatch.setattr(attention, "runs_on", lambda x: False)  # CPU without the interpreter
    with tier.active(tier.FastPlan()):
        assert torch.equal(tier.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    assert len(calls) == 1


@pytest.mark.parametrize("block, single", [(16384, True), (16384, False), (1024, True)])
def test_softmax_kernel_compiles_for_hopper(block, single):
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    kernel = attention._softmax_rows_kernel
    constants = dict(BLOCK=block, SINGLE=single, BLOCKS=1 if single else 4)
    types = {"s_ptr": "*fp32", "p_ptr": "*bf16", "scale": "fp32"}
    names = kernel.arg_names
    types = {n: types.get(n, "constexpr" if n in constants else "i32") for n in names}
    source = ASTSource(kernel, types, constexprs={(names.index(c),): v for c, v in constants.items()})
    compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
    assert "ex2.approx" in compiled.asm["ptx"]  # (tl.exp)
