"""Counting what a rank puts into the collectives and point-to-point operations of runtime/comm.py.

`counting()` tallies, while it is open in this process, the payload bytes and the number of
operations by kind of exchange; comm.py reports each operation through `note`, which costs one
global lookup when nothing is counting. The payload is the tensor this rank hands the operation
(for an all-gather its own slice, for a send what it sends, for a broadcast what the root sends;
a rank that only receives adds nothing), so the tally is the same on every backend: how many
bytes cross the links for it depends on the backend's algorithm (benchmarks/comm_model.py turns
payloads into link bytes).

Kinds: "halo" (neighbour rows of a sharded convolution), "all_reduce" (GroupNorm statistics,
linear attention's sums), "all_gather" (whole-map attention's keys and values, gathered tokens),
"assemble" (the finished slices of a sharded decode), "tile_gather" (tile mode's finished tiles),
"broadcast" (a result shared from rank 0) and "control" (the small integer collectives that
coordinate a request).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

KINDS = ("halo", "all_reduce", "all_gather", "assemble", "tile_gather", "broadcast", "control")


@dataclass
class Tally:
    """Payload bytes and operations per kind of exchange (KINDS), for one rank."""

    bytes: dict[str, int] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] = self.bytes.get(kind, 0) + nbytes
        self.messages[kind] = self.messages.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


_current: Tally | None = None


@contextlib.contextmanager
def counting():
    """Tally every exchange this process makes through runtime/comm.py while open; yields the Tally.
    Nested counts each see their own operations only (the outer one resumes after)."""
    global _current
    outer, _current = _current, Tally()
    try:
        yield _current
    finally:
        _current = outer


def note(kind: str, tensor: torch.Tensor) -> None:
    """Count one operation of `kind` whose payload from this rank is `tensor` (when counting)."""
    if _current is not None:
        _current.add(kind, tensor.numel() * tensor.element_size())


__all__ = ["KINDS", "Tally", "counting", "note"]
