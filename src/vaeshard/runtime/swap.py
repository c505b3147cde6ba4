"""Layer swapping: a leaf module's class replaced by a subclass that adds a mixin's behaviour.

The subclass keeps the module's parameters, buffers, names and state_dict (only `__class__`
changes), so checkpoints load with `strict=True` before and after; `unswap` restores the class.
Also the walks over a VAE's modules every request makes (`inventory`, `replaced_forwards`).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch.nn as nn
from torch.nn.modules.module import register_module_module_registration_hook

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


class Inventory(NamedTuple):
    """What every request asks of a VAE's modules: its weights' devices and dtypes, and whether a
    hook replaced the forward of a module inside it (replaced_forwards)."""

    devices: frozenset
    dtypes: frozenset
    hooked: bool


# A VAE's list of modules is kept until a module is assigned, added or replaced inside it
# (nn.Module.__setattr__, add_module, register_module: torch's global module registration hook, which
# looks the parent up among the modules of the VAEs listed) or the count of children seen in a walk
# changes (a deletion, or a child put straight into `_modules`). Registrations elsewhere (diffusers'
# blocks slice their ModuleLists in every forward, each slice a new ModuleList) leave it.
_hook_handle = None
# VAE -> (the modules inside it, without itself: a value holding its key would keep it alive; children)
_modules_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_vaes_holding: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> [weakref(VAE)]


def _registered(parent, name, value):
    for held in _vaes_holding.get(parent, ()):
        vae = held()
        if vae is not None:
            _modules_of.pop(vae, None)


def _module_list(vae: nn.Module) -> tuple[list[nn.Module], int]:
    global _hook_handle
    if _hook_handle is None:
        _hook_handle = register_module_module_registration_hook(_registered)
    modules = list(submodules(vae))
    mine = weakref.ref(vae)
    for module in modules:
        holders = _vaes_holding.setdefault(module, [])
        if not any(held() is vae for held in holders):
            holders.append(mine)
    inside = [m for m in modules[1:] if m is not vae]
    _modules_of[vae] = (inside, sum(len(m._modules) for m in modules))
    return _modules_of[vae]


def inventory(vae: nn.Module) -> Inventory:
    """One pass over `vae`'s modules for a request: the devices and dtypes of its parameters and
    whether any module inside it has its forward replaced. The list of modules is cached per VAE
    (a request of a large VAE walked it in about 0.4 ms of host time before its first kernel);
    the parameters and forwards are read again on every call, so a cast, a move or a hook added
    after the last request is seen."""
    cached = _modules_of.get(vae)
    if cached is None:
        cached = _module_list(vae)
    while True:
        inside, children = cached
        states = [vae.__dict__] + [module.__dict__ for module in inside]
        if sum(len(state["_modules"]) for state in states) == children:
            params = [p for state in states for p in state["_parameters"].values() if p is not None]
            hooked = any("forward" in state for state in states[1:])  # (states[0]: the VAE's own)
            return Inventory(frozenset(p.device for p in params), frozenset(p.dtype for p in params), hooked)
        cached = _module_list(vae)


def replaced_forwards(vae: nn.Module, hooked: bool | None = None) -> list[str]:
    """The names of the modules inside `vae` whose `forward` a hook has replaced on the instance
    (diffusers' layerwise casting and group offloading, accelerate's offloading hooks, a wrapper of
    one's own). Such a hook calls the forward it found when it was added, so a layer's halo
    behaviour, swapped in by class, may never run, and the fast tier's blocks, which call their
    layers' computations directly, would skip the hook (its casting, its weight loading). The VAE
    itself is not counted: vaeshard's decode and encode do not go through its forward. `hooked`:
    the request's `inventory(vae).hooked`, where it has one."""
    if not (inventory(vae).hooked if hooked is None else hooked):
        return []  # (every request asks: the names only where there are some)
    return [name for name, m in vae.named_modules() if m is not vae and "forward" in m.__dict__]
