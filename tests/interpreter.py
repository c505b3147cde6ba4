"""Running the fast tier's Triton kernels in Triton's CPU interpreter (how CI checks what they compute):
such a process as a background job of the suite (tests/background.py), and the settings a whole-model
decode there runs with.

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

import subprocess

from . import background

# the norm kernels' per-program tile for whole-model decodes in the interpreter (see above)
MODEL_NORM_TILE = {"elements": 1 << 15, "max_voxels": 1024, "num_warps": 2}


def script(name: str, text: str) -> str:
    """Register `python -c text` with TRITON_INTERPRET=1 (set before Triton is imported, as it must be)
    as the background job `name` (tests/background.py): started once the run is collected where a
    test marked `@pytest.mark.background(name)` reads it with `result`. Returns `name`."""
    return background.python(name, text, {"TRITON_INTERPRET": "1"})


def result(name: str, timeout: float) -> subprocess.CompletedProcess:
    """The finished interpreter script `name`, waiting at most `timeout` seconds from now."""
    return background.result(name, timeout)


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
