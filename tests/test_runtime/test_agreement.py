"""Ranks that do not arrive, arrive late or stop mid-request: every rank that waits raises within its
bound, names who is missing, and its process exits by itself.

Each scenario runs tests/arrival_ranks.py as two real processes with torchrun's environment (a
TCPStore rendezvous on a free loopback port) and measures when each process ended, so a process that
cannot exit (a collective left pending in the group) fails the test instead of passing once its
function has returned. Every wait here is bounded: the scenario's deadline kills what is left.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .. import reliability_report as report
from ..parity import CPU_FP32 as TOLERANCE

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 3.0  # the agreement's bound in these scenarios (timeout= or VAESHARD_AGREEMENT_TIMEOUT)
RAISE_SLACK_S = 3.0  # allowed past a bound before a rank raises (a loaded 2-core CI machine)
EXIT_SLACK_S = 8.0  # allowed between a rank's last event and its process's exit (interpreter teardown)
DEADLINE_S = 90.0  # a scenario's processes are killed past this: a hang fails, it never blocks the suite
# the rows these tests write into docs/reliability.md
REPORT_IDS = [
    "lonely-rank-timeout",
    "lonely-rank-default",
    "rank-exits-before-request",
    "late-rank",
    "rank-arrives-after-give-up",
    "ranks-differ-then-agree",
    "rank-stalls-mid-decode",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(scenario: str, **env_extra) -> tuple[dict[int, list[dict]], dict[int, float], dict[int, int], float]:
    """Run `scenario` on 2 processes: ({rank: events}, {rank: exit time}, {rank: exit code}, start time)."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("VAESHARD_AGREEMENT_TIMEOUT",)}
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
        **{k: str(v) for k, v in env_extra.items()},
    )
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]
    started = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.arrival_ranks", scenario],
            cwd=ROOT,
            env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    exits: dict[int, float] = {}
    try:
        while len(exits) < 2 and time.time() - started < DEADLINE_S:
            for r, p in enumerate(procs):
                if r not in exits and p.poll() is not None:
                    exits[r] = time.time()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    events, outputs = {}, {}
    for r, log in enumerate(logs):
        log.seek(0)
        outputs[r] = log.read()
        log.close()
        for line in outputs[r].splitlines():
            if line.startswith("EVENTS "):
                events[r] = json.loads(line[len("EVENTS ") :])["events"]
    stuck = [r for r in range(2) if r not in exits]
    assert not stuck, f"{scenario}: rank(s) {stuck} did not exit within {DEADLINE_S:g} s:\n" + "\n".join(
        f"--- rank {r}\n{outputs[r][-3000:]}" for r in range(2)
    )
    missing = [r for r in range(2) if r not in events]
    assert not missing, f"{scenario}: rank(s) {missing} reported nothing:\n" + "\n".join(
        f"--- rank {r}\n{outputs[r][-3000:]}" for r in missing
    )
    return events, exits, {r: p.returncode for r, p in enumerate(procs)}, started


def _event(events: list[dict], name: str) -> dict | None:
    return next((e for e in events if e["event"] == name), None)


def _outcome(events: list[dict], label: str) -> str:
    raised = _event(events, f"{label} raised")
    if raised is not None:
        message = raised["message"] if len(raised["message"]) < 300 else raised["message"][:297] + "..."
        return f"{raised['type']}: {message}"
    return "returned" if _event(events, f"{label} returned") is not None else "-"


def _record(case: str, what: str, bound: str, events, exits, labels=("decode",)) -> None:
    outcome = "; ".join(
        f"rank {r}: "
        + ", then ".join(_outcome(events[r], label) for label in labels if _event(events[r], f"{label} called"))
        for r in sorted(events)
        if any(_event(events[r], f"{lb} called") for lb in labels)
    )
    timing = []
    for r in sorted(events):
        called, raised = _event(events[r], f"{labels[0]} called"), _event(events[r], f"{labels[0]} raised")
        if called and raised:
            timing.append(f"rank {r} raised {raised['at'] - called['at']:.1f} s after its call")
    end = {r: _event(events[r], "end of script")["at"] for r in events}
    exit_text = ", ".join(f"rank {r} {exits[r] - end[r]:.1f} s after its script ended" for r in sorted(exits))
    report.record(
        "arrival", case, what=what, bound=bound, outcome=outcome, time="; ".join(timing) or "-", exit=exit_text
    )


def _check_exit(events, exits, codes):
    """Every process exited with code 0, soon after its script's last line."""
    for r in range(2):
        assert codes[r] == 0, f"rank {r} exited with {codes[r]}"
        end = _event(events[r], "end of script")["at"]
        assert exits[r] - end < EXIT_SLACK_S, f"rank {r}'s process took {exits[r] - end:.1f} s to exit after its script"


def _check_gave_up(events, bound_text: str):
    """Rank 0 raised CommTimeout within the bound, naming rank 1 and saying what to do."""
    called, raised = _event(events[0], "decode called"), _event(events[0], "decode raised")
    assert raised is not None and raised["type"] == "CommTimeout", events[0]
    waited = raised["at"] - called["at"]
    assert BOUND_S - 0.5 <= waited <= BOUND_S + RAISE_SLACK_S, f"rank 0 raised after {waited:.1f} s"
    message = raised["message"]
    for part in (
        "rank(s) [1] did not call decode",
        "Every rank of the group must call decode with the same request",
        "output='rank0' still needs every rank",
        "vaeshard.unparallelize(vae)",
        bound_text,
    ):
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["timeout", "default"])
def test_a_rank_decoding_alone_raises_within_its_bound_and_exits(how):
    env = {"ARRIVAL_TIMEOUT": BOUND_S} if how == "timeout" else {"VAESHARD_AGREEMENT_TIMEOUT": BOUND_S}
    events, exits, codes, _ = _run("lonely", **env)
    bound_text = "parallelize(timeout=...)" if how == "timeout" else "VAESHARD_AGREEMENT_TIMEOUT"
    _check_gave_up(events, bound_text)
    # rank 1's own barrier ends when rank 0's process has gone (its connection closes)
    assert _event(events[1], "barrier raised") is not None, events[1]
    _check_exit(events, exits, codes)
    what = "rank 0 calls decode, rank 1 waits in its own dist.barrier() " + (
        "(parallelize(timeout=3))" if how == "timeout" else "(no timeout; VAESHARD_AGREEMENT_TIMEOUT=3)"
    )
    _record(f"lonely-rank-{how}", what, f"{BOUND_S:g} s", events, exits)


@pytest.mark.timeout(120)
def test_a_rank_that_exits_without_decoding_is_named_and_the_others_exit():
    events, exits, codes, _ = _run("rank-exits", VAESHARD_AGREEMENT_TIMEOUT=BOUND_S)
    _check_gave_up(events, "VAESHARD_AGREEMENT_TIMEOUT")
    _check_exit(events, exits, codes)
    _record(
        "rank-exits-before-request", "rank 1 exits before the request, rank 0 decodes", f"{BOUND_S:g} s", events, exits
    )


@pytest.mark.timeout(120)
def test_a_late_rank_within_the_default_bound_decodes_like_diffusers():
    delay = 3.0
    events, exits, codes, _ = _run("late", VAESHARD_AGREEMENT_TIMEOUT=30, ARRIVAL_DELAY=delay)
    for r in range(2):
        assert _event(events[r], "decode returned") is not None, events[r]
        assert _event(events[r], "max diff")["value"] <= TOLERANCE
    # rank 0 really waited for rank 1: it cannot return before rank 1 called decode (the delay runs
    # from rank 1's own start, so how long rank 0 waited depends on how fast each process started)
    assert _event(events[0], "decode returned")["at"] >= _event(events[1], "decode called")["at"]
    assert _event(events[1], "decode called")["at"] - _event(events[1], "ready")["at"] >= delay
    _check_exit(events, exits, codes)
    _record(
        "late-rank", f"rank 1 calls decode {delay:g} s after rank 0", "30 s (VAESHARD_AGREEMENT_TIMEOUT)", events, exits
    )


@pytest.mark.timeout(120)
def test_a_rank_arriving_after_the_others_gave_up_raises_at_once_and_the_group_still_works():
    events, exits, codes, _ = _run("too-late", ARRIVAL_TIMEOUT=BOUND_S, ARRIVAL_DELAY=BOUND_S + 2)
    _check_gave_up(events, "parallelize(timeout=...)")
    called, raised = _event(events[1], "decode called"), _event(events[1], "decode raised")
    assert raised is not None and raised["type"] == "CommTimeout", events[1]
    assert raised["at"] - called["at"] < 1.5, "the late rank waited instead of learning that rank 0 gave up"
    assert "rank 0 had already given up waiting for this request" in raised["message"]
    for r in range(2):  # the next request of both ranks works: nothing was left pending
        assert _event(events[r], "second decode returned") is not None, events[r]
        assert _event(events[r], "max diff")["value"] <= TOLERANCE
    _check_exit(events, exits, codes)
    _record(
        "rank-arrives-after-give-up",
        f"rank 1 calls decode {BOUND_S + 2:g} s after rank 0, then both decode again",
        f"{BOUND_S:g} s",
        events,
        exits,
        labels=("decode", "second decode"),
    )


@pytest.mark.timeout(120)
def test_ranks_with_different_requests_raise_and_the_group_still_works():
    events, exits, codes, _ = _run("different", ARRIVAL_TIMEOUT=30)
    for r in range(2):
        raised = _event(events[r], "decode raised")
        assert raised is not None and raised["type"] == "ValueError" and "ranks disagree" in raised["message"]
        assert _event(events[r], "second decode returned") is not None, events[r]
        assert _event(events[r], "max diff")["value"] <= TOLERANCE
    _check_exit(events, exits, codes)
    _record(
        "ranks-differ-then-agree",
        "latent width 8 on rank 0 and 9 on rank 1, then the same request",
        "30 s",
        events,
        exits,
        labels=("decode", "second decode"),
    )


@pytest.mark.timeout(120)
def test_a_rank_stalled_mid_decode_makes_the_other_raise_report_the_group_and_exit():
    stall = 10.0
    events, exits, codes, started = _run("stall", ARRIVAL_TIMEOUT=BOUND_S, STALL_S=stall)
    stalled = _event(events[1], "stalled")["at"]
    raised = _event(events[0], "decode raised")
    assert raised is not None and raised["type"] == "CommTimeout", events[0]
    assert raised["at"] - stalled <= BOUND_S + RAISE_SLACK_S
    assert "this group can no longer be used" in raised["message"]
    second = _event(events[0], "second decode raised")  # reported broken at once, before any exchange
    assert second is not None and second["type"] == "CommTimeout"
    assert second["at"] - _event(events[0], "second decode called")["at"] < 0.5
    assert "an earlier request failed on this process group" in second["message"]
    assert _event(events[0], "destroyed the group") is not None
    # rank 0's process ended while rank 1 was still stalled: nothing of the failed exchange held it
    assert exits[0] < stalled + stall, f"rank 0 exited {exits[0] - stalled:.1f} s after rank 1 stalled"
    _check_exit(events, exits, codes)
    _record(
        "rank-stalls-mid-decode",
        f"rank 1 stops {stall:g} s in its 2nd decoder call; rank 0 then decodes again and destroys the group",
        f"{BOUND_S:g} s (gloo)",
        events,
        exits,
        labels=("decode", "second decode"),
    )
