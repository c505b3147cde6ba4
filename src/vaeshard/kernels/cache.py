"""vaeshard's cache folder: what one process compiles, later processes on the machine find on disk.

It holds the fast tier's Triton kernels: compiling them costs seconds on a machine's first decode
(docs/streaming.md, "The first request"), loading them a fraction of that. The folder is
`$VAESHARD_CACHE_DIR`, else `$XDG_CACHE_HOME/vaeshard`, else `~/.cache/vaeshard`; `VAESHARD_CACHE_DIR=off`
keeps vaeshard's kernels in Triton's own cache instead. Inside it, one subfolder per GPU model and
versions (`key`), with a manifest naming them; Triton keys each kernel within it by its source and
its arguments' specialisation (dtypes, alignments, block sizes: the shape class). A subfolder whose
manifest is missing, unreadable or names other versions is ignored with a warning and rebuilt; so
is one whose kernels Triton cannot read. Deleting the folder is always safe.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger("vaeshard")

ENV = "VAESHARD_CACHE_DIR"
MANIFEST = "manifest.json"
_ready: dict[tuple, Path | None] = {}  # (key items, what) -> its checked folder, once per process


def root() -> Path | None:
    """The cache folder, or None where VAESHARD_CACHE_DIR is "off"."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "vaeshard"


def key(device_index: int | None = None) -> dict:
    """What a cached kernel depends on beyond its own source and arguments: the GPU model and the
    versions of everything that compiles or runs it (read once per device and process: every first
    launch of a kernel asks)."""
    import torch

    index = (torch.cuda.current_device() if torch.cuda.is_available() else -1) if device_index is None else device_index
    return dict(_key(index))


@functools.cache
def _key(index: int) -> tuple:
    import importlib.metadata

    import torch

    try:
        version = importlib.metadata.version("vaeshard")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "source"
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - depends on the installation
        triton_version = None
    gpu, capability = None, None
    if index >= 0:
        gpu = torch.cuda.get_device_name(index)
        capability = "{}.{}".format(*torch.cuda.get_device_capability(index))
    return tuple(
        {
            "gpu": gpu,
            "capability": capability,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "triton": triton_version,
            "vaeshard": version,
        }.items()
    )


def subfolder_name(k: dict) -> str:
    """`<gpu>-sm<capability>-<digest of the whole key>`: readable, and distinct per key."""
    gpu = re.sub(r"[^a-z0-9]+", "-", (k.get("gpu") or "cpu").lower()).strip("-")
    sm = (k.get("capability") or "").replace(".", "")
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:10]
    return f"{gpu}-sm{sm}-{digest}" if sm else f"{gpu}-{digest}"


def folder(what: str, k: dict | None = None) -> Path | None:
    """The checked folder `what` (e.g. "triton") for this machine's key, created if needed; None where
    the cache is off or cannot be made (a warning says why; vaeshard then keeps nothing on disk)."""
    k = key() if k is None else k
    memo = (tuple(sorted(k.items())), what)
    if memo in _ready:
        return _ready[memo]
    base = root()
    place = None
    if base is not None:
        home = base / subfolder_name(k)
        try:
            _check(home, k)
            place = home / what
            place.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("vaeshard: cannot use the cache folder %s (%s); nothing is cached on disk", home, exc)
            place = None
    _ready[memo] = place
    return place


def _check(home: Path, k: dict) -> None:
    """Make `home` a subfolder whose manifest names `k`: a missing one is written; an unreadable or
    different one means the subfolder is stale or corrupt: it is removed (with a warning) and rebuilt."""
    manifest = home / MANIFEST
    if manifest.exists():
        try:
            found = json.loads(manifest.read_text())
            why = None if found == k else "it was made for other versions or another GPU"
        except (OSError, ValueError) as exc:
            why = f"its manifest cannot be read: {exc}"
        if why is None:
            return
        discard(home, why)
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(k, indent=1, sort_keys=True))
    os.replace(tmp, manifest)


def discard(home: Path, why: str) -> None:
    """Remove a stale or corrupt subfolder, saying so once."""
    log.warning("vaeshard: the cache at %s is ignored and rebuilt: %s", home, why)
    shutil.rmtree(home, ignore_errors=True)
    for memo in [m for m, p in _ready.items() if p is not None and home in p.parents]:
        del _ready[memo]


@contextlib.contextmanager
def triton_kernels():
    """Compile (or find) vaeshard's Triton kernels inside: Triton's cache is vaeshard's folder for the
    duration (Triton's knob, so the user's own kernels keep theirs). Nothing changes where the cache is
    off, or where the user chose Triton's cache folder (TRITON_CACHE_DIR)."""
    place = None if os.environ.get("TRITON_CACHE_DIR") else folder("triton")
    if place is None:
        yield None
        return
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(place)
        yield place


__all__ = ["ENV", "discard", "folder", "key", "root", "subfolder_name", "triton_kernels"]
