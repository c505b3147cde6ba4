"""What runtime/comm.py reads from a gloo process group's backend: its own timeout."""

from __future__ import annotations

import torch


def gloo_backend(group):
    """The gloo backend of `group`, or None (another backend, or a torch without this interface)."""
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (AttributeError, RuntimeError):
        return None
    return backend if hasattr(backend, "options") and hasattr(backend, "set_timeout") else None


def own_timeout(group) -> float | None:
    """The group's own timeout in seconds (gloo), or None where it cannot be read."""
    backend = gloo_backend(group)
    own = None if backend is None else getattr(backend.options, "_timeout", None)
    return None if own is None else own.total_seconds()
