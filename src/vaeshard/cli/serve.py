"""`vaeshard serve`'s ranks: one request at a time on the whole group, in arrival order.

Every rank loads the VAE and runs `rank_loop`. Rank 0 also runs the HTTP front end (cli/http.py) in its
main thread; requests it admits wait in a bounded `Service` queue, and its dispatcher thread takes them
in order: it checks each one with the library's own request check (`vaeshard.check`) before anything
reaches another rank, sends its header and input to the other ranks over the control channel
(launch.Control, gloo), every rank runs the same `_execute` (a streamed decode or an encode through the
public API, the output on rank 0, on a process group of its own), and each rank answers with its
outcome and peak memory. A request that fails on a rank is answered with that rank's error (500, or
400 for bad input); the library has then told every rank within seconds, and the ranks replace the
decode group, which the failure left unusable, and serve on. A request whose client went away or whose
deadline passed is dropped from the queue, or its decode stopped at the next chunk on every rank.

Between requests rank 0 sends a ping every HEARTBEAT_S, so a rank that died is found within that time
even while idle. A heartbeat on a group of its own, which every rank answers from a thread whatever it
is doing, tells readiness: a rank that stopped answering (stopped, hung) makes the service unready
within READY_STALE_S. A broken group fails the request in flight and every queued one (503), `/health`
says so for FAILED_LINGER_S, and the process exits non-zero for a supervisor to restart it. SIGTERM
drains: the request in flight finishes, the queued ones get 503, and every rank exits 0; past
`--drain-timeout` the request in flight gets 503 and the exit code is EXIT_DRAIN_CUT.

Test hook: where VAESHARD_SERVE_FAULT names a file, every rank reads it at each call of its VAE's decoder;
`{"rank": R, "action": "raise"}` makes rank R raise there once, `{"rank": R, "action": "hang"}` makes it
wait there while the file exists; with `"at": "input"`, where the rank takes a request's input instead
(before the request's agreement). A rank writes the file's name plus ".hit" when it acts on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue as queue_mod
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import vaeshard

HEARTBEAT_S = 1.0  # an idle rank 0 checks the group this often; the heartbeat runs this often
READY_STALE_S = 5.0  # a heartbeat older than this: some rank stopped answering, the service is not ready
FAILED_LINGER_S = 3.0  # a failed service keeps answering (503, /health) this long before it exits
STOP_AFTER_CUT_S = 10.0  # after a drain was cut, how long the group may take to stop before rank 0 exits anyway
DEFAULT_DRAIN_S = 120.0  # --drain-timeout: what the docs' systemd and Kubernetes examples allow
DEFAULT_MAX_REQUEST_S = 3600.0  # --max-request-timeout
EXIT_DRAIN_CUT = 3  # the exit code after a SIGTERM whose drain outlasted --drain-timeout
FAULT_ENV = "VAESHARD_SERVE_FAULT"
STATUS_READY, STATUS_STOPPING, STATUS_FAILED = "ready", "stopping", "failed"
STATUS_UNRESPONSIVE = "unresponsive"  # reported while a rank does not answer the heartbeat
# why a request stopped before its end -> (status code, message)
STOPPED = {
    "client": (499, "the client went away"),
    "deadline": (504, "the request's deadline passed before it finished"),
    "drain": (503, "the service stopped (SIGTERM) before this request finished: --drain-timeout passed"),
}
_OPS = ("decode", "encode")


class GroupFailed(RuntimeError):
    """A rank of the service failed or left: the group cannot serve any more."""


def encode_tensors(encoded) -> dict:
    """The tensors of an encode's answer (float32, on the CPU): `mean` and `logvar` of the latent
    distribution, or `latent` where the VAE's encode returns the latent itself (DC-AE)."""
    dist = getattr(encoded, "latent_dist", None)
    if dist is None:
        return {"latent": encoded.latent.float().contiguous().cpu()}
    return {"mean": dist.mean.float().contiguous().cpu(), "logvar": dist.logvar.float().contiguous().cpu()}


class _Stopped(Exception):
    """Rank 0 stops a request before its end (the reason: a key of STOPPED)."""


@dataclass(frozen=True)
class ServeJob:
    """What `vaeshard serve` was asked for (checked by cli/commands.py)."""

    model: object  # cli/io.py's ModelSource
    dtype: str
    mode: str  # the default of a request's `mode`
    options: dict  # parallelize's exact and fast: `exact` is a request's default
    timeout: float
    host: str
    port: int
    api_key: str | None
    max_queue: int
    max_body: int  # bytes
    fps: int
    preset: str
    ready_file: str | None = None  # written with the address once the server listens
    limits: object = None  # httplimits.Limits: connections, uploads, timeouts (None: the defaults)
    drain_timeout: float = DEFAULT_DRAIN_S  # after SIGTERM, the longest the request in flight may take
    max_request_timeout: float = DEFAULT_MAX_REQUEST_S  # a request's deadline, and the most it may ask


@dataclass
class Request:
    """One admitted HTTP request: its input (CPU), its settings, and where its output goes."""

    op: str  # "decode" or "encode"
    tensor: object
    format: str  # decode: "mp4", "zip" or "safetensors"; encode: "safetensors"
    fps: int
    mode: str
    exact: bool
    timestep: float | None
    out: object  # http.Channel: bytes, then the end or an error
    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # time.monotonic() past which it is stopped (504)
    reason: str | None = None  # why it was cancelled: a key of STOPPED

    def cancel(self, reason: str) -> None:
        """Stop it: dropped from the queue, or its decode stopped at the next chunk (first reason wins)."""
        if self.reason is None:
            self.reason = reason
        self.cancelled.set()

    def expired(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.cancel("deadline")
        return self.cancelled.is_set() and self.reason == "deadline"


class Service:
    """Rank 0's side of the group: the bounded queue, the dispatcher thread, the heartbeat's monitor,
    and the state that `/health` reports."""

    def __init__(self, ctx, job: ServeJob, vae, control, family: str, ranks: list[dict]) -> None:
        self.ctx, self.job, self.vae, self.control, self.family = ctx, job, vae, control, family
        self.ranks = ranks  # each rank's host, pid and device
        self.status = STATUS_READY
        self.error: str | None = None
        self.in_flight = 0
        self.failed_at: float | None = None
        self.draining_since: float | None = None  # time.monotonic() of the SIGTERM
        self.drain_cut = False
        self._current: Request | None = None
        self._queue: queue_mod.Queue = queue_mod.Queue()
        self._waiting = 0  # admitted, not yet taken by the dispatcher
        self._reserved = 0  # places held for requests whose body is still arriving
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._dispatch, name="vaeshard-dispatch", daemon=True)
        self._beat_at = time.monotonic()  # when every rank last answered the heartbeat
        self._beat_error: str | None = None
        self._beats_stop = threading.Event()
        self._monitor = threading.Thread(target=self._heartbeats, name="vaeshard-heartbeat", daemon=True)
        self.on_request = None  # called with (op, seconds, peaks by rank) after each request (metrics)

    # --- the HTTP side -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._monitor.start()

    @property
    def queue_depth(self) -> int:
        return self._waiting

    def reserve(self) -> str | None:
        """Hold a place in the queue for a request before its body is read (then `submit` or `release`
        it): None, or why not: "full", or the service's status. Queued requests and bodies being received
        together are at most max_queue, which bounds rank 0's memory."""
        with self._lock:
            if self.status != STATUS_READY:
                return self.status
            if self._waiting + self._reserved >= self.job.max_queue:
                return "full"
            self._reserved += 1
        return None

    def release(self) -> None:
        with self._lock:
            self._reserved -= 1

    def submit(self, request: Request) -> str | None:
        """Queue `request` in the place `reserve` held; None, or why not: the service's status."""
        with self._lock:
            self._reserved -= 1
            if self.status != STATUS_READY:
                return self.status
            self._waiting += 1
            self._queue.put(request)
        return None

    def drain(self) -> None:
        """Stop taking requests: the one in flight finishes, the queued ones are answered 503."""
        with self._lock:
            if self.status == STATUS_READY:
                self.status = STATUS_STOPPING
            if self.draining_since is None:
                self.draining_since = time.monotonic()
        self._fail_queued(503, "the service is shutting down")

    def idle(self) -> bool:
        return self.in_flight == 0 and self._waiting == 0

    def cut(self) -> None:
        """The drain outlasted --drain-timeout: answer the request in flight 503 now, and stop its decode
        at its next chunk."""
        self.drain_cut = True
        request = self._current
        if request is not None:
            request.cancel("drain")
            code, message = STOPPED["drain"]
            request.out.fail(code, f"{message} ({self.job.drain_timeout:g} s)")

    def stop(self, timeout: float | None = None) -> bool:
        """After the HTTP server stopped: end every rank's loop and wait for the dispatcher (at most
        `timeout` seconds); whether it ended."""
        self.drain()
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def readiness(self) -> tuple[str, str | None]:
        """(status, why not ready): "ready" only while every rank answers the heartbeat."""
        if self.status != STATUS_READY:
            return self.status, self.error
        if self._beat_error is not None:
            return STATUS_UNRESPONSIVE, self._beat_error
        age = time.monotonic() - self._beat_at
        if age > READY_STALE_S:
            return STATUS_UNRESPONSIVE, f"a rank has not answered the heartbeat for {age:.0f} s (stopped or hung)"
        return STATUS_READY, None

    def health(self) -> dict:
        status, why = self.readiness()
        return {
            "status": status,
            "model": self.job.model.description,
            "family": self.family,
            "world_size": self.ctx.world,
            "ranks": self.ranks,
            "queue_depth": self.queue_depth,
            "in_flight": self.in_flight,
            "heartbeat_age_s": round(time.monotonic() - self._beat_at, 1),
            **({"error": why} if why else {}),
        }

    # --- the heartbeat -----------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        try:
            while not self._beats_stop.wait(HEARTBEAT_S):
                self.control.heartbeat()
                self._beat_at = time.monotonic()
            self.control.heartbeat(go=False)
        except Exception as exc:  # a rank left: its request's waits end now (a wait in the store would not)
            self._beat_error = f"the heartbeat failed: {_first_line(exc)}"
            vaeshard.abort(self.vae, f"a rank of the service left ({self._beat_error})")

    # --- the dispatcher ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        try:
            while True:
                try:
                    request = self._queue.get(timeout=HEARTBEAT_S)
                except queue_mod.Empty:
                    if self._stop.is_set():
                        break
                    self._send({"op": "ping"})
                    continue
                with self._lock:
                    self._waiting -= 1
                    self.in_flight = 1
                try:
                    if request.expired():
                        request.out.fail(504, f"{STOPPED['deadline'][1]}: it waited in the queue")
                    elif request.cancelled.is_set():
                        continue  # its client went away while it waited: nobody to answer
                    elif self.status != STATUS_READY:
                        request.out.fail(503, f"the service is {self.status}")
                    else:
                        self._serve_one(request)
                except GroupFailed:
                    request.out.fail(503, "a rank of the group failed during the request")
                    raise
                finally:
                    self.in_flight = 0
            # the heartbeats end first: no rank may leave while its answering thread is inside one
            self._beats_stop.set()
            self._monitor.join(READY_STALE_S)
            self._send({"op": "stop"})
        except GroupFailed as exc:
            self._failed(str(exc))
        finally:
            self._beats_stop.set()

    def _send(self, header: dict):
        try:
            return self.control.broadcast(header)
        except Exception as exc:  # a peer closed its connection or did not answer in time
            raise GroupFailed(f"a rank of the group did not answer: {_first_line(exc)}") from exc

    def _prepare(self, request: Request):
        """(the input every rank decodes, as a CPU tensor, and the request's header), checked here with
        the library's own request check before anything reaches another rank. TypeError or ValueError
        for a request the group must not see."""
        from .bench import torch_dtype

        if request.op not in _OPS or request.mode not in vaeshard.MODES:
            raise ValueError(f"op {request.op!r}, mode {request.mode!r}: not a request this service takes")
        tensor = request.tensor
        if tensor.dtype in vaeshard.INPUT_DTYPES:  # others stay as they are, for the check to refuse them
            tensor = tensor.to(torch_dtype(self.job.dtype) if self.job.dtype else self.vae.dtype)
        vaeshard.check(self.vae, tensor.to(self.ctx.device), request.op)
        header = {
            "op": request.op,
            "shape": [int(n) for n in tensor.shape],
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "mode": request.mode,
            "exact": bool(request.exact),
            "timestep": None if request.timestep is None else float(request.timestep),
        }
        return tensor.contiguous(), header

    def _serve_one(self, request: Request) -> None:
        self._current = request
        started = time.perf_counter()
        try:
            try:
                tensor, header = self._prepare(request)
            except (TypeError, ValueError) as exc:
                request.out.fail(400, str(exc))
                return
            self._send(header)
            try:
                self.control.broadcast_tensor(tensor)
            except Exception as exc:
                raise GroupFailed(f"a rank of the group did not take the input: {_first_line(exc)}") from exc
            outcome = _execute(self.vae, self.job, header, tensor, self.ctx, request)
            try:
                outcomes = self.control.gather(outcome)
            except Exception as exc:
                request.out.fail(503, "a rank of the group failed during the request")
                raise GroupFailed(f"a rank of the group failed during a request: {_first_line(exc)}") from exc
            self._answer(request, outcomes)
            if self.on_request is not None:
                peaks = {r: o["peak"] for r, o in enumerate(outcomes) if o["peak"] is not None}
                self.on_request(request.op, time.perf_counter() - started, peaks)
        finally:
            self._current = None

    def _answer(self, request: Request, outcomes: list[dict]) -> None:
        failed = [(r, o) for r, o in enumerate(outcomes) if o["status"] == "error"]
        if failed:
            # the rank where it began, not the ranks that stopped waiting for it
            rank, first = next(((r, o) for r, o in failed if not o["follows"]), failed[0])
            code = 400 if first["user_error"] else 500
            request.out.fail(code, f"rank {rank}: {first['message']}")
            if not all(o["user_error"] for _, o in failed):
                logging.getLogger("vaeshard").error(
                    "vaeshard serve: a request failed on rank %d: %s", rank, first["message"]
                )
                self._regroup()
        elif outcomes[0]["status"] == "stopped":
            code, message = STOPPED[request.reason or "client"]
            request.out.fail(code, message)
        else:
            request.out.end()

    def _regroup(self) -> None:
        """Every rank moves the decodes to a new process group: a request that failed mid-way left the
        ranks at different collectives of the old one, which vaeshard then refuses to use."""
        self._send({"op": "regroup"})
        try:
            _configure(
                self.vae, self.job, self.job.mode, bool(self.job.options.get("exact")), self.control.decode_group()
            )
        except Exception as exc:
            raise GroupFailed(f"the ranks could not form a new decode group: {_first_line(exc)}") from exc

    def _failed(self, message: str) -> None:
        logging.getLogger("vaeshard").error("vaeshard serve: %s", message)
        with self._lock:
            self.status, self.error, self.failed_at = STATUS_FAILED, message, time.time()
        self._fail_queued(503, f"the service failed: {message}")

    def _fail_queued(self, code: int, message: str) -> None:
        while True:
            try:
                request = self._queue.get_nowait()
            except queue_mod.Empty:
                return
            with self._lock:
                self._waiting -= 1
            request.out.fail(code, message)


# --- every rank ------------------------------------------------------------------------------------


def _execute(vae, job: ServeJob, header: dict, tensor, ctx, request: Request | None) -> dict:
    """One request on this rank (every rank calls it with the same header): {"status", "message",
    "user_error", "follows", "peak"}; `follows`: this rank's error is its wait for another rank ending.
    Rank 0 writes the output into `request.out`, and stops the request where it was cancelled."""
    import torch

    from .bench import torch_dtype
    from .writer import ChunkWriter

    outcome = {"status": "ok", "message": "", "user_error": False, "follows": False, "peak": None}
    try:
        try:
            _configure(vae, job, header["mode"], header["exact"])
            x = tensor.to(ctx.device, torch_dtype(job.dtype) if job.dtype else vae.dtype)
            if os.environ.get(FAULT_ENV):
                _injected(ctx.rank, "input")
        except Exception as exc:  # before the request's agreement, where the others wait for this rank
            vaeshard.abort(vae, f"rank {ctx.rank} raised {_first_line(exc)} before the request began")
            raise
        with torch.no_grad():
            if header["op"] == "decode":
                kwargs = {}
                if header["timestep"] is not None:
                    kwargs["temb"] = torch.full((x.shape[0],), header["timestep"], device=x.device)
                writer = None
                if request is not None:
                    writer = ChunkWriter(
                        "response",
                        request.format,
                        request.fps,
                        preset=job.preset,
                        into=request.out,
                        pixels=job.model.pixels(),
                    )
                with writer or contextlib.nullcontext():
                    with vaeshard.stream_decode(vae, x, **kwargs) as chunks:
                        for chunk in chunks:
                            if writer is None:
                                continue
                            if request.cancelled.is_set() or request.expired():
                                raise _Stopped(request.reason)  # the stream's close ends it on every rank
                            writer.write(chunk if chunk.dim() == 5 else chunk.unsqueeze(2))
            else:
                encoded = vae.encode(x)
                if request is not None:
                    from safetensors.torch import save

                    request.out.write(save(encode_tensors(encoded)))
        ctx.synchronize()
    except vaeshard.StreamClosed:
        outcome["status"] = "closed"
    except _Stopped:
        outcome["status"] = "stopped"
    except Exception as exc:  # the request failed on this rank; the group decides what follows
        outcome.update(
            status="error",
            message=_first_line(exc),
            user_error=isinstance(exc, ValueError | TypeError),
            follows=isinstance(exc, vaeshard.CommTimeout),
        )
    if ctx.is_cuda:
        outcome["peak"] = int(torch.cuda.max_memory_allocated(ctx.device))
    return outcome


def _configure(vae, job: ServeJob, mode: str, exact: bool, group=None) -> None:
    """parallelize again only when a request asks for other settings than the last one (doing so
    releases kept CUDA graphs), or on a new decode group."""
    current = getattr(vae, "_vaeshard_serve_settings", None)
    if group is None and current is not None:
        if current[:2] == (mode, exact):
            return
        group = current[2]
    options = dict(job.options, exact=exact)
    vaeshard.parallelize(vae, mode, output="rank0", timeout=job.timeout, group=group, **options)
    object.__setattr__(vae, "_vaeshard_serve_settings", (mode, exact, group))


def _follow(ctx, job: ServeJob, vae, control) -> None:
    """A rank other than 0: run what rank 0 sends until it says stop. A SIGTERM or SIGINT sent to this
    rank waits for that (rank 0 decides when the group stops)."""
    import torch

    from .bench import torch_dtype

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        header = control.broadcast(None)
        if header["op"] == "ping":
            continue
        if header["op"] == "stop":
            return
        if header["op"] == "regroup":
            _configure(vae, job, job.mode, bool(job.options.get("exact")), control.decode_group())
            continue
        # rank 0 checked the request (Service._prepare): its dtype is the decode's
        tensor = torch.empty(header["shape"], dtype=torch_dtype(job.dtype) if job.dtype else vae.dtype)
        control.broadcast_tensor(tensor)
        control.gather(_execute(vae, job, header, tensor, ctx, None))


def _fault_hook(vae, rank: int) -> None:
    """The test hook of the module's docstring, on this rank's VAE decoder."""
    if os.environ.get(FAULT_ENV):
        vae.decoder.register_forward_pre_hook(lambda module, args: _injected(rank, "decoder"))


def _injected(rank: int, point: str) -> None:
    """The test hook at `point` ("decoder": each decoder call; "input": where a rank takes a request's
    input, before the request's agreement): raise or hang where the hook's file says so."""
    path = os.environ.get(FAULT_ENV)
    try:
        with open(path) as f:
            fault = json.load(f)
    except (OSError, TypeError, ValueError):
        return
    if fault.get("rank") != rank or fault.get("at", "decoder") != point:
        return
    with open(path + ".hit", "w") as f:
        f.write(str(time.time()))
    if fault.get("action") == "raise":
        with contextlib.suppress(OSError):
            os.remove(path)
        raise RuntimeError(f"injected fault on rank {rank} ({FAULT_ENV})")
    while os.path.exists(path):  # "hang": until the test removes the file
        time.sleep(0.05)


def serve_worker(ctx, job: ServeJob, front) -> dict:
    """One rank of `vaeshard serve`: load, then serve (rank 0: `front(service, job)`, the HTTP front end
    cli/http.py's `run`) or follow until the service stops.
    Raises GroupFailed when the group broke, so the process exits non-zero. Rank 0 returns
    {"drain_cut": whether a SIGTERM's drain outlasted --drain-timeout}."""
    from .launch import Control

    if not ctx.is_main:
        logging.getLogger("vaeshard").setLevel(logging.ERROR)
    from .bench import torch_dtype

    vae = job.model.load(dtype=torch_dtype(job.dtype), device=ctx.device)
    control = Control(ctx, job.timeout)
    _configure(vae, job, job.mode, bool(job.options.get("exact", False)), control.decode_group())
    _fault_hook(vae, ctx.rank)
    where = {"rank": ctx.rank, "host": socket.gethostname(), "pid": os.getpid(), "device": ctx.device}
    ranks = control.gather(where)
    if not ctx.is_main:
        answering = control.answer_heartbeats()
        try:
            _follow(ctx, job, vae, control)
        except Exception as exc:
            raise GroupFailed(f"rank {ctx.rank} lost the group: {_first_line(exc)}") from exc
        if answering is not None:
            answering.join(READY_STALE_S)  # rank 0 ended the heartbeats before it said stop
        return {}
    service = Service(ctx, job, vae, control, vaeshard.supported_classes()[job.model.class_name].family, ranks)
    service.start()
    front(service, job)  # returns after SIGTERM/SIGINT once drained, or once a failed service lingered
    if service.status == STATUS_FAILED:
        raise GroupFailed(service.error or "the group failed")
    if not service.stop(STOP_AFTER_CUT_S if service.drain_cut else None):
        raise GroupFailed(
            f"the drain was cut after --drain-timeout {job.drain_timeout:g} s and the request in flight did not "
            f"stop within {STOP_AFTER_CUT_S:g} s more"
        )
    return {"drain_cut": service.drain_cut}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


__all__ = [
    "EXIT_DRAIN_CUT",
    "FAILED_LINGER_S",
    "HEARTBEAT_S",
    "READY_STALE_S",
    "GroupFailed",
    "Request",
    "ServeJob",
    "Service",
    "serve_worker",
]
