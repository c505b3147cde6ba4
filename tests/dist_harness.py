"""Run a function on N gloo ranks on CPU, bounded in time; the test fails if any rank fails.

Ranks are processes of their own (no state shared with pytest) with a one-thread torch, a file-store
rendezvous in a temporary directory (no ports to collide) and a process-group timeout, so a rank
stuck in a collective raises instead of hanging; the parent kills whatever is left at the deadline.

Importing torch and diffusers costs seconds per process (on two cores, eight ranks took half a
minute to start), so ranks come from the launcher's forkserver (`processes.rank_context`: forked from a
process that has imported them once, or spawned where the test changed what a forked rank would
inherit), and by default a pool of ranks per world size is kept for the whole test session and each
call runs on it. A pool whose run failed or timed out is discarded (its group may be half-way through
a collective) and the next call starts a new one. `fresh=True` runs on new processes, for tests that
deliberately break their group.

The ranks join their group, are tied to the process that started them and are stopped as the command
line's are (vaeshard/cli/launch.py's `join_group`; cli/processes.py's `die_with_launcher` and `stop`);
only the pool, which outlives one call, is the harness's own.
"""

from __future__ import annotations

import atexit
import os
import queue as queue_mod
import shutil
import tempfile
import time
import traceback

from vaeshard.cli import launch, processes

GROUP_TIMEOUT_S = 60
_STOP = "stop"


def _worker(rank, world, init_file, tasks, results, group_timeout, launcher):
    processes.die_with_launcher(launcher)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        launch.join_group(rank, world, init_file, group_timeout)
    except BaseException:
        results.put((rank, -1, False, traceback.format_exc()))
        return
    while True:
        task = tasks.get()
        if task == _STOP:
            break
        task_id, fn, args = task
        try:
            results.put((rank, task_id, True, fn(rank, world, *args)))
        except BaseException:  # report everything, assertion failures included, to the parent
            results.put((rank, task_id, False, traceback.format_exc()))
        _give_back_memory()  # a pooled rank idles between tests: a real config's gigabytes go back
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _give_back_memory() -> None:
    """Collect the finished task's objects and return the freed heap to the OS (glibc's malloc_trim)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the memory stays with the process until it exits
        pass


class _Pool:
    def __init__(self, world: int, group_timeout: float):
        self.world = world
        self.ctx = processes.rank_context(preload=("tests.models",))
        self.tmp = tempfile.mkdtemp(prefix="vaeshard-ranks-")
        self.results = self.ctx.Queue()
        self.tasks = [self.ctx.Queue() for _ in range(world)]
        init_file = os.path.join(self.tmp, "rendezvous")
        self.procs = [
            self.ctx.Process(
                target=_worker,
                args=(r, world, init_file, self.tasks[r], self.results, group_timeout, os.getpid()),
                daemon=True,
            )
            for r in range(world)
        ]
        for p in self.procs:
            p.start()
        self.next_id = 0

    def run(self, fn, args, timeout: float) -> tuple[dict, list[int]]:
        self.next_id += 1
        task_id = self.next_id
        for q in self.tasks:
            q.put((task_id, fn, args))
        deadline = time.monotonic() + timeout
        outcomes: dict[int, tuple[bool, object]] = {}
        while len(outcomes) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, tid, ok, value = self.results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                if all(not p.is_alive() for p in self.procs):
                    break
                continue
            if tid in (task_id, -1):
                outcomes[rank] = (ok, value)
        missing = [r for r in range(self.world) if r not in outcomes]
        return outcomes, missing

    def close(self, graceful: bool) -> None:
        if graceful:
            for q in self.tasks:
                q.put(_STOP)
        processes.stop(self.procs, wait=5 if graceful else 0.1)
        shutil.rmtree(self.tmp, ignore_errors=True)


_pools: dict[int, _Pool] = {}


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close(graceful=True)
    _pools.clear()


def run_ranks(
    fn, world: int, *args, timeout: float = 240, group_timeout: float = GROUP_TIMEOUT_S, fresh: bool = False
) -> list:
    """Run fn(rank, world, *args) on `world` gloo ranks; return each rank's result (rank order)."""
    if fresh:
        pool = _Pool(world, group_timeout)
    else:
        pool = _pools.get(world)
        if pool is None:
            pool = _pools[world] = _Pool(world, group_timeout)
    outcomes, missing = pool.run(fn, args, timeout)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(outcomes.items()) if not ok]
    healthy = not failures and not missing
    if fresh or not healthy:
        pool.close(graceful=healthy)
        if not fresh:
            _pools.pop(world, None)
    if not healthy:
        detail = "\n".join(failures)
        if missing:
            detail += f"\nranks {missing} did not report within {timeout:g} s (hung or died)"
        raise AssertionError(f"distributed run of {fn.__name__} failed:\n{detail}")
    return [outcomes[r][1] for r in range(world)]
