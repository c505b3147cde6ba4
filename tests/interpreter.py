"""Running the fast tier's Triton kernels in Triton's CPU interpreter (how CI checks what they compute):
one way to start such a process, and the settings a whole-model decode there runs with.

The interpreter executes every program of a launch one after another, each operation through
Python, so a test's time is about (programs) x (operations per program). Two settings cut it for
the tests that decode a whole small model through the kernels (wiring, not arithmetic):

- `norm.TILE` with more voxels per program: the norm and bias kernels then take a small test frame
  in one program (a partial, masked block still), where the GPU's tile of 128 voxels would need
  dozens. The kernels' values at the GPU's tile are checked by the kernel-level scripts, which keep it.
- no int32 overflow sanitizing (`unsanitized()`, also in the convolution kernel's value script): the
  interpreter checks every integer add and multiply for int32 overflow, at about three extra
  operations each. An index overflows int32 only in tensors of 2**31 elements, which no CPU test
  builds; `_wide`, the choice of 64-bit indices there, is checked by tests/test_layers/test_fast.py on
  meta tensors.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the norm kernels' per-program tile for whole-model decodes in the interpreter (see above)
MODEL_NORM_TILE = {"elements": 1 << 15, "max_voxels": 1024, "num_warps": 2}


def run(script: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -c script` from the repository root with TRITON_INTERPRET=1 (set before Triton is
    imported, as it must be), bounded by `timeout` seconds."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


def run_together(scripts: dict[str, str], timeout: float) -> dict[str, subprocess.CompletedProcess]:
    """`run` of several scripts at once, each its own process (the interpreter runs one Python
    thread: two scripts use two cores), every one bounded by `timeout` seconds; by name."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        for name, script in scripts.items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def for_model_decodes() -> None:
    """The settings above, in a process that runs the interpreter (call before the first launch)."""
    from vaeshard.kernels import norm, triton_support

    assert triton_support.interpreting(), "for_model_decodes() outside Triton's interpreter"
    norm.TILE = dict(MODEL_NORM_TILE)
    unsanitized()


def unsanitized() -> None:
    """The interpreter without its int32 overflow checks (see above)."""
    from triton.runtime import interpreter

    interpreter.interpreter_builder.options = interpreter.InterpreterOptions(sanitize_overflow=False)
