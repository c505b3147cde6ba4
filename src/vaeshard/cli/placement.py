"""Where a command's ranks run: how many, on which device, and which of them speaks for the run."""

from __future__ import annotations

import os
import sys

from . import launch
from .io import InputError


def is_main_rank() -> bool:
    """Rank 0, or a process that is no rank of torchrun's: the one that prints the run's lines."""
    return os.environ.get("RANK", "0") == "0"


def main_print(*parts) -> None:
    if is_main_rank():
        print(*parts, flush=True)


def error(message: str, code: int) -> int:
    """`vaeshard: error: ...` (its first line) on stderr from the main rank; returns `code`."""
    if is_main_rank():
        first = " ".join(message.split("\n")).strip()
        print(f"vaeshard: error: {first}", file=sys.stderr)
    return code


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_device(requested: str | None, nproc: int) -> str:
    """cpu or cuda; cuda needs one visible GPU per rank (per local rank under torchrun)."""
    if requested == "cpu":
        return "cpu"
    gpus = cuda_count()
    need = int(os.environ["LOCAL_RANK"]) + 1 if launch.torchrun_env() else nproc
    if requested is None:
        return "cuda" if gpus >= need else "cpu"
    if gpus < need:
        visible = f"{gpus} GPU is visible" if gpus == 1 else f"{gpus} GPUs are visible"
        fix = f"use --nproc {gpus} or fewer, or --device cpu" if gpus else "use --device cpu"
        raise InputError(f"--device cuda with {nproc} rank(s) needs {need} GPU(s), one per rank, but {visible}: {fix}")
    return "cuda"


def process_count(requested: int | None, default: int = 1) -> int:
    world = launch.torchrun_world()
    if world is not None:
        if requested is not None and requested != world:
            raise InputError(
                f"--nproc {requested} conflicts with torchrun's {world} ranks: leave out --nproc under torchrun"
            )
        return world
    return default if requested is None else requested
