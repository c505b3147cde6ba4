"""Layer swapping: a leaf module's class replaced by a subclass that adds a mixin's behaviour.

The subclass keeps the module's parameters, buffers, names and state_dict (only `__class__`
changes), so checkpoints load with `strict=True` before and after; `unswap` restores the class.
"""

from __future__ import annotations

import torch.nn as nn

_SUBCLASS_CACHE: dict[tuple[type, type], type] = {}


def _halo_subclass(mixin: type, base: type) -> type:
    key = (mixin, base)
    if key not in _SUBCLASS_CACHE:
        _SUBCLASS_CACHE[key] = type(
            base.__name__, (mixin, base), {"__module__": base.__module__, "_vaeshard_base": base}
        )
    return _SUBCLASS_CACHE[key]


def swap(module: nn.Module, mixin: type) -> None:
    """Give `module` the halo-aware behaviour of `mixin`; parameters and names are untouched."""
    base = type(module)
    if getattr(base, "_vaeshard_base", None) is not None:
        return
    module.__class__ = _halo_subclass(mixin, base)


def unswap(module: nn.Module) -> None:
    base = getattr(type(module), "_vaeshard_base", None)
    if base is not None:
        module.__class__ = base


def is_swapped(module: nn.Module) -> bool:
    return getattr(type(module), "_vaeshard_base", None) is not None


def submodules(root: nn.Module):
    """`root` and every module inside it (a module held twice, twice): `root.modules()` without its
    names and its set of those seen, which cost a request more than a millisecond of a large VAE's."""
    stack = [root]
    while stack:
        module = stack.pop()
        yield module
        stack.extend(child for child in module._modules.values() if child is not None)


def replaced_forwards(vae: nn.Module) -> list[str]:
    """The names of the modules inside `vae` whose `forward` a hook has replaced on the instance
    (diffusers' layerwise casting and group offloading, accelerate's offloading hooks, a wrapper of
    one's own). Such a hook calls the forward it found when it was added, so a layer's halo
    behaviour, swapped in by class, may never run, and the fast tier's blocks, which call their
    layers' computations directly, would skip the hook (its casting, its weight loading). The VAE
    itself is not counted: vaeshard's decode and encode do not go through its forward."""
    if not any(m is not vae and "forward" in m.__dict__ for m in submodules(vae)):
        return []  # (every request asks: the names only where there are some)
    return [name for name, m in vae.named_modules() if m is not vae and "forward" in m.__dict__]
