"""Where a rank's process comes from and how it is tied to the process that started it (cli/launch.py,
and the tests' rank pools in tests/dist_harness.py).

Starting a rank is mostly importing torch and diffusers: seconds of CPU per process, paid by every rank
of every launch when each is spawned. CPU ranks are therefore forked from multiprocessing's forkserver, a
process of its own (it ran no thread pool and holds no process group) that imported them once, started at
this process's first launch (or earlier, `start_forkserver`): the first launch pays one import in all
instead of one per rank, and later ones none. CUDA ranks too: on a GPU machine importing diffusers asks
for the device count (`torch.accelerator.is_available()`), and asked of the CUDA runtime that leaves no
process forked afterwards able to start CUDA ("Cannot re-initialize CUDA in forked subprocess";
benchmarks/results/2026-12-06/shares/, calls F and I), so the forkserver starts with torch's
NVML-based check (PYTORCH_NVML_BASED_CUDA_CHECK=1), which counts the devices without the runtime (its
ranks get the launcher's value of that variable back). Whether a rank forked from it can start CUDA is
asked once, of a forked probe, before the first CUDA ranks are forked from it (a main module that
used CUDA as it was imported, say); where it cannot, CUDA ranks are spawned. A rank writes
to its launcher's standard output and error as they are at the launch (`Streams`); a forked one
otherwise has what the forkserver had when it started: its environment (which torch, Triton and
diffusers read as they are imported), working directory and module path. Where any of these has
changed since, the ranks are spawned instead, as they would be without a forkserver.

A rank must never run on, and write, after its command reported a failure: `die_with_launcher` ties it
to the launcher, and `stop` ends the ranks a launcher started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import signal
import sys
import threading
import time

_KILL_GRACE_S = 3.0
# variables that differ without a forked rank differing from a spawned one: pytest sets the first anew for
# each test (no rank reads it); importing torch's compiler sets the second where it is unset, in this process
# and in the forkserver alike
_IGNORED_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"})
_forkserver_state: tuple | None = None  # what `_process_state` was when this process started its forkserver
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_cuda_forks: tuple | None = None  # (the forkserver's pid, whether a process it forks can start CUDA)
_PROBE_TIMEOUT_S = 60.0


def _process_state() -> tuple:
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in _IGNORED_VARIABLES))
    return env, os.getcwd(), frozenset(sys.path)  # (the folders modules are found in, in any order)


def _preload(more: tuple[str, ...]) -> list[str]:
    """What the forkserver imports before it forks a rank: what a spawned rank would import (the main
    module, torch, vaeshard) and diffusers' autoencoders (the package imports every VAE class it has)."""
    return [
        "__main__",
        "torch",
        "torch.distributed",
        "vaeshard",
        "vaeshard.cli",
        "diffusers.models.autoencoders",
        *more,
    ]


class Streams:
    """The launcher's standard output and error at a rank's start, for the rank to write to: pickled into
    the rank as file descriptors it receives (as multiprocessing passes a pipe), which `adopt` puts in place
    of its own. A stream the launcher has closed is left as the rank has it."""

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        open_fds = []
        for fd in (1, 2):
            try:
                os.fstat(fd)
                open_fds.append((fd, DupFd(fd)))
            except OSError:
                pass
        return _received_streams, (open_fds, os.environ.get(_NVML_CHECK))

    def adopt(self) -> None:
        """In the rank: the launcher's output and error in place of its own, and the launcher's value of
        the one variable the forkserver sets for itself (above)."""
        for fd, received in self.received:
            if received != fd:
                os.dup2(received, fd)
                os.close(received)
        if self.nvml_check is None:
            os.environ.pop(_NVML_CHECK, None)
        else:
            os.environ[_NVML_CHECK] = self.nvml_check


def _received_streams(open_fds, nvml_check) -> Streams:
    streams = Streams()
    streams.received = [(fd, dup.detach()) for fd, dup in open_fds]
    streams.nvml_check = nvml_check
    return streams


def rank_context(preload: tuple[str, ...] = (), device: str = "cpu"):
    """The multiprocessing context to start ranks on `device` from: the forkserver (started here on first
    use, importing `preload` too) while this process's environment, directory and module path are what they
    were when it started, and for CUDA ranks where a process forked from it can start CUDA; else spawn.
    `preload` counts only on the first call of the process."""
    global _forkserver_state
    if "forkserver" not in mp.get_all_start_methods():  # not POSIX
        return mp.get_context("spawn")
    state = _process_state()
    if _forkserver_state is None:
        mp.get_context("forkserver").set_forkserver_preload(_preload(preload))
        _forkserver_state = state
    elif state != _forkserver_state:
        return mp.get_context("spawn")
    _ensure_running()  # (here, not at the first rank's start: restarted too with the check above)
    ctx = mp.get_context("forkserver")
    if device != "cpu" and not _forks_start_cuda(ctx):
        return mp.get_context("spawn")
    return ctx


def _ensure_running() -> None:
    """Start the forkserver (where it is not running) with torch's NVML-based device count (above). The
    environment is changed only while one starts: every launch asks, and another thread may be reading it."""
    from multiprocessing import forkserver

    pid = _server_pid()
    if pid is not None:
        try:  # (without reaping it: multiprocessing waits for it itself)
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return  # running
        except (AttributeError, ChildProcessError):
            pass
    before = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop(_NVML_CHECK, None)
        else:
            os.environ[_NVML_CHECK] = before


def _forks_start_cuda(ctx) -> bool:
    """Whether a process forked from the forkserver can start CUDA: asked once per forkserver, of a forked
    probe (False where it cannot, or does not answer in time)."""
    global _cuda_forks
    server = _server_pid()
    if _cuda_forks is None or _cuda_forks[0] != server:
        reader, writer = ctx.Pipe(duplex=False)
        probe = ctx.Process(target=_probe_cuda_fork, args=(writer,), daemon=True, name="vaeshard-cuda-probe")
        probe.start()
        writer.close()
        try:
            answer = bool(reader.poll(_PROBE_TIMEOUT_S) and reader.recv())
        except EOFError:  # it died before it answered
            answer = False
        finally:
            reader.close()
            stop([probe], 1.0)
        _cuda_forks = (server, answer)
    return _cuda_forks[1]


def _server_pid() -> int | None:
    """The pid of this process's forkserver (None before it started; multiprocessing keeps it privately)."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _probe_cuda_fork(writer) -> None:
    import torch

    writer.send(not torch.cuda._is_in_bad_fork())
    writer.close()


def start_forkserver() -> None:
    """Start the forkserver now, so that it imports while this process goes on (a no-op where ranks are
    spawned, or where it is running; whether CUDA ranks can be forked from it is asked at their launch)."""
    rank_context()


def stop(procs, wait: float) -> None:
    """Let the ranks exit within `wait` seconds, then terminate, then kill whatever is left."""
    end = time.monotonic() + wait
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + _KILL_GRACE_S
    for p in procs:
        if p.pid is None:
            continue
        p.join(timeout=max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(timeout=_KILL_GRACE_S)


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """On Linux, have the kernel send `signum` to this process when `parent`, the process that started it,
    ends, however it ends (SIGKILL included): a rank must never run on, and write, after its command
    reported a failure. SIGKILL by default, because nothing a rank runs can delay or ignore it; the parent
    cleans up after its ranks. Exits at once if the parent already ended."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)


def die_with_launcher(launcher: int, signum: int = signal.SIGKILL) -> None:
    """`die_with_parent` for a rank started by `launcher` (a pid): spawned, the launcher is its parent; forked
    by the forkserver, its parent is the forkserver, which does not end while a rank it forked lives (each
    holds the forkserver's end-of-clients pipe), so the rank also waits for the launcher's end in a thread
    of its own (a pidfd, Linux 5.3 and later) and then sends itself `signum`."""
    parent = os.getppid()
    die_with_parent(parent, signum)
    if parent == launcher or not sys.platform.startswith("linux"):
        return
    try:
        pidfd = os.pidfd_open(launcher)
    except ProcessLookupError:  # it ended before this rank started
        os._exit(1)
    except (AttributeError, OSError):  # a kernel before 5.3: tied to the forkserver alone
        return

    def wait() -> None:
        select.select([pidfd], [], [])  # readable once the launcher has ended
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait, name="vaeshard-launcher-watch", daemon=True).start()
