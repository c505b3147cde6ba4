"""The steady-state step of a chunked decode, captured once as a CUDA graph and replayed.

A Wan decode runs its decoder once per latent frame. After the first frames every step has the same
shapes and the same kernels; only the Python that launches them costs the host time again, about as
long as the GPU needs for a step once the work is split over two ranks, so the GPU waits for the
host. Replaying a captured step launches the whole step at once.

A graph reads and writes the addresses it saw when it was captured. A step reads a state list (the
decoder's feature cache) and stores new entries in it; entries the step updated in place keep their
address, and entries it replaced by new tensors are copied back into the old ones at the end of the
captured step (`restore_replaced`), so every replay reads what the previous one wrote. Inputs are
copied into the static input the graph was captured with; the output is the graph's own tensor,
overwritten by the next replay (copy it out first).

Results are the same bits as running the step eagerly: the same kernels run on the same values.
"""

from __future__ import annotations

from typing import Callable

import torch


def capturable(x: torch.Tensor) -> bool:
    """Whether work on `x`'s device can be captured as a CUDA graph."""
    return x.is_cuda


class StateChanged(RuntimeError):
    """A step replaced a state entry by one of another shape, layout or kind: it has no steady state
    a graph could replay."""


def check_steady(state: list, before: list) -> None:
    """Raise StateChanged unless every entry of `state` that is not the entry it was (`before`) is a
    tensor like it (shape, dtype, device, strides), so it could be copied back into it. Run on the
    eager step before a capture: a step that fails this has no steady state to replay."""
    if len(state) != len(before):
        raise StateChanged(f"the state went from {len(before)} to {len(state)} entries")
    for i, (old, new) in enumerate(zip(before, state)):
        if new is not old and not (
            isinstance(old, torch.Tensor)
            and isinstance(new, torch.Tensor)
            and (old.shape, old.dtype, old.device, old.stride()) == (new.shape, new.dtype, new.device, new.stride())
        ):
            raise StateChanged(f"state entry {i} changed from {_describe(old)} to {_describe(new)}")


def restore_replaced(state: list, before: list) -> None:
    """Copy every entry of `state` that is a new tensor into the tensor it replaced (`before`, the
    entries as they were before the step) and put the old tensor back, so the entries keep their
    storage from step to step."""
    check_steady(state, before)
    for i, (old, new) in enumerate(zip(before, state)):
        if new is not old:
            old.copy_(new)
            state[i] = old


class ReplayedStep:
    """`step(x)` captured once into a CUDA graph (`capture`), then replayed per call.

    `state` is the list the step reads and updates (see the module docstring). The first call
    captures and replays; later calls copy their input into the captured one and replay. Capture
    uses thread-local error mode, so other threads of the process (NCCL's watchdog polls its events)
    keep working during the capture.
    """

    def __init__(self, step: Callable[[torch.Tensor], torch.Tensor], state: list):
        self.step, self.state = step, state
        self.graph = None
        self.static_input = None
        self.output = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            self._capture(x)
        else:
            self.static_input.copy_(x)
        self.graph.replay()
        return self.output

    def _capture(self, x: torch.Tensor) -> None:
        self.static_input = x.clone()
        before = list(self.state)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.output = self.step(self.static_input)
            restore_replaced(self.state, before)
        self.graph = graph


def _describe(entry) -> str:
    if isinstance(entry, torch.Tensor):
        return f"a tensor {tuple(entry.shape)} {entry.dtype} strides {entry.stride()}"
    return repr(entry)


__all__ = ["ReplayedStep", "StateChanged", "capturable", "check_steady", "restore_replaced"]
