"""`vaeshard serve` as users run it: a subprocess on a free loopback port (2 CPU ranks, gloo, a small
Wan 2.1 VAE saved with `save_pretrained`), driven by a real HTTP client (httpx). Every decode and
encode is compared with diffusers' own single-process result of the same weights in this process.
Every wait is bounded: a server that does not start, answer or exit in time is killed and fails the test.
"""

from __future__ import annotations

import concurrent.futures as futures
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from .. import reliability_report as report
from ..models import build, latent
from ..parity import CPU_FP32

ROOT = Path(__file__).resolve().parents[2]
START_S = 180.0  # a server's ranks import torch and diffusers and load the model (4 ranks on 2 cores)
EXIT_S = 40.0
KEY = "test-key"
SHAPES = [(1, 4, 3, 6, 8), (1, 4, 2, 8, 8), (2, 4, 1, 6, 6)]  # different sizes, frames and batch
MODES = ["auto", "spatial_shard_height", "spatial_shard_width", "tile"]
REPORT_IDS = ["service-load", "service-rank-killed"]  # the rows these tests write into docs/reliability.md
# the load test's requests: CI runs 40; docs/reliability.md records VAESHARD_SERVE_LOAD=300
LOAD = int(os.environ.get("VAESHARD_SERVE_LOAD", "40"))
QUEUE = 7  # the server fixture's --max-queue
CLIENTS = QUEUE + 1  # the load test's concurrent clients: more than the queue's places


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `vaeshard serve` (or any command that serves) in its own process group."""

    def __init__(self, cmd: list[str], port: int, env: dict | None = None) -> None:
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        try:
            _wait_ready(self.url, [self.proc], self.output)
        except AssertionError:
            self.kill()
            raise

    @classmethod
    def start(cls, model: Path, *extra, nproc: int = 2) -> Server:
        port = _free_port()
        cmd = [sys.executable, "-m", "vaeshard", "serve", "--model", str(model), "--device", "cpu",
               "--nproc", str(nproc), "--port", str(port), "--timeout", "60", *map(str, extra)]  # fmt: skip
        return cls(cmd, port)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def post(self, route: str, tensors: dict, key: str | None = KEY, timeout: float = 60, **params):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = save(tensors) if isinstance(tensors, dict) else tensors
        return httpx.post(self.url + route, content=body, params=params, headers=headers, timeout=timeout)

    def health(self) -> tuple[int, dict]:
        r = httpx.get(self.url + "/health", headers={"X-API-Key": KEY}, timeout=5)  # the details need the key
        return r.status_code, r.json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", headers={"X-API-Key": KEY}, timeout=5).text

    def wait(self, timeout: float = EXIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the server did not exit within {timeout:g} s:\n{self.output()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None or _alive_group(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


def _wait_ready(url: str, procs: list, output) -> None:
    """Until `url`'s /health answers 200; AssertionError if a process exits first or START_S passes."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        exited = [p.returncode for p in procs if p.poll() is not None]
        assert not exited, f"the server exited with {exited}:\n{output()}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server did not answer within {START_S:g} s:\n{output()}")


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve-model")
    build("wan21").save_pretrained(root / "wan21")
    return root / "wan21"


@pytest.fixture(scope="module")
def reference(model):
    """diffusers' own single-process decode and encode of the same weights."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(str(model)).eval()
    cache: dict = {}

    def decode(z):
        key = ("d", tuple(z.shape), float(z.sum()))
        if key not in cache:
            with torch.no_grad():
                cache[key] = vae.decode(z).sample
        return cache[key]

    def encode(x):
        with torch.no_grad():
            dist = vae.encode(x).latent_dist
        return dist.mean, dist.logvar

    decode.encode = encode
    return decode


@pytest.fixture(scope="module")
def server(model):
    s = Server.start(model, "--api-key", KEY, "--max-queue", QUEUE, "--max-body-mb", 1)
    yield s
    s.kill()


def _uint8(video):
    return ((video / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()


# --- results ---------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_concurrent_requests_of_different_shapes_and_modes_match_diffusers(server, reference):
    cases = [(SHAPES[k % 3], MODES[k % 4], k) for k in range(8)]  # every shape, every mode, each twice

    def one(case):
        shape, mode, seed = case
        z = latent(shape, seed=seed)
        r = server.post("/v1/decode", {"latents": z}, mode=mode)
        assert r.status_code == 200, r.text
        return z, load(r.content)["sample"]

    with futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, cases))
    for (shape, mode, _), (z, got) in zip(cases, results):
        ref = reference(z)
        assert got.shape == ref.shape, (shape, mode)
        assert (got - ref).abs().max() <= CPU_FP32, (shape, mode)


@pytest.mark.timeout(120)
def test_an_answer_of_several_socket_writes_arrives_whole(server, reference):
    from vaeshard.cli.http import SEND_BYTES

    z = latent((1, 4, 3, 16, 24), seed=5)
    r = server.post("/v1/decode", {"latents": z})
    assert r.status_code == 200, r.text
    assert len(r.content) > 2 * SEND_BYTES  # sent in at least three pieces
    got, ref = load(r.content)["sample"], reference(z)
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= CPU_FP32


@pytest.mark.timeout(120)
def test_formats_mp4_png_zip_and_exact(server, reference):
    import av

    z = latent(SHAPES[0], seed=7)
    frames = _uint8(reference(z))[0]
    r = server.post("/v1/decode", {"latents": z}, format="png", mode="spatial_shard_width")
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip", r.text
    names = sorted(zipfile.ZipFile(io.BytesIO(r.content)).namelist())
    assert names == [f"{t:05d}.png" for t in range(frames.shape[0])]
    from PIL import Image

    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        for t, name in enumerate(names):
            got = np.array(Image.open(io.BytesIO(zf.read(name))))
            assert np.abs(got.astype(int) - frames[t].astype(int)).max() <= 1  # within 1e-5 before rounding
    r = server.post("/v1/decode", {"latents": z}, format="mp4", fps=8)
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    with av.open(io.BytesIO(r.content)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == frames.shape[0] and decoded[0].shape == frames.shape[1:]
    assert b"moof" in r.content[:4096]  # fragmented: playable as it arrives
    r = server.post("/v1/decode", {"latents": z}, exact="true", mode="spatial_shard_height")
    assert r.status_code == 200
    assert (load(r.content)["sample"] - reference(z)).abs().max() <= CPU_FP32


@pytest.mark.timeout(120)
def test_encode_answers_the_latent_distribution(server, reference):
    x = torch.rand(1, 3, 5, 48, 64, generator=torch.Generator().manual_seed(3)) * 2 - 1
    r = server.post("/v1/encode", {"pixels": x}, mode="spatial_shard_height")
    assert r.status_code == 200, r.text
    got = load(r.content)
    mean, logvar = reference.encode(x)
    assert (got["mean"] - mean).abs().max() <= CPU_FP32
    assert (got["logvar"] - logvar).abs().max() <= CPU_FP32


# --- errors ----------------------------------------------------------------------------------------

ERRORS = [
    # id, route, body, params, expected status, words in the JSON error
    ("not-safetensors", "/v1/decode", b"\x00garbage", {}, 400, "not a safetensors file"),
    ("empty-body", "/v1/decode", b"", {}, 400, "empty"),
    ("wrong-key", "/v1/decode", {"noise": latent((1, 4, 1, 4, 4))}, {}, 400, "no tensor named 'latents'"),
    ("wrong-channels", "/v1/decode", {"latents": torch.zeros(1, 5, 1, 4, 4)}, {}, 400, "expects 4"),
    ("four-d", "/v1/decode", {"latents": torch.zeros(1, 4, 4, 4)}, {}, 400, "5-D"),
    ("integer-latents", "/v1/decode", {"latents": torch.zeros(1, 4, 1, 4, 4, dtype=torch.int32)}, {}, 400, "floating"),
    ("bad-format", "/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"format": "gif"}, 400, "format='gif'"),
    ("bad-mode", "/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"mode": "ring"}, 400, "mode='ring'"),
    ("bad-fps", "/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"fps": "0"}, 400, "fps=0"),
    ("unknown-param", "/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, {"size": "2"}, 400, "size"),
    ("mp4-of-a-batch", "/v1/decode", {"latents": latent((2, 4, 1, 4, 4))}, {"format": "mp4"}, 400, "batch of 2"),
    (
        "timestep-not-taken",
        "/v1/decode",
        {"latents": latent((1, 4, 1, 4, 4))},
        {"timestep": "0.05"},
        400,
        "no decoder timestep",
    ),
    ("encode-wrong-channels", "/v1/encode", {"pixels": torch.zeros(1, 4, 1, 16, 16)}, {}, 400, "C = 3"),
    ("too-large", "/v1/decode", {"latents": torch.zeros(1, 4, 1, 256, 300)}, {}, 413, "at most"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_invalid_requests_get_a_json_error_and_the_service_keeps_serving(server, reference, case):
    _, route, body, params, status, words = case
    r = server.post(route, body, **params)
    assert r.status_code == status, r.text
    assert words in r.json()["error"], r.json()
    assert server.health()[0] == 200


@pytest.mark.timeout(60)
def test_the_api_key_is_required_except_for_health(server):
    z = latent((1, 4, 1, 4, 4))
    for key in (None, "wrong"):
        r = server.post("/v1/decode", {"latents": z}, key=key)
        assert r.status_code == 401 and "API key" in r.json()["error"]
    assert httpx.get(server.url + "/metrics", timeout=5).status_code == 401
    assert httpx.get(server.url + "/health", timeout=5).json() == {"status": "ready"}  # no details without it
    code, state = server.health()
    assert code == 200 and state["status"] == "ready" and state["world_size"] == 2
    assert [r["rank"] for r in state["ranks"]] == [0, 1] and state["family"] == "wan"


@pytest.mark.timeout(60)
def test_metrics_move_with_requests(server):
    def value(text: str, name: str, **labels) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = server.metrics()
    assert server.post("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}).status_code == 200
    assert server.post("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}, mode="gif").status_code == 400
    after = server.metrics()
    for name, labels, step in [
        ("vaeshard_decode_seconds_count", {"family": "wan", "world_size": "2"}, 1),
        ("vaeshard_requests_total", {"op": "decode", "status": "ok"}, 1),
        ("vaeshard_http_requests_total", {"route": "/v1/decode", "code": "200"}, 1),
        ("vaeshard_http_requests_total", {"route": "/v1/decode", "code": "400"}, 1),
        ("vaeshard_http_request_seconds_count", {"route": "/v1/decode"}, 2),
    ]:
        assert value(after, name, **labels) - value(before, name, **labels) == step, name
    assert "vaeshard_queue_depth 0.0" in after


@pytest.mark.timeout(120)
def test_a_full_queue_answers_429_and_the_admitted_requests_complete(server, reference):
    z = latent((1, 4, 2, 12, 12), seed=11)  # long enough that a burst finds the queue full
    with futures.ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(lambda _: server.post("/v1/decode", {"latents": z}), range(10)))
    codes = sorted(r.status_code for r in responses)
    # 7 hold a place in the queue from their headers on, and the first frees its place once in flight
    assert set(codes) == {200, 429} and codes.count(200) >= 7, codes
    assert all("queue is full" in r.json()["error"] for r in responses if r.status_code == 429)
    ref = reference(z)
    for r in responses:
        if r.status_code == 200:
            assert (load(r.content)["sample"] - ref).abs().max() <= CPU_FP32
    assert server.health()[0] == 200


@pytest.mark.timeout(300)
def test_load_from_more_clients_than_queue_places_none_lost_or_crossed_memory_flat(server, reference):
    shapes = [(1, 4, 1, 4, 4), (1, 4, 2, 4, 6), (1, 4, 1, 6, 4)]
    inputs = [latent(shapes[i % 3], seed=100 + i % 12) for i in range(max(LOAD, 12))]  # 12 distinct requests
    pids = [r["pid"] for r in server.health()[1]["ranks"]]
    refused = []

    # one client more than the queue has places: at times the queue is rightly full and a request is
    # answered 429 with a Retry-After; the client sends it again after that time, as a client should
    def send(i):
        started = time.perf_counter()
        for _ in range(30):
            r = server.post("/v1/decode", {"latents": inputs[i]})
            if r.status_code != 429:
                break
            refused.append(i)
            time.sleep(float(r.headers["Retry-After"]))
        return i, r.status_code, r.content, time.perf_counter() - started

    def run(count):
        with futures.ThreadPoolExecutor(CLIENTS) as pool:
            return list(pool.map(send, range(count)))

    run(12)  # warm: every request once, so later growth is a leak, not a first allocation
    baseline = [_rss_mib(p) for p in pids]
    started = time.perf_counter()
    results = run(len(inputs))
    wall = time.perf_counter() - started
    after = [_rss_mib(p) for p in pids]
    assert all(code == 200 for _, code, _, _ in results), sorted({code for _, code, _, _ in results})
    for i, _, body, _ in results:  # each answer is its own request's decode
        assert (load(body)["sample"] - reference(inputs[i])).abs().max() <= CPU_FP32, i
    growth = [a - b for a, b in zip(after, baseline)]
    assert max(growth) < 64, (baseline, after)
    latencies = sorted(t for *_, t in results)
    p50, p99 = latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    report.record(
        "service",
        "service-load",
        what=f"vaeshard serve, 2 CPU ranks; small decodes of 3 shapes (mode auto) from {CLIENTS} concurrent "
        f"clients against a queue of {QUEUE} places (a 429 is sent again after its Retry-After)",
        requests=str(len(results)),
        results=f"{len(results)} x 200 OK ({len(refused)} answered 429 first), each equal to diffusers' decode "
        "of its own latents (<= 1e-5); none lost or crossed",
        time=f"{len(results) / wall:.1f} requests/s; latency (queueing included) p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms",
        memory=" / ".join(f"{b:.0f} -> {a:.0f} MiB" for b, a in zip(baseline, after)),
    )


# --- stopping and failing --------------------------------------------------------------------------


def _torchrun_agent(node_port: int, nnodes_port: int, script: list[str], log, fault: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{nnodes_port}", "--rdzv-id", "serve-test",
           "--max-restarts", "0", *script]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "SERVE_PORT": str(node_port),
             "VAESHARD_SERVE_FAULT": str(fault)},
    )  # fmt: skip


class TorchrunGroup:
    """Two torchrun agents of 2 CPU ranks each, one c10d rendezvous on loopback (two machines' worth):
    each rank decodes through the library (tests/test_cli/serve_ranks.py), then they serve together."""

    def __init__(self, model: Path, directory: Path, z) -> None:
        self.directory = directory
        (directory / "z.safetensors").write_bytes(save({"latents": z}))
        port, rdzv = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{port}"
        script = [
            "-m",
            "tests.test_cli.serve_ranks",
            str(model),
            str(directory / "z.safetensors"),
            str(directory),
            str(port),
        ]
        self.logs = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]
        self.fault = directory / "fault.json"  # the service's test hook (cli/serve.py): holds a request on a rank
        self.agents = [_torchrun_agent(port, rdzv, script, self.logs[k], self.fault) for k in range(2)]
        _wait_ready(self.url, self.agents, self.output)

    def output(self) -> str:
        text = []
        for log in self.logs:
            log.seek(0)
            text.append(log.read())
        return "\n---\n".join(text)

    def kill(self) -> None:
        for a in self.agents:
            if _alive_group(a.pid):
                os.killpg(a.pid, signal.SIGKILL)
                a.wait(timeout=10)


@pytest.fixture(scope="module")
def torchrun_group(model, tmp_path_factory):
    group = TorchrunGroup(model, tmp_path_factory.mktemp("torchrun"), latent((1, 4, 3, 8, 8), seed=21))
    yield group
    group.kill()


@pytest.mark.timeout(240)
def test_two_torchrun_agents_form_one_group_for_the_library_and_the_service(torchrun_group, reference):
    group = torchrun_group
    library = [json.loads((group.directory / f"library-{r}.json").read_text()) for r in range(4)]
    assert all(row["max_diff"] <= CPU_FP32 for row in library), library
    assert sorted(row["rank"] for row in library) == [0, 1, 2, 3] and library[0]["world"] == 4
    state = httpx.get(group.url + "/health", timeout=5).json()
    assert state["world_size"] == 4 and [r["rank"] for r in state["ranks"]] == [0, 1, 2, 3]
    z = latent((1, 4, 3, 8, 8), seed=21)
    for mode in ("spatial_shard_height", "tile"):
        r = httpx.post(group.url + "/v1/decode", content=save({"latents": z}), params={"mode": mode}, timeout=60)
        assert r.status_code == 200, r.text
        assert (load(r.content)["sample"] - reference(z)).abs().max() <= CPU_FP32


@pytest.mark.timeout(120)
def test_sigterm_finishes_the_request_in_flight_and_every_rank_exits_0(torchrun_group, reference):
    """(It ends the torchrun group.) As a supervisor stops the service: SIGTERM to rank 0, with one
    request in flight and one queued; rank 0 drains and stops the group. The request in flight is held
    on rank 1 by the test hook until the drain has begun, so the order of events is the same under any load."""
    group = torchrun_group
    z = latent((1, 4, 3, 16, 16), seed=12)
    responses: dict = {}

    def health() -> dict:
        return httpx.get(group.url + "/health", timeout=5).json()

    def until(condition, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not within 60 s\n{group.output()}"
            time.sleep(0.02)

    def send(name):
        responses[name] = httpx.post(group.url + "/v1/decode", content=save({"latents": z}), timeout=90)

    group.fault.write_text(json.dumps({"rank": 1, "action": "hang"}))
    hit = Path(str(group.fault) + ".hit")
    first = threading.Thread(target=send, args=("in flight",))
    first.start()
    until(hit.exists, "the request in flight did not reach rank 1")
    second = threading.Thread(target=send, args=("queued",))
    second.start()
    until(lambda: health()["queue_depth"] == 1, "the second request was not queued")
    rank0 = next(r["pid"] for r in health()["ranks"] if r["rank"] == 0)
    os.kill(rank0, signal.SIGTERM)
    second.join(60)
    assert responses["queued"].status_code == 503 and "shutting down" in responses["queued"].json()["error"]
    group.fault.unlink()  # the request in flight goes on, and finishes within the drain
    first.join(60)
    for a in group.agents:
        a.wait(timeout=60)
    assert [a.returncode for a in group.agents] == [0, 0], group.output()
    assert responses["in flight"].status_code == 200
    assert (load(responses["in flight"].content)["sample"] - reference(z)).abs().max() <= CPU_FP32


@pytest.mark.timeout(150)
def test_a_killed_rank_fails_the_requests_with_503_and_the_service_exits_non_zero(server):
    """(The last test on the shared server: it ends it.)"""
    try:
        ranks = server.health()[1]["ranks"]
        z = latent((1, 4, 3, 16, 16), seed=13)
        with futures.ThreadPoolExecutor(3) as pool:
            pending = [pool.submit(server.post, "/v1/decode", {"latents": z}) for _ in range(3)]
            deadline = time.monotonic() + 30
            while server.health()[1]["in_flight"] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            killed_at = time.monotonic()
            os.kill(ranks[1]["pid"], signal.SIGKILL)
            responses = [p.result(timeout=60) for p in pending]
        codes = [r.status_code for r in responses]
        assert codes.count(503) >= 2 and set(codes) <= {200, 503}, codes  # the one in flight may have finished
        assert all("failed" in r.json()["error"] for r in responses if r.status_code == 503)
        code, state = server.health()
        assert code == 503 and state["status"] == "failed" and "rank" in state["error"], state
        assert server.post("/v1/decode", {"latents": latent((1, 4, 1, 4, 4))}).status_code == 503
        exit_code = server.wait()
        assert exit_code != 0, server.output()
        report.record(
            "service",
            "service-rank-killed",
            what="vaeshard serve, 2 CPU ranks; rank 1 killed (SIGKILL) during a request, 2 more queued",
            requests="3",
            results=f"HTTP {', '.join(map(str, codes))}; /health 503 'failed'; new requests 503",
            time=f"exit code {exit_code}, {time.monotonic() - killed_at:.1f} s after the kill",
            memory="-",
        )
    finally:
        server.kill()


# -- the request check: the family's own shape factors (no server) -----------------------------------------


def test_request_check_uses_the_family_shape_factors():
    """A request's output is checked with the family's real factors (`vaeshard.shape_facts`), not Wan's:
    Mochi's 6x in time, LTX-Video's 32x in space and its unpatchified 3 channels."""
    from vaeshard.cli import http
    from vaeshard.cli import io as cli_io

    mochi = cli_io.named_model("mochi")
    # Mochi 1's own clip: 28 latent frames of 60 x 106 decode to 163 frames of 480 x 848
    assert (mochi.frames_out(28), mochi.spatial_ratio(), mochi.sample_channels()) == (163, 8, 3)
    http._check(torch.empty((1, 12, 28, 60, 106), device="meta"), "decode", {"timestep": None, "format": "mp4"}, mochi)
    ltx = cli_io.named_model("ltx")
    assert (ltx.frames_out(2), ltx.spatial_ratio(), ltx.sample_channels()) == (9, 32, 3)
    http._check(torch.empty((1, 128, 2, 3, 3), device="meta"), "decode", {"timestep": None, "format": "mp4"}, ltx)
    with pytest.raises(http.HTTPError, match="at least 32x32"):
        http._check(torch.empty((1, 3, 9, 16, 16), device="meta"), "encode", {}, ltx)
