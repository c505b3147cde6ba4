"""A command line run that fails or is stopped leaves nothing behind: every rank ends with its command
(SIGTERM, or the command killed outright), the command exits 128 plus the signal, and neither the
output nor its hidden temporary file is left or appears later. CPU ranks (gloo), a small seeded Wan VAE.

Each test waits on something it can observe (a rank's process, the writer's temporary file, a file a
rank writes), each wait bounded by a deadline; a rank still alive when a test ends is killed by it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ..models import build, latent

DEADLINE_S = 120.0  # a fresh interpreter imports torch and diffusers (the ranks too, 2 on 2 cores)
GONE_S = 20.0  # ranks end this soon after their command did (they are stopped before it exits)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A saved small Wan VAE; a latent that takes it seconds to decode on 2 ranks, and one with a NaN."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("interrupt-assets")
    build("wan21").save_pretrained(root / "wan21")
    save_file({"latents": latent((1, 4, 9, 16, 16))}, root / "long.safetensors")
    z = latent((1, 4, 3, 6, 8))
    z[0, 1, 1, 2, 3] = float("nan")
    save_file({"latents": z}, root / "nan.safetensors")
    return root


def _start(tmp_path: Path, *args) -> subprocess.Popen:
    """`vaeshard ARGS` in a session of its own (a stray signal cannot reach pytest), output to a file."""
    log = open(tmp_path / "command.log", "w")  # noqa: SIM115 - the process writes to it until it ends
    return subprocess.Popen(
        [sys.executable, "-m", "vaeshard", *map(str, args)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )


def _log(tmp_path: Path) -> str:
    return (tmp_path / "command.log").read_text()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None for no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has ended: it only awaits its reaper


def _children(parent: int) -> list[tuple[int, bytes]]:
    """(pid, command line) of each living child of `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None or int(fields[1]) != parent:
            continue
        try:
            found.append((int(entry.name), (entry / "cmdline").read_bytes()))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def _ranks_of(launcher: int) -> list[int]:
    """The ranks the launcher started: its forkserver's children, or the processes it spawned
    (multiprocessing's spawn_main); not the forkserver itself nor the resource tracker."""
    ranks = []
    for pid, cmdline in _children(launcher):
        if b"multiprocessing.forkserver" in cmdline:
            ranks += [rank for rank, _ in _children(pid)]
        elif b"spawn_main" in cmdline:
            ranks.append(pid)
    return sorted(ranks)


def _wait_for(condition, deadline_s: float, what: str, proc: subprocess.Popen | None = None, tmp_path=None):
    """Poll `condition` until it returns something true; fail after `deadline_s`, or if `proc` ended."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}:\n{_log(tmp_path)}")
        time.sleep(0.02)
    pytest.fail(f"no {what} within {deadline_s:g} s" + (f":\n{_log(tmp_path)}" if tmp_path else ""))


def _kill_leftovers(proc: subprocess.Popen, ranks: list[int]) -> None:
    """Whatever a failed test left running: its command and the ranks it saw."""
    for pid in [proc.pid, *ranks]:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _two_ranks(parent: int) -> list[int] | None:
    ranks = _ranks_of(parent)
    return ranks if len(ranks) == 2 else None


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["decode", "bench"])
def test_sigterm_stops_every_rank_and_leaves_no_output(assets, tmp_path, command):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "video.mp4"
    if command == "decode":
        args = ["decode", assets / "long.safetensors", "--model", assets / "wan21", "--out", out]
    else:
        args = ["bench", "--model", assets / "wan21", "--shape", "1,4,9,16,16", "--modes", "auto", "--no-ref"]
        args += ["--reps", 1, "--json", out_dir / "bench.json"]
    proc = _start(tmp_path, *args, "--nproc", 2, "--device", "cpu")
    ranks: list[int] = []
    try:
        if command == "decode":  # the decode is under way: rank 0 opened its temporary output
            _wait_for(lambda: _hidden(out_dir), DEADLINE_S, "temporary output", proc, tmp_path)
            ranks = _ranks_of(proc.pid)
        else:
            ranks = _wait_for(lambda: _two_ranks(proc.pid), DEADLINE_S, "2 bench ranks", proc, tmp_path)
        assert len(ranks) == 2, ranks
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        _wait_for(lambda: not any(_alive(pid) for pid in ranks), GONE_S, "end of every rank")
        assert code == 128 + signal.SIGTERM, _log(tmp_path)
        assert "interrupted by SIGTERM" in _log(tmp_path)
        assert list(out_dir.iterdir()) == []  # no output, no temporary file: and no rank is left to write one
    finally:
        _kill_leftovers(proc, ranks)


def _writer_of(ranks: list[int], folder: Path) -> int | None:
    """The rank that has a file in `folder` open: rank 0, which writes the output."""
    for pid in ranks:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd).startswith(str(folder)):
                    return pid
            except OSError:
                continue
    return None


@pytest.mark.timeout(240)
def test_a_killed_writer_rank_leaves_no_output(assets, tmp_path):
    """SIGKILL to the rank writing the output mid-decode (it can clean up nothing itself): the command
    fails, the other rank ends, and the process that started them removes the temporary output."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ["decode", assets / "long.safetensors", "--model", assets / "wan21", "--out", out_dir / "video.mp4"]
    proc = _start(tmp_path, *args, "--nproc", 2, "--device", "cpu")
    ranks: list[int] = []
    try:
        _wait_for(lambda: _hidden(out_dir), DEADLINE_S, "temporary output", proc, tmp_path)
        ranks = _ranks_of(proc.pid)
        writer = _wait_for(lambda: _writer_of(ranks, out_dir), 10, "the rank writing the output", proc, tmp_path)
        os.kill(writer, signal.SIGKILL)
        code = proc.wait(timeout=60)
        _wait_for(lambda: not any(_alive(pid) for pid in ranks), GONE_S, "end of every rank")
        assert code not in (0, 128 + signal.SIGTERM), _log(tmp_path)
        assert list(out_dir.iterdir()) == []  # the temporary output the killed rank left is gone
    finally:
        _kill_leftovers(proc, ranks)


@pytest.mark.timeout(120)
def test_ranks_end_when_their_command_is_killed(tmp_path):
    script = tmp_path / "run_ranks.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, pathlib, time
            from vaeshard.cli import launch

            def hang(ctx):
                pathlib.Path({str(tmp_path)!r}, f"rank{{ctx.rank}}-{{os.getpid()}}").touch()
                time.sleep(600)

            if __name__ == "__main__":
                launch.run(hang, 2)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        marks = _wait_for(lambda: m if len(m := list(tmp_path.glob("rank*"))) == 2 else None, DEADLINE_S, "ranks")
        ranks = [int(m.name.split("-")[1]) for m in marks]
        proc.kill()  # SIGKILL: the command cannot stop its ranks itself
        proc.wait(timeout=30)
        _wait_for(lambda: not any(_alive(pid) for pid in ranks), GONE_S, "end of every rank")
    finally:
        _kill_leftovers(proc, ranks)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("out_name", ["frames", "video.mp4"])
def test_a_nan_latent_on_two_ranks_leaves_nothing(assets, tmp_path, out_name, capfd):
    """Every rank refuses the latent; a rank that reports first gets the other stopped at once, even
    while that one is in its writer: the launcher removes the temporary output after the ranks end."""
    from vaeshard.cli import main

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ["decode", assets / "nan.safetensors", "--model", assets / "wan21", "--out", out_dir / out_name]
    # the handlers the caller had (a shell's background job starts with SIGINT ignored) come back
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    code = main([str(a) for a in [*args, "--nproc", 2, "--device", "cpu", "--quiet"]])
    err = capfd.readouterr().err
    assert code == 2 and "NaN" in err, err
    assert list(out_dir.iterdir()) == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_is_held_while_the_ranks_stop_and_a_callers_own_handler_is_kept():
    from vaeshard.cli import launch

    reached = False
    with pytest.raises(launch.Interrupted) as info, launch.interruptible() as stop, stop.held():
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(lambda: stop.signum, 10, "the signal handled")
        reached = True  # held: the block ran on to its end
    assert reached and info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with launch.interruptible():
            assert signal.getsignal(signal.SIGTERM) is own  # the service forwards SIGTERM to its rank 0 itself
    finally:
        signal.signal(signal.SIGTERM, previous)
