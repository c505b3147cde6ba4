"""Run a function on N ranks of a fresh process group, bounded in time, and collect the results.

The command line uses this to start its own workers: `run(fn, nproc, *args)` starts `nproc`
processes, gives each a process group (gloo on CPU through a file store in a temporary directory, so
no port can collide; NCCL with one GPU per rank on CUDA), calls `fn(ctx, *args)` on every rank and
returns the values in rank order. If a rank raises, dies, or the deadline passes, every other rank
is killed at once and the parent raises: nothing is left waiting in a collective. A SIGTERM or SIGINT
to the parent does the same (it raises `Interrupted` once every rank has ended), and on Linux a rank
also ends when the parent is killed outright: no rank outlives the command that started it.

When the process was started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR set), `run`
starts none: this process is one of torchrun's ranks, the group comes from torchrun's rendezvous,
and every rank gets every rank's value.

This module owns the process group of a command-line run; the library itself (`runtime/comm.py`) only ever
uses a group it is given. It is the one launcher: the command line's commands, the service (`run` with
`signals="rank0"`: a SIGTERM drains through rank 0) and the tests' rank pools (tests/dist_harness.py, which
keeps its ranks alive between tests but joins their group with `join_group`). Where a rank's process
comes from (a CPU rank is forked from a forkserver that imported torch and diffusers once) and how it is
tied to the process that started it: cli/processes.py.

Why not torch's own launcher, `torch.distributed.launcher.api.elastic_launch(LaunchConfig(...), fn)`: it
was tried (torch 2.13, two CPU ranks, start_method "spawn") and fails what the command line must do.
It installs its own SIGTERM and SIGINT handlers and answers either by sending SIGTERM to every rank and
raising `SignalException` (the service needs a SIGTERM passed to rank 0 alone, which drains while the
others keep serving, and the command line needs `Interrupted` with the signal for exit 143 or 130 after
its own cleanup); its ranks are not tied to the parent (no PR_SET_PDEATHSIG: a parent killed with
SIGKILL leaves them running, and writing); a rank's exception reaches the parent only as a
`ChildFailedError` whose text holds the traceback, so a ValueError (bad input, exit 2) cannot be told
from a crash (exit 1) without parsing its error file; there is no hook to remove a killed rank's
temporary output once every rank has ended; it rendezvouses over a TCP port (c10d) where a file store
in a private folder cannot collide; and it creates no process group (each `fn` would init its own). It
is not slower to start (two CPU ranks, measured one after the other: 12 s either way on loaded cores),
so its speed was not the reason.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

from . import processes

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
DEFAULT_GROUP_TIMEOUT_S = 600.0
_POLL_S = 0.2
_EXIT_GRACE_S = 10.0
# after a rank's failure, how long the others' reports may take to arrive: a rank's failure makes its
# peers fail too (a closed connection), and their reports can overtake its own in the queue
_REPORT_GRACE_S = 2.0


class LaunchError(RuntimeError):
    """A distributed run did not complete."""


class LaunchTimeout(LaunchError):
    """The run passed its deadline; every rank was killed."""


class Interrupted(KeyboardInterrupt):
    """The process got SIGTERM or SIGINT (`signum`) while `interruptible` was in force; a KeyboardInterrupt,
    so that whatever cleans up after Ctrl-C (a writer removing its temporary output) cleans up after it too."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class WorkerFailed(LaunchError):
    """A rank raised (or died); every other rank was killed.

    `exc_type` is the name of the exception class the rank raised, `message` its text and
    `detail` the rank's traceback (empty when the rank died without reporting).
    """

    def __init__(self, rank: int, exc_type: str, message: str, detail: str = "", user_error: bool = False):
        self.rank, self.exc_type, self.message, self.detail = rank, exc_type, message, detail
        self.user_error = user_error  # the rank raised ValueError: bad input, not a bug
        super().__init__(f"rank {rank} failed: {exc_type}: {message}" if exc_type else f"rank {rank} failed: {message}")


@dataclass(frozen=True)
class RankContext:
    """Who this process is in the run; passed as the first argument of the function `run` calls."""

    rank: int
    world: int
    local_rank: int
    device: str  # "cpu" or "cuda:<local rank>"
    backend: str | None  # "gloo", "nccl", or None for a run without a process group
    torchrun: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def barrier(self) -> None:
        """Wait for every rank (no-op without a process group)."""
        if self.backend is None or self.world == 1:
            return
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def synchronize(self) -> None:
        """Wait for this rank's queued GPU work (no-op on CPU), before reading a host clock."""
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)


class Control:
    """The service's control channel (cli/serve.py): rank 0 sends each request, and the others answer,
    over a gloo group of every rank, whatever the decode's backend (a peer that died ends a wait there
    at once, on CUDA too). Each call is a collective: every rank makes the same calls in the same order.

    Two more groups of every rank: the heartbeat's (gloo), on which rank 0's monitor and every other
    rank's answering thread meet every second whatever the control channel is doing, and the decodes'
    (the run's backend), which `decode_group` replaces after a request broke it."""

    def __init__(self, ctx: RankContext, timeout: float) -> None:
        import torch.distributed as dist

        self.ctx, self.timeout = ctx, timeout
        self.group = self.beats = self.decodes = None
        if ctx.backend is not None and ctx.world > 1:
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
            self.beats = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))

    def decode_group(self):
        """A new process group of every rank for the decodes (every rank calls it at the same point;
        None without a process group). A group a failed request left unusable is not destroyed: its
        ranks may still be inside one of its collectives, which its own timeout ends."""
        if self.group is None:
            return None
        import torch.distributed as dist

        self.decodes = dist.new_group(timeout=timedelta(seconds=self.timeout))
        return self.decodes

    def broadcast(self, message=None):
        """Rank 0's `message` on every rank."""
        if self.group is None:
            return message
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def broadcast_tensor(self, tensor):
        """Rank 0's CPU tensor on every rank; the others pass an empty tensor of its shape and dtype."""
        if self.group is None:
            return tensor
        import torch.distributed as dist

        dist.broadcast(tensor, src=0, group=self.group)
        return tensor

    def gather(self, value) -> list | None:
        """Every rank's `value`, in rank order, on rank 0 (None elsewhere)."""
        if self.group is None:
            return [value]
        import torch.distributed as dist

        out = [None] * self.ctx.world if self.ctx.is_main else None
        dist.gather_object(value, out, dst=0, group=self.group)
        return out

    def heartbeat(self, go: bool = True) -> bool:
        """One heartbeat: returns once every rank answered (rank 0: `go` False tells the others' answering
        threads to end); whether the heartbeats go on. Raises when a rank left."""
        if self.beats is None:
            return go
        import torch
        import torch.distributed as dist

        beat = torch.tensor([1 if go else 0], dtype=torch.int32)
        dist.all_reduce(beat, op=dist.ReduceOp.MIN, group=self.beats)
        return bool(beat.item())

    def answer_heartbeats(self) -> threading.Thread | None:
        """A rank other than 0: answer rank 0's heartbeats in a thread of their own until it stops them;
        the thread (None without a heartbeat group)."""

        def answer():
            with contextlib.suppress(Exception):  # rank 0 left: the control channel reports it
                while self.heartbeat():
                    pass

        if self.beats is None:
            return None
        thread = threading.Thread(target=answer, name="vaeshard-heartbeat", daemon=True)
        thread.start()
        return thread


def torchrun_env() -> bool:
    """True when this process was started by torchrun (or an equivalent launcher)."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def torchrun_world() -> int | None:
    return int(os.environ["WORLD_SIZE"]) if torchrun_env() else None


def cpu_threads_per_rank(nproc: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, nproc))


def inline_context(device: str = "cpu") -> RankContext:
    """The context of a one-process run in this process, without a process group."""
    return RankContext(rank=0, world=1, local_rank=0, device=device, backend=None)


class _Stop:
    """The signal an `interruptible` block got (None: none yet), and whether it is to be raised now."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.raised = False
        self.holding = 0

    def handle(self, signum, frame) -> None:
        if self.signum is not None:
            return  # the first signal is already stopping the run: let its teardown finish
        self.signum = signum
        if not self.holding:
            self.raised = True
            raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self, raise_after: bool = True):
        """A signal inside is kept and raised at the end, so that stopping the ranks is never cut short;
        or, with raise_after False, dropped (what the block did stands: it came too late to stop it)."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
        if not self.holding and self.signum is not None and not self.raised:
            self.raised = True
            if raise_after:
                raise Interrupted(self.signum)


_stop: _Stop | None = None  # the stop of the main thread's `interruptible` block in force, if any


@contextlib.contextmanager
def interruptible():
    """Inside, SIGTERM and SIGINT raise `Interrupted` in the main thread, once; later ones are ignored while
    the process stops (a supervisor's SIGTERM then a Ctrl-C must not cut the cleanup short). A signal whose
    handler the caller set (not Python's default) is left alone, and so is any signal off the main thread
    (where Python cannot set a handler). Yields the block's `_Stop`; a nested block shares the outer one's."""
    global _stop
    if threading.current_thread() is not threading.main_thread():
        yield _Stop()
        return
    if _stop is not None:
        yield _stop
        return
    stop = _Stop()
    defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    taken = {}
    for sig, default in defaults.items():
        if signal.getsignal(sig) is default:
            taken[sig] = signal.signal(sig, stop.handle)
    _stop = stop
    try:
        yield stop
    finally:
        _stop = None
        for sig, previous in taken.items():
            signal.signal(sig, previous)


def run(
    fn,
    nproc: int,
    *args,
    device: str = "cpu",
    timeout: float | None = None,
    group_timeout: float = DEFAULT_GROUP_TIMEOUT_S,
    failure_grace: float = 0.0,
    on_failure=None,
    signals: str = "all",
) -> list:
    """Call `fn(ctx, *args)` on `nproc` ranks; return the values in rank order.

    fn:            a module-level function (it is pickled into the rank processes); its return value
                   must be picklable and hold CPU tensors only.
    device:        "cpu" (gloo) or "cuda" (NCCL, rank r on cuda:r).
    timeout:       deadline for the whole run in seconds (None: no deadline; a rank that raises or
                   dies still ends the run at once).
    group_timeout: bound on every collective of the process group.
    failure_grace: seconds the other ranks may take to end by themselves after one failed, before
                   they are stopped (a service's rank 0 answers its clients first); 0: at once.
    on_failure:    called with no arguments in this process when the run fails, once every rank it
                   started has ended (under torchrun: once `fn` failed on this rank), before the error
                   is raised: it removes what a killed rank could not (a temporary output).
    signals:       "all": a SIGTERM or SIGINT stops every rank (below), and a rank whose parent died
                   gets SIGKILL. "rank0" (the service): a SIGTERM here is passed to rank 0 alone, which
                   drains and then stops the group, a SIGINT is ignored here (Ctrl-C reaches rank 0
                   through the terminal's process group), and a rank whose parent died gets SIGTERM.
    Raises WorkerFailed if a rank raises or dies, LaunchTimeout past the deadline, and Interrupted
    on SIGTERM or SIGINT (unless the caller set its own handler for it: `interruptible`).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if torchrun_env():
        try:
            return _run_under_torchrun(fn, nproc, args, device, group_timeout)
        except BaseException:
            if on_failure is not None:
                on_failure()
            raise
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if signals not in ("all", "rank0"):
        raise ValueError(f"signals must be 'all' or 'rank0', got {signals!r}")
    death = signal.SIGKILL
    if signals == "rank0":
        death = signal.SIGTERM
        signal.signal(signal.SIGTERM, _forward_to_rank0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _start(fn, nproc, args, device, timeout, group_timeout, failure_grace, on_failure, death)


def _forward_to_rank0(signum, frame) -> None:
    for child in mp.active_children():
        if child.name == "vaeshard-rank0":
            os.kill(child.pid, signum)


# --- started workers -------------------------------------------------------------------------------


def prestart() -> None:
    """Start the forkserver the ranks are forked from now, so that it imports while this process goes on:
    the command line calls it once its arguments say it will start ranks, before it loads the model. A
    no-op under torchrun, where the ranks are not forked (`processes.rank_context`), or where it is
    running."""
    if not torchrun_env():
        processes.start_forkserver()


def _start(fn, nproc, args, device, timeout, group_timeout, failure_grace, on_failure, death) -> list:
    ctx = processes.rank_context(device=device)
    results = ctx.Queue()
    threads = cpu_threads_per_rank(nproc) if device == "cpu" else None
    # A signal to this process stops the ranks here, in one place, as a rank's failure does: the ranks
    # are stopped and waited for before anything is reported, so none can write after a failure was
    # reported, and `on_failure` removes what a killed rank left (the ranks themselves may die at any
    # instruction, so they cannot be relied on to clean up).
    with interruptible() as stop, tempfile.TemporaryDirectory(prefix="vaeshard-rdzv-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    rank,
                    nproc,
                    device,
                    init_file,
                    fn,
                    args,
                    results,
                    group_timeout,
                    threads,
                    os.getpid(),
                    death,
                    processes.Streams(),
                ),
                daemon=True,
                name=f"vaeshard-rank{rank}",
            )
            for rank in range(nproc)
        ]
        values = None
        try:
            with stop.held():  # a rank started but not yet known could not be stopped
                for p in procs:
                    p.start()
            values = _collect(procs, results, nproc, timeout)
        finally:
            with stop.held():
                # After success the ranks are only tearing down: let them exit on their own first.
                processes.stop(procs, wait=_EXIT_GRACE_S if values is not None else failure_grace)
                results.close()
                results.join_thread()
                if (values is None or stop.signum is not None) and on_failure is not None:
                    on_failure()
    return values


def _collect(procs, results, nproc: int, timeout: float | None) -> list:
    deadline = None if timeout is None else time.monotonic() + timeout
    values: dict[int, object] = {}
    failures: list[tuple[float, int, tuple]] = []  # (when, rank, _describe_failure's tuple)

    def take(item) -> None:
        rank, ok, payload = item
        if ok:
            values[rank] = pickle.loads(payload)
        else:
            failures.append((payload[-1], rank, payload[:-1]))

    def waiting() -> list[int]:
        return [r for r in range(nproc) if r not in values and r not in {f[1] for f in failures}]

    while len(values) < nproc and not failures:
        if deadline is not None and time.monotonic() >= deadline:
            raise LaunchTimeout(f"ranks {waiting()} did not finish within {timeout:g} s; all ranks were stopped")
        try:
            take(results.get(timeout=_POLL_S))
            continue
        except queue_mod.Empty:
            pass
        dead = [r for r in waiting() if not procs[r].is_alive()]
        if dead:
            # A rank that reported and then exited may still have its report in the pipe.
            try:
                while True:
                    take(results.get(timeout=_POLL_S))
            except queue_mod.Empty:
                pass
            dead = [r for r in dead if r in waiting()]
            if dead and not failures:
                r = dead[0]
                code = procs[r].exitcode
                if code is not None and code < 0:
                    how = f"was killed by signal {-code}" + (" (out of memory?)" if code == -9 else "")
                else:
                    how = f"exited with code {code}"
                raise WorkerFailed(r, "", f"the process {how} before reporting a result")
    if not failures:
        return [values[r] for r in range(nproc)]
    # A rank's failure makes its peers fail too (a closed connection), and their reports can overtake
    # its own in the queue: the reports of the ranks still running are awaited a little (or their
    # end), and the failure that happened first is the one named.
    end = time.monotonic() + _REPORT_GRACE_S
    while time.monotonic() < end and any(procs[r].is_alive() for r in waiting()):
        try:
            take(results.get(timeout=_POLL_S))
        except queue_mod.Empty:
            pass
    _, rank, (exc_type, message, detail, user_error) = min(failures)
    raise WorkerFailed(rank, exc_type, message, detail, user_error)


def join_group(rank: int, world: int, init_file: str, group_timeout: float, device: str = "cpu") -> RankContext:
    """Join a fresh process group of `world` ranks through the file store `init_file` (gloo on CPU; NCCL on
    cuda, rank r on cuda:r); this rank's context, once every rank has joined (a barrier: gloo's rank 0
    can finish connecting before a peer has, and a rank done early would otherwise close its
    connections while that peer still makes them)."""
    import torch
    import torch.distributed as dist

    backend, where, extra = "gloo", "cpu", {}
    if device == "cuda":
        torch.cuda.set_device(rank)
        backend, where, extra = "nccl", f"cuda:{rank}", {"device_id": torch.device("cuda", rank)}
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=group_timeout),
        **extra,
    )
    ctx = RankContext(rank, world, rank, where, backend)
    ctx.barrier()
    return ctx


def _worker(rank, world, device, init_file, fn, args, results, group_timeout, threads, launcher, death, streams):
    processes.die_with_launcher(launcher, death)
    streams.adopt()
    import torch
    import torch.distributed as dist

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        ctx = join_group(rank, world, init_file, group_timeout, device)
        value = fn(ctx, *args)
        results.put((rank, True, pickle.dumps(value)))
    except BaseException as exc:  # report everything, also KeyboardInterrupt and SystemExit
        # when it failed (CLOCK_MONOTONIC, shared by the machine's processes): the earliest is the cause
        failed_at = time.monotonic()
        results.put((rank, False, (*_describe_failure(exc), failed_at)))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def _describe_failure(exc: BaseException) -> tuple[str, str, str, bool]:
    return type(exc).__name__, str(exc), traceback.format_exc(), isinstance(exc, ValueError)


# --- torchrun --------------------------------------------------------------------------------------

_owns_group = False  # whether _run_under_torchrun created the default process group itself


def close_group() -> None:
    """Destroy the default process group if `run` created it under torchrun; a no-op otherwise.

    For a process that is done with its requests (the command line, at its end): the backend
    releases its communicators while every rank is still alive, instead of at interpreter exit
    (where torch warns about a group never destroyed). Gloo's threads may still outlive it; see
    `cli.entry`. Call it only when every rank finished its last collective (after a request failed
    on another rank, the group may still be inside one).
    """
    global _owns_group
    if not _owns_group:
        return
    import torch.distributed as dist

    _owns_group = False
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_under_torchrun(fn, nproc, args, device, group_timeout) -> list:
    global _owns_group
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if nproc is not None and nproc != world:
        raise ValueError(
            f"this run was started by torchrun with {world} ranks, so it cannot use {nproc}: "
            f"leave out the process count or set it to {world}"
        )
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    backend = "nccl" if device == "cuda" else "gloo"
    if not dist.is_initialized():
        kwargs = {"device_id": torch.device("cuda", local_rank)} if device == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=group_timeout), **kwargs)
        _owns_group = True
    ctx = RankContext(
        rank, world, local_rank, f"cuda:{local_rank}" if device == "cuda" else "cpu", backend, torchrun=True
    )
    # A failing rank does not enter the exchange below: it raises, its process exits non-zero and
    # torchrun stops the other ranks (which may be waiting in a collective of `fn`).
    try:
        value = fn(ctx, *args)
    except Exception as exc:
        exc_type, message, detail, user_error = _describe_failure(exc)
        raise WorkerFailed(rank, exc_type, message, detail, user_error) from exc
    gathered: list = [None] * world
    dist.all_gather_object(gathered, pickle.dumps(value))
    return [pickle.loads(payload) for payload in gathered]


__all__ = [
    "LaunchError",
    "Control",
    "Interrupted",
    "LaunchTimeout",
    "RankContext",
    "WorkerFailed",
    "close_group",
    "cpu_threads_per_rank",
    "inline_context",
    "interruptible",
    "join_group",
    "prestart",
    "run",
    "torchrun_env",
    "torchrun_world",
]
