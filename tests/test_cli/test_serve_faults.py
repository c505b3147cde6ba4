"""`vaeshard serve` when a rank fails, hangs or stops, when clients leave or set deadlines, and when the
drain outlasts --drain-timeout: one 2-rank server (subprocess, loopback, small Wan 2.1 VAE) with the
service's test hook (VAESHARD_SERVE_FAULT: cli/serve.py), which makes a chosen rank raise at, or wait
in, its next decoder call. Every wait is on an event (an answer, a file the hook writes, a metric, a
health state) with a deadline; every decode that answers 200 is compared with diffusers' own.
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load, save

from .. import reliability_report as report
from ..models import latent
from ..parity import CPU_FP32
from .test_serve import Server, _free_port, model, reference  # noqa: F401 - fixtures shared with test_serve

REPORT_IDS = ["service-rank-raises", "service-rank-stopped"]  # the rows these tests write into docs/reliability.md
TIMEOUT_S = 60  # the service's --timeout: a failure found only at the bound takes this long
DRAIN_S = 2  # the service's --drain-timeout
FAST_S = 15.0  # a failure must reach the client, or readiness turn, within this (scheduling on 2 loaded cores)
LONG = (1, 4, 3, 16, 16)  # a decode with collectives in every frame
SMALL = (1, 4, 1, 4, 4)


def _until(condition, timeout: float, what: str, poll: float = 0.05):
    """Poll `condition` until it returns something true; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout:g} s")


class Faults:
    """The test hook's file: `arm(rank, action)`, then wait for `hit()`; `release()` ends a hang."""

    def __init__(self, path: Path) -> None:
        self.path, self.hit_path = path, Path(str(path) + ".hit")

    def arm(self, rank: int, action: str, at: str = "decoder") -> None:
        self.hit_path.unlink(missing_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": rank, "action": action, "at": at}))
        tmp.rename(self.path)  # whole, as the ranks read it

    def wait_hit(self, timeout: float = 60) -> None:
        _until(self.hit_path.exists, timeout, "the fault was not reached")

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Faults:
    return Faults(tmp_path_factory.mktemp("faults") / "fault.json")


@pytest.fixture(scope="module")
def server(model, faults):  # noqa: F811 - the fixture imported above
    port = _free_port()
    cmd = [sys.executable, "-m", "vaeshard", "serve", "--model", str(model), "--device", "cpu", "--nproc", "2",
           "--port", str(port), "--timeout", str(TIMEOUT_S), "--drain-timeout", str(DRAIN_S)]  # fmt: skip
    s = Server(cmd, port, env={"VAESHARD_SERVE_FAULT": str(faults.path)})
    yield s
    faults.release()
    s.kill()


def _get(server, route: str) -> httpx.Response:
    return httpx.get(server.url + route, timeout=10)


def _decode_matches(server, reference, seed: int = 1, **params) -> None:  # noqa: F811
    z = latent(SMALL, seed=seed)
    r = server.post("/v1/decode", {"latents": z}, key=None, **params)
    assert r.status_code == 200, r.text
    assert (load(r.content)["sample"] - reference(z)).abs().max() <= CPU_FP32


def _metric(server, name: str, **labels) -> float:
    total = 0.0
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["F8_E4M3", "F8_E5M2"])
def test_a_float8_latent_is_refused_400_before_any_rank_sees_it(server, reference, dtype):  # noqa: F811
    # (it passed the HTTP check, then gloo could not broadcast it: 503 and the whole service exited)
    r = server.post("/v1/decode", save({"latents": torch.zeros(1, 4, 1, 4, 4).to(dtype)}), key=None)
    assert r.status_code == 400, r.text
    assert "float8" in r.json()["error"] and "floating-point" in r.json()["error"], r.json()
    assert _get(server, "/health/ready").status_code == 200
    _decode_matches(server, reference)


@pytest.mark.timeout(120)
def test_a_rank_raising_mid_decode_fails_that_request_500_in_seconds_and_the_service_serves_on(
    server,
    reference,  # noqa: F811
    faults,
):
    # (it was found only at --timeout, /health said ready meanwhile, and the exception was lost)
    faults.arm(1, "raise")
    started = time.monotonic()
    r = server.post("/v1/decode", {"latents": latent(LONG, seed=3)}, key=None, mode="spatial_shard_width")
    took = time.monotonic() - started
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert "rank 1: RuntimeError: injected fault on rank 1" in error, error
    assert took < FAST_S, took
    assert "a request failed on rank 1" in server.output()  # on record
    assert _get(server, "/health/ready").status_code == 200
    _decode_matches(server, reference, seed=4, mode="spatial_shard_width")  # on a new decode group
    report.record(
        "service",
        "service-rank-raises",
        what=f"vaeshard serve, 2 CPU ranks, --timeout {TIMEOUT_S}; rank 1 raises at its 2nd decoder call "
        "(spatial_shard_width decode)",
        requests="2",
        results=f"HTTP 500 {error[:90]!r}; then 200 (equal to diffusers); /health/ready 200",
        time=f"500 answered {took:.1f} s after the request was sent (the failure reached rank 0 within seconds)",
        memory="-",
    )


@pytest.mark.timeout(120)
def test_a_rank_raising_before_the_agreement_fails_that_request_in_seconds(server, reference, faults):  # noqa: F811
    # the others wait for it in the request's agreement, in the store: it says why it will not come
    faults.arm(1, "raise", at="input")
    started = time.monotonic()
    r = server.post("/v1/decode", {"latents": latent(SMALL, seed=13)}, key=None)
    took = time.monotonic() - started
    assert r.status_code == 500 and "rank 1: RuntimeError: injected fault on rank 1" in r.json()["error"], r.text
    assert took < FAST_S, took
    _decode_matches(server, reference, seed=14)


@pytest.mark.timeout(120)
def test_a_stopped_rank_turns_readiness_while_a_request_is_in_flight(server, reference, faults):  # noqa: F811
    pid = next(r["pid"] for r in server.health()[1]["ranks"] if r["rank"] == 1)
    faults.arm(1, "hang")  # a request in flight, held on rank 1 (its heartbeat still answers)
    z = latent(LONG, seed=5)
    with futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, "/v1/decode", {"latents": z}, None, 120)
        faults.wait_hit()
        assert _get(server, "/health/ready").status_code == 200
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            _until(lambda: _get(server, "/health/ready").status_code == 503, FAST_S, "readiness did not turn")
            turned = time.monotonic() - stopped_at
            state = server.health()[1]
            assert state["status"] == "unresponsive" and "heartbeat" in state["error"], state
            assert _get(server, "/health/live").status_code == 200
        finally:
            os.kill(pid, signal.SIGCONT)
        continued_at = time.monotonic()
        _until(lambda: _get(server, "/health/ready").status_code == 200, FAST_S, "readiness did not come back")
        back = time.monotonic() - continued_at
        faults.release()
        r = pending.result(timeout=90)
    assert r.status_code == 200, r.text
    assert (load(r.content)["sample"] - reference(z)).abs().max() <= CPU_FP32
    report.record(
        "service",
        "service-rank-stopped",
        what="vaeshard serve, 2 CPU ranks; rank 1 stopped (SIGSTOP) with a request in flight, then continued",
        requests="1",
        results="/health/ready 503 'unresponsive' while stopped (/health/live 200), 200 again after SIGCONT; "
        "the request then 200 (equal to diffusers)",
        time=f"readiness 503 {turned:.1f} s after SIGSTOP, 200 {back:.1f} s after SIGCONT",
        memory="-",
    )


@pytest.mark.timeout(120)
def test_requests_whose_clients_left_while_queued_are_not_decoded(server, reference, faults):  # noqa: F811
    before_decodes = _metric(server, "vaeshard_requests_total", op="decode")
    before_gone = _metric(server, "vaeshard_http_requests_total", route="/v1/decode", code="499")
    faults.arm(1, "hang")
    z = latent(SMALL, seed=6)
    with futures.ThreadPoolExecutor(5) as pool:
        held = pool.submit(server.post, "/v1/decode", {"latents": z}, None, 120)
        faults.wait_hit()

        def give_up(seed):
            with pytest.raises(httpx.ReadTimeout):  # the client stops waiting while its request is queued
                server.post("/v1/decode", {"latents": latent(SMALL, seed=seed)}, key=None, timeout=1)

        list(pool.map(give_up, range(10, 14)))
        # the service sees each of them go (answered 499, for the count) before the group is free again
        _until(
            lambda: _metric(server, "vaeshard_http_requests_total", route="/v1/decode", code="499") - before_gone >= 4,
            FAST_S,
            "the clients' leaving was not seen",
        )
        faults.release()
        assert held.result(timeout=90).status_code == 200
    _decode_matches(server, reference, seed=7)
    # the held request and the last one only: the four whose clients left were dropped from the queue
    assert _metric(server, "vaeshard_requests_total", op="decode") - before_decodes == 2


@pytest.mark.timeout(120)
def test_a_client_that_leaves_mid_decode_stops_it_on_every_rank(server, reference, faults):  # noqa: F811
    closed = _metric(server, "vaeshard_requests_total", op="decode", status="closed")
    faults.arm(1, "hang")  # held in its first frame of three
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/decode", {"latents": latent(LONG, seed=11)}, key=None, timeout=1)
    faults.release()
    # rank 0 closes the stream at the next chunk, which ends the request on every rank
    _until(
        lambda: _metric(server, "vaeshard_requests_total", op="decode", status="closed") > closed,
        FAST_S,
        "the decode was not stopped",
    )
    _decode_matches(server, reference, seed=12)


@pytest.mark.timeout(120)
def test_a_request_deadline_answers_504_and_stops_the_decode(server, reference, faults):  # noqa: F811
    body = save({"latents": latent(SMALL)})
    for bad in ("0", "abc", "99999"):  # more than --max-request-timeout (3600 s)
        r = httpx.post(server.url + "/v1/decode", content=body, params={"timeout": bad}, timeout=30)
        assert r.status_code == 400 and "timeout" in r.json()["error"], r.text
    faults.arm(1, "hang")
    started = time.monotonic()
    r = httpx.post(
        server.url + "/v1/decode",
        content=save({"latents": latent(LONG, seed=8)}),
        headers={"X-Request-Timeout": "2"},
        timeout=60,
    )
    took = time.monotonic() - started
    faults.release()  # rank 1 goes on; rank 0 stops the stream at its next chunk, on every rank
    assert r.status_code == 504 and "deadline" in r.json()["error"], r.text
    assert took < FAST_S, took
    _decode_matches(server, reference, seed=9)


@pytest.mark.timeout(120)
def test_sigterm_past_the_drain_timeout_answers_503_and_exits_with_its_code(server, faults):
    """(The last test: it ends the server.)"""
    try:
        faults.arm(1, "hang")
        with futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(server.post, "/v1/decode", {"latents": latent(LONG, seed=10)}, None, 60)
            faults.wait_hit()
            os.kill(server.proc.pid, signal.SIGTERM)
            r = pending.result(timeout=60)
        assert r.status_code == 503 and "drain-timeout" in r.json()["error"], r.text
        faults.release()  # the group stops at the request's next chunk
        from vaeshard.cli.serve import EXIT_DRAIN_CUT

        assert server.wait() == EXIT_DRAIN_CUT, server.output()
        assert "drain outlasted --drain-timeout" in server.output()
    finally:
        server.kill()
