"""triton_support.launch: a Triton kernel's compiled kernel kept per key of the arguments and launched
directly when the key was seen before. The key must tell apart every pair of calls that Triton would
compile apart (its specialization); a launch with a key seen before must hand the compiled kernel the
same arguments, in the kernel's parameter order, as the JIT function would. Here a stand-in for the
JIT function and its compiled kernel records the launches (the real ones run on the GPU:
benchmarks/gpu_parity.py and `benchmarks/kernel_costs.py launch`)."""

from __future__ import annotations

import pytest
import torch

from vaeshard.kernels import triton_support


class _Compiled:
    """What `JITFunction[grid](...)` returns: a compiled kernel, launched as `compiled[grid](*args)`."""

    packed_metadata = None

    def __init__(self, log):
        self.log = log

    def run(self, *args):  # (present on a real one: `launch` checks for it)
        raise AssertionError("launched through __getitem__ only")

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", grid, args))


class _Kernel:
    """A stand-in for a JIT function with parameters a, b, n, BLOCK."""

    arg_names = ["a", "b", "n", "BLOCK"]

    def __init__(self):
        self.log = []
        self.compiles = 0

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.compiles += 1
            self.log.append(("jit", grid, args, kwargs))
            return _Compiled(self.log)

        return jit


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_support, "interpreting", lambda: False)
    return _Kernel()


def test_a_key_seen_before_launches_the_compiled_kernel_with_every_parameter_in_order(kernel):
    a, b = torch.zeros(64), torch.ones(64)
    triton_support.launch(kernel, (4,), a, b, 32, BLOCK=16, num_warps=2)
    triton_support.launch(kernel, (4, 2), a, b, 32, BLOCK=16, num_warps=2)
    assert kernel.compiles == 1
    assert kernel.log[0] == ("jit", (4,), (a, b, 32), {"BLOCK": 16, "num_warps": 2})
    kind, grid, args = kernel.log[1]
    assert (kind, grid) == ("direct", (4, 2, 1))  # the grid padded to three axes
    assert args[0] is a and args[1] is b and args[2:] == (32, 16)  # the constexpr by name, launch options not


@pytest.mark.parametrize("change", ["n", "n=1", "alignment", "dtype", "constexpr", "option", "device"])
def test_calls_triton_would_compile_apart_get_keys_of_their_own(kernel, monkeypatch, change):
    a, b = torch.zeros(64), torch.ones(64)
    triton_support.launch(kernel, (4,), a, b, 32, BLOCK=16, num_warps=2)
    args, kwargs = [a, b, 32], {"BLOCK": 16, "num_warps": 2}
    if change == "n":  # another multiple of 16: Triton would not recompile, the key (by value) still differs
        args[2] = 48
    elif change == "n=1":  # Triton compiles a 1 in as a constant
        args[2] = 1
    elif change == "alignment":  # a pointer 4 bytes past a 16-byte boundary
        args[0] = a[1:]
    elif change == "dtype":
        args[1] = b.half()
    elif change == "constexpr":
        kwargs["BLOCK"] = 32
    elif change == "option":
        kwargs["num_warps"] = 4
    else:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    triton_support.launch(kernel, (4,), *args, **kwargs)
    assert kernel.compiles == 2 and kernel.log[1][0] == "jit", kernel.log


def test_arguments_it_cannot_classify_and_the_interpreter_launch_through_the_jit_function(kernel, monkeypatch):
    a = torch.zeros(64)
    for _ in range(2):
        triton_support.launch(kernel, (1,), a, object(), 32, BLOCK=16)
    assert kernel.compiles == 2
    monkeypatch.setattr(triton_support, "interpreting", lambda: True)
    for _ in range(2):
        triton_support.launch(kernel, (1,), a, a, 32, BLOCK=16)
    assert kernel.compiles == 4
