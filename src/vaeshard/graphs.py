"""The steady-state step of a chunked video decode, kept as a CUDA graph between requests (opt-in).

A causal video decoder (Wan) runs once per latent frame (or `frames_per_step` frames). After the
first calls every call has the same shapes and runs the same kernels; only the Python that launches
them costs host time again, and on a sharded decode the host then paces the GPU (BENCHMARKS.md).
With `cuda_graphs=True` the fast tier records that steady step once per shape as a CUDA graph and
replays it: the whole step is launched at once.

A graph reads and writes the addresses it saw when it was recorded. The step reads a state list (the
decoder's feature cache) and updates it: the entries it updates in place keep their address, and the
entries it replaces by new tensors are copied back into the old ones at the end of the recorded step
(`restore_replaced`), so every replay reads what the previous one wrote. The graph owns those state
tensors ("static state"), its input and its output, and its private memory pool, and keeps them
between requests of the same shape: a request first runs its first calls eagerly, then hands its
feature cache over (copied into the static state) and replays the graph for its remaining full
steps. That memory stays allocated until `release(owner)` (vaeshard.parallelize and unparallelize
call it). Recording once per process avoids what a graph per request costs: the device
synchronization before the recording and the graph's teardown at the end of the request, which
measured slower than running eagerly (BENCHMARKS.md, "Tried and measured slower").

Results are the same bits as running the step eagerly: the same kernels run on the same values.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch


def capturable(x: torch.Tensor) -> bool:
    """Whether work on `x`'s device can be recorded as a CUDA graph."""
    return x.is_cuda


class StateChanged(RuntimeError):
    """A step replaced a state entry by one of another shape, layout or kind: it has no steady state
    a graph could replay."""


def _like(old, new) -> bool:
    return (
        isinstance(old, torch.Tensor)
        and isinstance(new, torch.Tensor)
        and (old.shape, old.dtype, old.device, old.stride()) == (new.shape, new.dtype, new.device, new.stride())
    )


def check_steady(state: list, before: list) -> None:
    """Raise StateChanged unless every entry of `state` that is not the entry it was (`before`) is a
    tensor like it (shape, dtype, device, strides), so it could be copied back into it."""
    if len(state) != len(before):
        raise StateChanged(f"the state went from {len(before)} to {len(state)} entries")
    for i, (old, new) in enumerate(zip(before, state)):
        if new is not old and not _like(old, new):
            raise StateChanged(f"state entry {i} changed from {_describe(old)} to {_describe(new)}")


def restore_replaced(state: list, before: list) -> None:
    """Copy every entry of `state` that is a new tensor into the tensor it replaced (`before`) and put
    the old tensor back, so the entries keep their storage from step to step."""
    check_steady(state, before)
    for i, (old, new) in enumerate(zip(before, state)):
        if new is not old:
            old.copy_(new)
            state[i] = old


class StepGraph:
    """One steady step, recorded (`record`) and then replayed (`replay`) with its static state.

    `_record(run)` and `_replay()` are the CUDA-specific parts (tests stand in for them on CPU):
    `run()` performs the step on the static input and returns its output.
    """

    def __init__(self):
        self.static_input: torch.Tensor | None = None
        self.static_state: list | None = None
        self.output: torch.Tensor | None = None
        self.graph = None

    @property
    def recorded(self) -> bool:
        return self.static_state is not None

    def record(self, step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, state: list) -> None:
        """Record `step` on a copy of `x` with `state` as it is now; its tensors become the static
        state. Nothing runs: call `replay` for this step's result."""
        for i, entry in enumerate(state):
            if entry is not None and not isinstance(entry, torch.Tensor):
                raise StateChanged(f"state entry {i} is {_describe(entry)}, not a tensor: no steady state yet")
        self.static_input = x.clone()
        before = list(state)

        def run():
            y = step(self.static_input)
            restore_replaced(state, before)
            return y

        self._record(run)
        self.static_state = list(state)

    def replay(self, x: torch.Tensor, state: list) -> torch.Tensor:
        """The step on `x`, reading and updating `state`: entries not yet the static ones are copied
        into them first (a new request's cache) and replaced by them. Returns the graph's output,
        overwritten by the next replay."""
        if len(state) != len(self.static_state):
            raise StateChanged(f"the state has {len(state)} entries, the recorded step {len(self.static_state)}")
        for i, (static, entry) in enumerate(zip(self.static_state, state)):
            if entry is static:
                continue
            if not _like(static, entry):
                raise StateChanged(f"state entry {i} is {_describe(entry)}, the recorded step's {_describe(static)}")
            static.copy_(entry)
            state[i] = static
        self.static_input.copy_(x)
        return self._replay()

    # -- CUDA ----------------------------------------------------------------------------------

    def _record(self, run: Callable[[], torch.Tensor]) -> None:
        # thread-local error mode: other threads of the process (NCCL's watchdog) keep working
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.output = run()
        self.graph = graph

    def _replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


# owner (a VAE module) -> {key: StepGraph or None (the step has no steady state: run eagerly)}
_graphs: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def step_graph(owner, key) -> StepGraph | None:
    """The StepGraph of `owner` for `key`, created (unrecorded) at first use; None where the step was
    found to have no steady state."""
    table = _graphs.setdefault(owner, {})
    if key not in table:
        table[key] = StepGraph()
    return table[key]


def give_up(owner, key) -> None:
    """Remember that `owner`'s step for `key` has no steady state (run it eagerly from now on)."""
    _graphs.setdefault(owner, {})[key] = None


def release(owner) -> int:
    """Drop every graph `owner` keeps (their static state, inputs, outputs and memory pools); returns
    how many were dropped. Call on every rank alike."""
    table = _graphs.pop(owner, None) or {}
    return sum(1 for g in table.values() if g is not None)


def held(owner) -> int:
    """How many recorded graphs `owner` keeps."""
    return sum(1 for g in (_graphs.get(owner) or {}).values() if g is not None and g.recorded)


def _describe(entry) -> str:
    if isinstance(entry, torch.Tensor):
        return f"a tensor {tuple(entry.shape)} {entry.dtype} strides {entry.stride()}"
    return repr(entry)


__all__ = ["StateChanged", "StepGraph", "capturable", "check_steady", "give_up", "held", "release",
           "restore_replaced", "step_graph"]
