"""Run a function on N gloo ranks on CPU, bounded in time; the test fails if any rank fails.

Each rank is a fresh spawned process (no state shared with pytest) with a one-thread torch, a
file-store rendezvous in a temporary directory (no ports to collide) and a process-group timeout,
so a rank stuck in a collective raises instead of hanging; the parent kills whatever is left at
the deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import tempfile
import time
import traceback
from datetime import timedelta

GROUP_TIMEOUT_S = 60


def _worker(rank, world, init_file, fn, args, results, group_timeout):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=group_timeout),
        )
        value = fn(rank, world, *args)
        results.put((rank, True, value))
    except BaseException:  # report everything, including assertion failures, to the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_ranks(fn, world: int, *args, timeout: float = 240, group_timeout: float = GROUP_TIMEOUT_S) -> list:
    """Run fn(rank, world, *args) on `world` gloo ranks; return each rank's result (rank order)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_worker, args=(r, world, init_file, fn, args, results, group_timeout), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        outcomes: dict[int, tuple[bool, object]] = {}
        try:
            while len(outcomes) < world:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, ok, value = results.get(timeout=min(left, 1.0))
                    outcomes[rank] = (ok, value)
                except queue_mod.Empty:
                    dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in outcomes]
                    if dead and all(not p.is_alive() for p in procs):
                        break
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(outcomes.items()) if not ok]
    missing = [r for r in range(world) if r not in outcomes]
    if failures or missing:
        detail = "\n".join(failures)
        if missing:
            detail += f"\nranks {missing} did not report within {timeout:g} s (hung or died)"
        raise AssertionError(f"distributed run of {fn.__name__} failed:\n{detail}")
    return [outcomes[r][1] for r in range(world)]
