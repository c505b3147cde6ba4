"""Commands whose results some tests read, started in the background as soon as the run is collected,
so that they run while the tests before them wait on ranks, sockets and timeouts.

Such a command is a process of its own whose result does not depend on how fast it runs: Triton's CPU
interpreter running a kernel check (tests/interpreter.py), the benchmark scripts' --help and tiny CPU
runs, the demo. A test module registers it by name at import (`job`), marks the tests that read it
(`@pytest.mark.background("name", ...)`), and a test reads its outcome with `result` (and the files it
wrote in its own folder, `folder`). tests/conftest.py starts every job a collected test reads, in the
order of the tests, at most `AT_ONCE` at a time, at the lowest CPU priority (`nice`): they take the
cores the tests leave idle and slow no timing-bound test; and it runs the tests that read them last. A
job's time limit counts from when a test starts waiting for it; a job no collected test named starts
when a test first asks for it, at normal priority.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AT_ONCE = 2  # background jobs running at once (each is one busy Python thread)

# name -> (its folder) -> (argv, extra environment): what to run, built when it starts (its ports, its files)
_JOBS: dict[str, Callable[[str], tuple[list[str], dict[str, str]]]] = {}
_runs: dict[str, _Run] = {}
_lock = threading.Lock()
_slots = threading.Semaphore(AT_ONCE)


class _Run:
    def __init__(self, name: str, nice: bool):
        self.folder = tempfile.mkdtemp(prefix=f"vaeshard-{name}-")
        argv, env = _JOBS[name](self.folder)
        if nice and shutil.which("nice"):
            argv = ["nice", "-n", "19", *argv]
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            argv, stdout=self.out, stderr=self.err, text=True, env={**os.environ, **env}, cwd=ROOT
        )

    def outcome(self, timeout: float) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self.out.seek(0)
        self.err.seek(0)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.out.read(), self.err.read())


def job(name: str, build: Callable[[str], tuple[list[str], dict[str, str]]]) -> str:
    """Register a command under `name` (unique in the suite): `build(folder)` gives its argv and the
    variables to add to the environment, called when it starts with a new folder of its own (removed
    at the end of the run), in a thread of the test process while tests run: it must leave global state
    alone (torch's RNG and settings; build models in the job's own process). Returns `name`."""
    if name in _JOBS and _JOBS[name] is not build:
        raise ValueError(f"background job {name!r} registered twice")
    _JOBS[name] = build
    return name


def python(name: str, script: str, env: dict[str, str] | None = None) -> str:
    """`job` of `python -c script` from the repository root, with `env` added."""
    return job(name, lambda folder: ([sys.executable, "-c", script], dict(env or {})))


def _start(name: str, nice: bool) -> _Run:
    with _lock:
        run = _runs.get(name)
        if run is None:
            run = _runs[name] = _Run(name, nice)
        return run


def prestart(names: list[str]) -> None:
    """Start the named jobs (each once, in this order) in a thread of their own, `AT_ONCE` at a time,
    at the lowest priority."""
    order = [n for i, n in enumerate(names) if n in _JOBS and n not in names[:i]]
    if not order:
        return

    def feed() -> None:
        for name in order:
            _slots.acquire()
            with _lock:
                started = name in _runs
            if started:  # a test asked for it first
                _slots.release()
                continue
            run = _start(name, nice=True)
            threading.Thread(target=lambda r=run: (r.proc.wait(), _slots.release()), daemon=True).start()

    threading.Thread(target=feed, name="background-jobs", daemon=True).start()


def result(name: str, timeout: float) -> subprocess.CompletedProcess:
    """The finished job `name` (started now if it was not), waiting at most `timeout` seconds from
    now; subprocess.TimeoutExpired past it (the job killed)."""
    return _start(name, nice=False).outcome(timeout)


def folder(name: str) -> str:
    """The folder of job `name` (started now if it was not)."""
    return _start(name, nice=False).folder


def reads_last(items: list) -> list:
    """`items` (pytest's collected tests) with the tests that read a background job moved to the end, in
    their order: their jobs then have the whole run to finish."""
    reads = [item for item in items if any(True for _ in item.iter_markers("background"))]
    return [item for item in items if item not in reads] + reads


def stop() -> None:
    """Kill whatever job still runs and remove the jobs' folders (the end of the run)."""
    with _lock:
        runs = list(_runs.values())
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        shutil.rmtree(run.folder, ignore_errors=True)
