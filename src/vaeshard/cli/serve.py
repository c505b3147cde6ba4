"""`vaeshard serve`'s ranks: one request at a time on the whole group, in arrival order.

Every rank loads the VAE and runs `rank_loop`. Rank 0 also runs the HTTP front end (cli/http.py) in its
main thread; requests it admits wait in a bounded `Service` queue, and its dispatcher thread takes them
in order: it sends each one's header and input to the other ranks over the control channel
(launch.Control, gloo), every rank runs the same `_execute` (a streamed decode or an encode through the
public API, the output on rank 0), and each rank answers with its outcome and peak memory. Between
requests rank 0 sends a heartbeat every HEARTBEAT_S, so a rank that died is found within that time even
while idle. A broken group fails the request in flight and every queued one (503), `/health` says so
for FAILED_LINGER_S, and the process exits non-zero for a supervisor to restart it. SIGTERM finishes the
request in flight, answers the queued ones 503 and exits 0.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import vaeshard

HEARTBEAT_S = 1.0  # an idle rank 0 checks the group this often
FAILED_LINGER_S = 3.0  # a failed service keeps answering (503, /health) this long before it exits
STATUS_READY, STATUS_STOPPING, STATUS_FAILED = "ready", "stopping", "failed"


class GroupFailed(RuntimeError):
    """A rank of the service failed or left: the group cannot serve any more."""


@dataclass(frozen=True)
class ServeJob:
    """What `vaeshard serve` was asked for (checked by cli/__init__.py)."""

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


class Service:
    """Rank 0's side of the group: the bounded queue, the dispatcher thread, and the state that
    `/health` reports."""

    def __init__(self, ctx, job: ServeJob, vae, control, family: str, ranks: list[dict]) -> None:
        self.ctx, self.job, self.vae, self.control, self.family = ctx, job, vae, control, family
        self.ranks = ranks  # each rank's host, pid and device
        self.status = STATUS_READY
        self.error: str | None = None
        self.in_flight = 0
        self.failed_at: float | None = None
        self._queue: queue_mod.Queue = queue_mod.Queue()
        self._waiting = 0  # admitted, not yet taken by the dispatcher
        self._reserved = 0  # places held for requests whose body is still arriving
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._dispatch, name="vaeshard-dispatch", daemon=True)
        self.on_request = None  # called with (op, seconds, peaks by rank) after each request (metrics)

    # --- the HTTP side -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

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
        self._fail_queued(503, "the service is shutting down")

    def stop(self) -> None:
        """After the HTTP server stopped: end every rank's loop and wait for the dispatcher."""
        self.drain()
        self._stop.set()
        self._thread.join()

    def health(self) -> dict:
        return {
            "status": self.status,
            "model": self.job.model.description,
            "family": self.family,
            "world_size": self.ctx.world,
            "ranks": self.ranks,
            "queue_depth": self.queue_depth,
            "in_flight": self.in_flight,
            **({"error": self.error} if self.error else {}),
        }

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
                if self.status != STATUS_READY and request.out is not None:
                    request.out.fail(503, f"the service is {self.status}")
                    continue
                try:
                    self._serve_one(request)
                except GroupFailed:
                    request.out.fail(503, "a rank of the group failed during the request")
                    raise
            self._send({"op": "stop"})
        except GroupFailed as exc:
            self._failed(str(exc))

    def _send(self, header: dict):
        try:
            return self.control.broadcast(header)
        except Exception as exc:  # a peer closed its connection or did not answer in time
            raise GroupFailed(f"a rank of the group did not answer: {_first_line(exc)}") from exc

    def _serve_one(self, request: Request) -> None:
        self.in_flight = 1
        started = time.perf_counter()
        try:
            header = {
                "op": request.op,
                "shape": tuple(request.tensor.shape),
                "dtype": str(request.tensor.dtype).removeprefix("torch."),
                "mode": request.mode,
                "exact": request.exact,
                "timestep": request.timestep,
            }
            self._send(header)
            try:
                self.control.broadcast_tensor(request.tensor.contiguous())
            except Exception as exc:
                raise GroupFailed(f"a rank of the group did not take the input: {_first_line(exc)}") from exc
            outcome = _execute(self.vae, self.job, header, request.tensor, self.ctx, request)
            try:
                outcomes = self.control.gather(outcome)
            except Exception as exc:
                request.out.fail(503, "a rank of the group failed during the request")
                raise GroupFailed(f"a rank of the group failed during a request: {_first_line(exc)}") from exc
            failed = [(r, o) for r, o in enumerate(outcomes) if o["status"] == "error"]
            if failed:
                rank, first = failed[0]
                code = 400 if first["user_error"] else 500
                request.out.fail(code, f"rank {rank}: {first['message']}")
            elif request.cancelled.is_set():
                request.out.fail(499, "the client went away")
            else:
                request.out.end()
            if self.on_request is not None:
                peaks = {r: o["peak"] for r, o in enumerate(outcomes) if o["peak"] is not None}
                self.on_request(request.op, time.perf_counter() - started, peaks)
        finally:
            self.in_flight = 0

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
    "user_error", "peak"}. Rank 0 writes the output into `request.out`."""
    import torch

    from .bench import torch_dtype
    from .writer import ChunkWriter

    outcome = {"status": "ok", "message": "", "user_error": False, "peak": None}
    try:
        _configure(vae, job, header["mode"], header["exact"])
        x = tensor.to(ctx.device, torch_dtype(job.dtype) if job.dtype else vae.dtype)
        with torch.no_grad():
            if header["op"] == "decode":
                kwargs = {}
                if header["timestep"] is not None:
                    kwargs["temb"] = torch.full((x.shape[0],), header["timestep"], device=x.device)
                writer = None
                if request is not None:
                    writer = ChunkWriter("response", request.format, request.fps, preset=job.preset, into=request.out)
                with writer or contextlib.nullcontext():
                    with vaeshard.stream_decode(vae, x, **kwargs) as chunks:
                        for chunk in chunks:
                            if writer is None:
                                continue
                            if request.cancelled.is_set():
                                break  # the stream's close ends the request on every rank
                            writer.write(chunk if chunk.dim() == 5 else chunk.unsqueeze(2))
            else:
                dist = vae.encode(x).latent_dist
                if request is not None:
                    from safetensors.torch import save

                    request.out.write(
                        save(
                            {
                                "mean": dist.mean.float().contiguous().cpu(),
                                "logvar": dist.logvar.float().contiguous().cpu(),
                            }
                        )
                    )
        ctx.synchronize()
    except vaeshard.StreamClosed:
        outcome["status"] = "closed"
    except Exception as exc:  # the request failed on this rank; the group decides what follows
        outcome.update(status="error", message=_first_line(exc), user_error=isinstance(exc, ValueError))
    if ctx.is_cuda:
        outcome["peak"] = int(torch.cuda.max_memory_allocated(ctx.device))
    return outcome


def _configure(vae, job: ServeJob, mode: str, exact: bool) -> None:
    """parallelize again only when a request asks for other settings than the last one (doing so
    releases kept CUDA graphs)."""
    current = getattr(vae, "_vaeshard_serve_settings", None)
    if current == (mode, exact):
        return
    options = dict(job.options, exact=exact)
    vaeshard.parallelize(vae, mode, output="rank0", timeout=job.timeout, **options)
    object.__setattr__(vae, "_vaeshard_serve_settings", (mode, exact))


def _follow(ctx, job: ServeJob, vae, control) -> None:
    """A rank other than 0: run what rank 0 sends until it says stop. A SIGTERM or SIGINT sent to this
    rank waits for that (rank 0 decides when the group stops)."""
    import torch

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        header = control.broadcast(None)
        if header["op"] == "ping":
            continue
        if header["op"] == "stop":
            return
        tensor = torch.empty(header["shape"], dtype=getattr(torch, header["dtype"]))
        control.broadcast_tensor(tensor)
        control.gather(_execute(vae, job, header, tensor, ctx, None))


def serve_worker(ctx, job: ServeJob) -> dict:
    """One rank of `vaeshard serve`: load, then serve (rank 0) or follow until the service stops.
    Raises GroupFailed when the group broke, so the process exits non-zero."""
    from .launch import Control

    if ctx.backend is not None and not ctx.torchrun:
        _die_with_parent()
    if not ctx.is_main:
        logging.getLogger("vaeshard").setLevel(logging.ERROR)
    from .bench import torch_dtype

    vae = job.model.load(dtype=torch_dtype(job.dtype), device=ctx.device)
    _configure(vae, job, job.mode, bool(job.options.get("exact", False)))
    control = Control(ctx, job.timeout)
    where = {"rank": ctx.rank, "host": socket.gethostname(), "pid": os.getpid(), "device": ctx.device}
    ranks = control.gather(where)
    if not ctx.is_main:
        try:
            _follow(ctx, job, vae, control)
        except Exception as exc:
            raise GroupFailed(f"rank {ctx.rank} lost the group: {_first_line(exc)}") from exc
        return {}
    from . import http

    service = Service(ctx, job, vae, control, vaeshard.supported_classes()[job.model.class_name].family, ranks)
    service.start()
    http.run(service, job)  # returns after SIGTERM/SIGINT, or once a failed service lingered
    if service.status == STATUS_FAILED:
        raise GroupFailed(service.error or "the group failed")
    service.stop()
    return {}


def command(args) -> int:
    """`vaeshard serve`: check what was asked, then serve on this process or on the ranks it starts."""
    from . import _pick_device, _process_count, _tier_options, io, launch

    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise io.InputError(f"vaeshard serve needs {', '.join(missing)}: pip install 'vaeshard[serve]'")
    from . import httplimits

    api_key = httplimits.api_key(args)  # first: a refused key stops the command before anything loads
    nproc = _process_count(args.nproc)
    device = _pick_device(args.device, nproc)
    model = io.named_model(args.config) if args.config else io.resolve_model(args.model, args.subfolder, args.offline)
    job = ServeJob(
        model=model,
        dtype=args.dtype or ("bf16" if device == "cuda" else "fp32"),
        mode=args.mode,
        options=_tier_options(args),
        timeout=args.timeout,
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_queue=args.max_queue,
        max_body=int(args.max_body_mb * 2**20),
        fps=args.fps,
        preset=args.preset,
        ready_file=args.ready_file,
        limits=httplimits.limits(args),
    )
    if nproc == 1 and not launch.torchrun_env():
        serve_worker(launch.inline_context(f"{device}:0" if device == "cuda" else "cpu"), job)
        return 0

    def forward(sig, frame):  # rank 0 drains and stops the group; the other ranks wait for it
        import multiprocessing

        for child in multiprocessing.active_children():
            if child.name == "vaeshard-rank0":
                os.kill(child.pid, sig)

    if not launch.torchrun_env():
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches rank 0 itself (its process group)
    launch.run(
        serve_worker,
        nproc,
        job,
        device=device,
        group_timeout=args.timeout,
        failure_grace=FAILED_LINGER_S + 10.0,
    )
    return 0


def _die_with_parent() -> None:
    """On Linux, a rank that `vaeshard serve --nproc N` started ends with it (SIGTERM), instead of
    serving on as an orphan if the parent is killed."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


__all__ = ["FAILED_LINGER_S", "HEARTBEAT_S", "GroupFailed", "Request", "ServeJob", "Service", "command", "serve_worker"]
