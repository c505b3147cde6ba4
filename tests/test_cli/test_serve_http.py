"""`vaeshard serve`'s HTTP front end under abuse: admission from the headers, bounded memory, connection
and time limits, JSON errors, what /health tells a client without the key, and where the key comes from.

One server (2 CPU ranks, loopback only) with small limits set by its flags serves every test that needs
one; the last test ends it. Every wait polls a condition against a deadline; every client this file
opens is closed before its test ends.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as futures
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load, save

from .. import reliability_report as report
from ..models import latent
from ..parity import CPU_FP32
from .test_serve import KEY, ROOT, Server, _free_port, _rss_mib, model, reference  # noqa: F401 (fixtures)

MAX_QUEUE, MAX_BODY_MB, MAX_CONNECTIONS, MAX_UPLOADS = 3, 16, 24, 2
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 3.0, 6.0
IDLE_CONNECTIONS = 200  # the flood of idle connections: over 8 times --max-connections
SLACK_S = 10.0  # on top of a time limit, for a loaded 2-core machine
REPORT_IDS = ["service-queued-memory", "service-idle-connections", "service-slow-clients"]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):  # noqa: F811
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_text(KEY + "\n")
    port = _free_port()
    cmd = [sys.executable, "-m", "vaeshard", "serve", "--model", str(model), "--device", "cpu", "--nproc", "2",
           "--port", str(port), "--timeout", "60", "--api-key-file", str(key_file), "--max-queue", MAX_QUEUE,
           "--max-body-mb", MAX_BODY_MB, "--max-connections", MAX_CONNECTIONS, "--max-uploads", MAX_UPLOADS,
           "--header-timeout", HEADER_TIMEOUT_S, "--body-timeout", BODY_TIMEOUT_S]  # fmt: skip
    s = Server([str(c) for c in cmd], port)
    yield s
    s.kill()


def _state(server) -> dict:
    return httpx.get(server.url + "/health", headers={"X-API-Key": KEY}, timeout=5).json()


def _gauge(server, name: str) -> float:
    for line in server.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def _until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def _head(path: str, length: int | None, key: str | None = KEY, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"Content-Length: {length}"] if length is not None else []
    lines += [f"Authorization: Bearer {key}"] if key else []
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def _connect(server, timeout: float = 30) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def _answer(sock: socket.socket) -> tuple[int, dict, bytes]:
    r = http.client.HTTPResponse(sock)
    r.begin()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset); False while it is open (no data waits)."""
    sock.setblocking(False)
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _log_lines(server) -> list[str]:
    return server.output().splitlines()


# --- admission, uploads, memory --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_admission_from_the_headers_and_a_cap_on_uploads(server, reference):  # noqa: F811
    """A full queue answers 429 with Retry-After before the body is sent; at most --max-uploads bodies are
    received at once, the others wait their turn; every admitted request then completes."""
    zs = [latent((1, 4, 1, 4, 6), seed=40 + i) for i in range(MAX_QUEUE)]
    bodies = [save({"latents": z}) for z in zs]
    socks = []
    try:
        for i, body in enumerate(bodies):
            sock = _connect(server)
            socks.append(sock)
            sock.sendall(_head("/v1/decode", len(body)) + body[: len(body) // 2])
            if i < MAX_UPLOADS:
                _until(lambda n=i + 1: _gauge(server, "vaeshard_uploads") == n, 30, f"{i + 1} uploads")
        _until(lambda: _gauge(server, "vaeshard_uploads_waiting") == 1, 30, "an upload waiting for its turn")
        assert _gauge(server, "vaeshard_uploads") == MAX_UPLOADS
        late = _connect(server)
        socks.append(late)
        late.sendall(_head("/v1/decode", len(bodies[0])))  # the headers only: the answer needs no body
        code, headers, text = _answer(late)
        assert code == 429 and int(headers["retry-after"]) >= 1, (code, text)
        assert "queue is full" in json.loads(text)["error"]
        for sock, body in zip(socks, bodies):
            sock.sendall(body[len(body) // 2 :])
        for sock, z in zip(socks, zs):
            code, _, text = _answer(sock)
            assert code == 200, text
            assert (load(text)["sample"] - reference(z)).abs().max() <= CPU_FP32
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.timeout(60)
def test_a_body_without_content_length_or_over_the_limit_is_refused_before_it_is_read(server):
    with _connect(server) as sock:
        sock.sendall(_head("/v1/decode", None, KEY, "Transfer-Encoding: chunked") + b"5\r\nhello\r\n0\r\n\r\n")
        code, _, text = _answer(sock)
        assert code == 411 and "Content-Length" in json.loads(text)["error"]
    with _connect(server) as sock:
        sock.sendall(_head("/v1/decode", MAX_BODY_MB * 2**20 + 1))
        code, _, text = _answer(sock)
        assert code == 413 and "--max-body-mb" in json.loads(text)["error"]


# --- the body's parse ------------------------------------------------------------------------------


def _mapped(body: bytes):
    import mmap

    buffer = mmap.mmap(-1, len(body))
    buffer[:] = body
    return buffer


def test_the_body_parse_equals_safetensors_own():
    """The body is parsed in place; each tensor must equal what safetensors' own parser reads."""
    from vaeshard.cli.http import _parse

    z = latent((1, 4, 2, 3, 5))
    bodies = [
        {"latents": z},
        {"latents": z.half(), "other": torch.arange(3)},
        {"latents": z.bfloat16(), "byte": torch.zeros(1, dtype=torch.uint8)},  # the latents may sit unaligned
        {"latents": z.double()},
    ]
    for tensors in bodies:
        body = save(tensors, metadata={"from": "a pipeline"})
        got, ref = _parse(_mapped(body), len(body), "latents"), load(body)["latents"]
        assert got.dtype == ref.dtype and torch.equal(got, ref), list(tensors)


def _raw(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


@pytest.mark.parametrize(
    "body, words",
    [
        (b"\0" * 4, "shorter than"),
        ((10**9).to_bytes(8, "little") + b"{}", "header claims"),
        (_raw([1]), "not a JSON object"),  # type: ignore[arg-type]
        (b"\4\0\0\0\0\0\0\0{{{{", "not JSON"),
        (_raw({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "no tensor named 'latents'"),
        (_raw({"latents": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "floating-point"),
        (_raw({"latents": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "floating-point"),
        (_raw({"latents": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}}, b"\0" * 8), "has shape"),
        (_raw({"latents": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8), "does not match"),
        (_raw({"latents": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "does not match"),
        (_raw({"latents": {"dtype": "F32"}}), "no valid dtype"),
    ],
)
def test_a_malformed_body_is_a_400_naming_the_problem(body, words):
    from vaeshard.cli.http import HTTPError, _parse

    with pytest.raises(HTTPError) as caught:
        _parse(_mapped(body), len(body), "latents")
    assert caught.value.code == 400 and words in caught.value.message


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_every_error_is_json_404_405_and_the_servers_own_400(server):
    r = httpx.get(server.url + "/v1/decode", timeout=5)
    assert r.status_code == 405 and "POST /v1/decode" in r.json()["error"] and "POST" in r.headers["allow"]
    r = httpx.get(server.url + "/nowhere", timeout=5)
    assert r.status_code == 404 and "GET /health" in r.json()["error"]
    for raw in (b"NOT HTTP AT ALL\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 << 10)):
        with _connect(server) as sock:
            sock.sendall(raw)
            code, headers, text = _answer(sock)
            assert code == 400 and headers["content-type"] == "application/json", text
            assert "HTTP/1.1" in json.loads(text)["error"]
    assert server.health()[0] == 200


@pytest.mark.timeout(60)
def test_a_kept_alive_connection_has_each_head_checked(server):
    # the server's guard holds each request head back until it is whole and follows the body after it:
    # on one connection, a request with a body, one without, then a head that is no HTTP
    body = b"\0" * 4  # a body the app reads whole, then refuses
    with _connect(server) as sock:
        sock.sendall(_head("/v1/decode", len(body)) + body)
        code, _, text = _answer(sock)
        assert code == 400 and "shorter than" in json.loads(text)["error"], text
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        code, _, text = _answer(sock)
        assert code == 200 and json.loads(text)["status"] == "ready", text
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        code, headers, text = _answer(sock)
        assert code == 400 and headers["content-type"] == "application/json", text
        assert "HTTP/1.1" in json.loads(text)["error"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "route, tensors, params, words",
    [
        ("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"fps": "1e30"}, "fps="),
        ("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"fps": "1" + "0" * 30}, "from 1 to"),
        ("/v1/encode", {"pixels": torch.zeros(1, 3, 1, 4, 4)}, {}, "too small to encode"),
        ("/v1/encode", {"pixels": torch.zeros(1, 3, 2, 16, 7)}, {}, "too small to encode"),
    ],
    ids=["fps-float", "fps-huge", "pixels-4x4", "pixels-width-7"],
)
def test_out_of_range_fps_and_too_small_pixels_are_400(server, route, tensors, params, words):
    r = server.post(route, tensors, format="mp4" if "fps" in params else "safetensors", **params)
    assert r.status_code == 400 and words in r.json()["error"], r.text


# --- /health and the key ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_health_without_the_key_says_only_the_status(server):
    r = httpx.get(server.url + "/health", timeout=5)
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    for wrong in ({"X-API-Key": "wrong"}, {}):
        assert httpx.get(server.url + "/health", headers=wrong, timeout=5).json() == {"status": "ready"}
    state = _state(server)
    assert state["world_size"] == 2 and [r["rank"] for r in state["ranks"]] == [0, 1] and "pid" in state["ranks"][0]


@pytest.mark.timeout(60)
def test_the_key_file_keeps_the_key_out_of_the_process_list(server):
    pids = [server.proc.pid] + [r["pid"] for r in _state(server)["ranks"]]
    for pid in pids:
        assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    assert server.post("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, key="wrong").status_code == 401


def _key_args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"api_key": None, "api_key_file": None, **given})


def test_api_key_sources_and_refusals(tmp_path, monkeypatch, capsys):
    from vaeshard.cli import httplimits
    from vaeshard.cli.io import InputError

    monkeypatch.delenv(httplimits.API_KEY_ENV, raising=False)
    assert httplimits.api_key(_key_args()) is None
    monkeypatch.setenv(httplimits.API_KEY_ENV, "from-env")
    assert httplimits.api_key(_key_args()) == "from-env"
    (tmp_path / "key").write_text("from-file\n")
    assert httplimits.api_key(_key_args(api_key_file=str(tmp_path / "key"))) == "from-file"
    assert capsys.readouterr().err == ""
    assert httplimits.api_key(_key_args(api_key="from-flag")) == "from-flag"
    assert "--api-key shows the key" in capsys.readouterr().err
    for empty in ("", "  \n"):
        monkeypatch.setenv(httplimits.API_KEY_ENV, empty)
        with pytest.raises(InputError, match="empty API key"):
            httplimits.api_key(_key_args())
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InputError, match="empty API key"):
        httplimits.api_key(_key_args(api_key_file=str(tmp_path / "empty")))
    for bad in ("two words", "caf\u00e9", "tab\there"):
        with pytest.raises(InputError, match="HTTP header"):
            httplimits.api_key(_key_args(api_key=bad))
    with pytest.raises(InputError, match="cannot read"):
        httplimits.api_key(_key_args(api_key_file=str(tmp_path / "missing")))


@pytest.mark.timeout(60)
def test_an_empty_key_stops_the_command_before_it_serves(monkeypatch, capsys, tmp_path):
    from vaeshard.cli import main

    monkeypatch.setenv("VAESHARD_API_KEY", "")
    # (a model that is not there: were the key taken, the command would stop there instead of serving)
    assert main(["serve", "--model", str(tmp_path / "absent"), "--device", "cpu", "--offline"]) != 0
    assert "empty API key" in capsys.readouterr().err


# --- the event loop --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_health_answers_while_a_body_is_parsed(model, monkeypatch):  # noqa: F811
    """The body's parse runs off the event loop: /health answers while it is held."""
    from vaeshard.cli import http as front
    from vaeshard.cli.io import resolve_model
    from vaeshard.cli.serve import STATUS_READY, ServeJob

    parsing, release, timed_out = threading.Event(), threading.Event(), []
    parse = front._parse

    def held_parse(*args):
        parsing.set()
        if not release.wait(10):  # only a stalled event loop keeps /health from releasing it
            timed_out.append(True)
        return parse(*args)

    monkeypatch.setattr(front, "_parse", held_parse)

    class Service:  # answers every admitted request 503 at once: only the HTTP side is under test
        status, error, queue_depth, on_request = STATUS_READY, None, 0, None

        def health(self):
            return {"status": self.status}

        def reserve(self):
            return None

        def release(self):
            pass

        def submit(self, request):
            request.out.fail(503, "no group in this test")

    job = ServeJob(model=resolve_model(str(model), None, True), dtype="fp32", mode="auto", options={}, timeout=60,
                   host="127.0.0.1", port=0, api_key=None, max_queue=4, max_body=1 << 20, fps=16,
                   preset="veryfast")  # fmt: skip
    app = front.make_app(Service(), job)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = save({"latents": latent((1, 4, 1, 4, 4))})
            post = asyncio.ensure_future(client.post("/v1/decode", content=body))
            assert await asyncio.to_thread(parsing.wait, 10), "the parse did not start"
            health = await asyncio.wait_for(client.get("/health"), 10)
            release.set()
            return health, await asyncio.wait_for(post, 20)

    health, post = asyncio.run(scenario())
    assert health.status_code == 200 and not timed_out, "/health waited for the body's parse"
    assert post.status_code == 503


# --- slow and idle clients -------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_idle_and_slow_connections_are_closed_and_the_log_stays_short(server, reference):  # noqa: F811
    """At once: a client that sends its headers a byte at a time, one that sends its body a byte at a
    time, and IDLE_CONNECTIONS connections that send nothing. Connections over --max-connections close at
    once, the others after --header-timeout, the slow body gets 408 after --body-timeout; the service
    then answers, and the log holds a few lines, not one per connection."""
    lines_before = len(_log_lines(server))
    body = save({"latents": latent((1, 4, 1, 4, 4))})
    started = time.monotonic()  # before any connection: the server's clocks start later than this one
    header_drip, body_drip = _connect(server), _connect(server)
    idle: list[socket.socket] = []
    opened: list[float] = []  # when each idle connection was made
    try:
        body_drip.sendall(_head("/v1/decode", len(body)))
        header_drip.sendall(b"POST /v1/decode HTTP/1.1\r\n")
        for _ in range(IDLE_CONNECTIONS):
            opened.append(time.monotonic() - started)
            idle.append(_connect(server))
        closed_at: dict[int, float] = {}  # how long after it was made the server closed each one
        header_closed = body_answered = None
        sent = 0
        deadline = started + BODY_TIMEOUT_S + SLACK_S
        while time.monotonic() < deadline and (len(closed_at) < len(idle) or not header_closed or not body_answered):
            now = time.monotonic() - started
            for i, sock in enumerate(idle):
                if i not in closed_at and _closed_by_server(sock):
                    closed_at[i] = now - opened[i]
            if header_closed is None:
                try:
                    header_drip.send(b"X-Slow: a\r\n"[sent % 11 : sent % 11 + 1])
                except OSError:
                    header_closed = now
            if body_answered is None:
                try:
                    body_drip.send(body[sent : sent + 1])
                except OSError:
                    body_answered = now  # closed without an answer: the check below fails
                body_drip.setblocking(False)
                try:
                    if body_drip.recv(1, socket.MSG_PEEK):
                        body_answered = now
                except BlockingIOError:
                    pass
                except OSError:
                    body_answered = now
                body_drip.setblocking(True)
            sent += 1
            time.sleep(0.1)
        assert len(closed_at) == len(idle), f"{len(idle) - len(closed_at)} idle connections still open"
        assert header_closed is not None, "the slow request head was not cut off"
        assert body_answered is not None, "the slow body got no answer"
        # the server cannot close a connection for its head before HEADER_TIMEOUT_S: one closed sooner was
        # over --max-connections
        at_once = sum(1 for t in closed_at.values() if t < HEADER_TIMEOUT_S)
        assert at_once >= IDLE_CONNECTIONS - MAX_CONNECTIONS, sorted(closed_at.values())
        assert max(closed_at.values()) >= HEADER_TIMEOUT_S  # the ones within the limit waited for their head
        assert header_closed >= HEADER_TIMEOUT_S and body_answered >= BODY_TIMEOUT_S - 1
        body_drip.setblocking(True)
        code, _, text = _answer(body_drip)
        assert code == 408 and "--body-timeout" in json.loads(text)["error"], text
    finally:
        for sock in [header_drip, body_drip, *idle]:
            sock.close()
    z = latent((1, 4, 1, 4, 4), seed=3)
    r = server.post("/v1/decode", {"latents": z})
    assert r.status_code == 200 and (load(r.content)["sample"] - reference(z)).abs().max() <= CPU_FP32
    added = _log_lines(server)[lines_before:]
    assert len(added) <= 12, added  # a few kinds of line, each at most once per window plus its count
    held_longest = max(t + opened[i] for i, t in closed_at.items())
    report.record(
        "service",
        "service-idle-connections",
        what=f"{IDLE_CONNECTIONS} idle connections at once to vaeshard serve --max-connections {MAX_CONNECTIONS} "
        f"--header-timeout {HEADER_TIMEOUT_S:g}",
        requests="1 after the flood",
        results=f"{at_once} closed at once, the other {len(idle) - at_once} after --header-timeout; the request "
        f"after them 200; {len(added)} log lines",
        time=f"every idle connection closed {held_longest:.1f} s after the flood began",
        memory="-",
    )
    report.record(
        "service",
        "service-slow-clients",
        what=f"a request head sent a byte per 0.1 s (--header-timeout {HEADER_TIMEOUT_S:g}) and a body sent a "
        f"byte per 0.1 s (--body-timeout {BODY_TIMEOUT_S:g})",
        requests="2",
        results="the head's connection closed; the body answered 408 (JSON)",
        time=f"closed after {header_closed:.1f} s; 408 after {body_answered:.1f} s",
        memory="-",
    )


@pytest.mark.timeout(60)
def test_a_client_gone_mid_upload_logs_one_line(server):
    lines_before = len(_log_lines(server))

    def gone() -> float:
        text = server.metrics()
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("vaeshard_http_requests_total{")
                   and 'code="499"' in x)  # fmt: skip

    before = gone()
    with _connect(server) as sock:
        sock.sendall(_head("/v1/decode", 100_000) + b"\0" * 1000)
    _until(lambda: gone() == before + 1, 30, "the gone client's request counted")
    added = _log_lines(server)[lines_before:]
    assert len([line for line in added if "closed its connection" in line]) == 1, added
    assert not any("Traceback" in line or "Exception" in line for line in added), added


# --- memory (the last test: it ends the server) ----------------------------------------------------


@pytest.mark.timeout(150)
def test_queued_requests_cost_their_body_and_freed_bodies_leave_rank0(server):
    """Rank 1 is stopped (SIGSTOP), so the group holds one request in flight and admitted requests
    stay queued; rank 0's resident memory then grows by about the queued bodies' size. Bodies refused
    after they arrived leave nothing resident. Rank 1 is then killed: the service fails and exits."""
    try:
        ranks = _state(server)["ranks"]
        rank0 = next(r["pid"] for r in ranks if r["rank"] == 0)
        rank1 = next(r["pid"] for r in ranks if r["rank"] == 1)
        big = (1, 4, 2, 500, 1000)  # 15.3 MiB in float32: under --max-body-mb 16
        refused = save({"latents": torch.zeros(1, 5, 1, 800, 1000)})  # wrong channels: 400 after its body arrived

        def refuse(_):
            return server.post("/v1/decode", refused).status_code

        with futures.ThreadPoolExecutor(MAX_UPLOADS) as pool:
            assert list(pool.map(refuse, range(MAX_UPLOADS))) == [400] * MAX_UPLOADS
            start = _rss_mib(rank0)
            assert list(pool.map(refuse, range(4 * MAX_UPLOADS))) == [400] * 4 * MAX_UPLOADS
        freed_growth = _rss_mib(rank0) - start

        pending = []
        held = {"latents": latent((1, 4, 2, 32, 32))}  # a decode of a second or more on these two ranks
        first = threading.Thread(target=lambda: pending.append(server.post("/v1/decode", held, timeout=90)))
        first.start()
        # the first request in flight (not still queued: it would leave the queue after `places` is
        # taken, and the queue would never fill), then held there by rank 1, stopped within its decode.
        # Stopped before the request arrived, rank 1 could instead hold an idle rank 0's ping, sent
        # while nothing is in flight, and the request would wait in the queue behind it.
        _until(lambda: (s := _state(server))["in_flight"] == 1 and s["queue_depth"] == 0, 30, "the first in flight")
        os.kill(rank1, signal.SIGSTOP)
        places = MAX_QUEUE
        before = _rss_mib(rank0)
        body = save({"latents": latent(big, seed=9)})
        threads = [
            threading.Thread(target=lambda: pending.append(server.post("/v1/decode", body, timeout=90)))
            for _ in range(places)
        ]
        for t in threads:
            t.start()
        _until(lambda: _state(server)["queue_depth"] == MAX_QUEUE, 60, "the large requests queued")
        after = _rss_mib(rank0)
        queued_mib = places * len(body) / 2**20
        ratio = (after - before) / queued_mib
        assert ratio < 1.5, (before, after, queued_mib)  # each queued request holds its body, once
        assert freed_growth < 16, (start, freed_growth)  # refused bodies were unmapped, not kept for reuse
        os.kill(rank1, signal.SIGKILL)
        for t in [first, *threads]:
            t.join(90)
        assert sorted(p.status_code for p in pending) == [503] * (places + 1), [p.text for p in pending]
        r = httpx.get(server.url + "/health", timeout=5)
        assert r.status_code == 503 and r.json() == {"status": "failed"}  # the peers' addresses only with the key
        assert "error" in _state(server)
        assert server.wait() != 0
        report.record(
            "service",
            "service-queued-memory",
            what=f"vaeshard serve, 2 CPU ranks, rank 1 stopped: {places} decodes of {len(body) / 2**20:.1f} MiB "
            f"bodies queued behind one in flight (--max-queue {MAX_QUEUE}); before, {4 * MAX_UPLOADS} bodies of "
            f"{len(refused) / 2**20:.1f} MiB refused (400) after they arrived, {MAX_UPLOADS} at a time",
            requests=str(places + 1 + 5 * MAX_UPLOADS),
            results=f"rank 0 holds {ratio:.2f} x the queued bodies; {freed_growth:+.1f} MiB resident after the "
            "refused ones",
            time="-",
            memory=f"rank 0: {before:.0f} -> {after:.0f} MiB with {queued_mib:.1f} MiB queued",
        )
    finally:
        server.kill()


def test_an_encode_answer_holds_the_latent_where_the_vae_returns_one():
    # DC-AE's encode returns the latent itself (no distribution): the service answers it as `latent`,
    # and a distribution as `mean` and `logvar`; each equal to diffusers' own encode
    from vaeshard.cli.serve import encode_tensors

    from ..models import autoencoder_kl_small, build

    x = torch.rand(1, 3, 16, 16) * 2 - 1
    dcae = build("dcae")
    with torch.no_grad():
        answer, own = encode_tensors(dcae.encode(x)), dcae.encode(x).latent
    assert set(answer) == {"latent"} and torch.equal(answer["latent"], own)
    kl = autoencoder_kl_small()
    with torch.no_grad():
        answer, dist = encode_tensors(kl.encode(x)), kl.encode(x).latent_dist
    assert set(answer) == {"mean", "logvar"}
    assert torch.equal(answer["mean"], dist.mean) and torch.equal(answer["logvar"], dist.logvar)
