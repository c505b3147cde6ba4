"""`vaeshard serve`'s HTTP front end on rank 0: a Starlette app served by uvicorn.

It checks each request completely before it is queued (auth, size, safetensors body, shape, format), so
a request the group runs is one it can decode; it answers from the request's Channel, which the
dispatcher (cli/serve.py) fills with the output as it is encoded. The response starts with the first
bytes (a fragmented MP4 fragment by fragment; a zip of PNG frames frame by frame; safetensors at the
end); an error before them is a JSON `{"error": ...}` with its status code. A client that goes away
ends its request on every rank (the stream is closed).

Rank 0's memory is bounded before any body is read: a request is admitted (its place in the queue held,
or 429) from its headers, at most `max_uploads` bodies are received at a time, each straight into one
buffer of its declared length whose tensor the queue then holds, and connections are limited in number
and in the time they may take to send a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import mmap
import sys
import time

from vaeshard import MODES, metrics

from . import io
from .httplimits import API_KEY_ENV, HEAD_BYTES, KEEP_ALIVE_S, Limits, Uploads, log_repeats_once, protocol
from .io import InputError
from .serve import FAILED_LINGER_S, STATUS_FAILED, STATUS_READY, STOPPED, Request

FORMATS = {"mp4": "mp4", "safetensors": "safetensors", "png": "zip"}  # query value -> writer kind
MEDIA_TYPES = {"mp4": "video/mp4", "zip": "application/zip", "safetensors": "application/octet-stream"}
SUFFIXES = {"mp4": "mp4", "zip": "zip", "safetensors": "safetensors"}
DEFAULT_FORMAT = "safetensors"
# Bytes per write to the socket: a whole safetensors answer (hundreds of MB) in one write sends several
# times slower than in pieces of this size (benchmarks/serve_gpu.py, BENCHMARKS.md).
SEND_BYTES = 1 << 20
GRACEFUL_S = 5.0  # once drained or cut, the least time uvicorn gives open connections to send their answers
TICK_S = 0.1  # how often the main thread checks the drain and a failed service (uvicorn's own tick)
DEADLINE_HEADER = "x-request-timeout"  # seconds, as the `timeout` query parameter
MAX_FPS = 1000  # an MP4's frame rate; more is refused (the container cannot time it)
RETRY_AFTER_S = 2  # the Retry-After of a 429: about one small request's time on the group
HEADER_MAX = 1 << 20  # the largest safetensors header a body may have (a few tensors need a few hundred bytes)

log = logging.getLogger("vaeshard")


class HTTPError(Exception):
    def __init__(self, code: int, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.headers = code, message, headers


class _Gone(Exception):
    """The client closed its connection before its body arrived."""


class Channel:
    """A request's output, from the dispatcher's threads to the response: bytes, then the end or an
    error. A writable binary stream on the thread side (cli/writer.py writes into it)."""

    def __init__(self, loop) -> None:
        self._loop, self._queue, self._done = loop, asyncio.Queue(), False

    def write(self, data) -> int:
        if len(data):
            self._put(("data", bytes(data)))
        return len(data)

    def flush(self) -> None:
        pass

    def end(self) -> None:
        self._put(("end",))

    def fail(self, code: int, message: str) -> None:
        self._put(("error", code, message))

    def _put(self, item) -> None:
        if self._done:
            return
        self._done = item[0] != "data"
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self):
        return await self._queue.get()


# --- the app ---------------------------------------------------------------------------------------


def make_app(service, job):
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    limits = job.limits or Limits()
    uploads = Uploads(limits.max_uploads)
    registry = CollectorRegistry()
    metrics.use_registry(registry)  # the library's decode and encode metrics go to this app's /metrics
    http_requests = Counter(
        "vaeshard_http_requests", "HTTP requests by route and status code", ("route", "code"), registry=registry
    )
    latency = Histogram(
        "vaeshard_http_request_seconds",
        "Time from a request's arrival to the end of its response",
        ("route",),
        buckets=metrics.BUCKETS,
        registry=registry,
    )
    Gauge("vaeshard_queue_depth", "Requests admitted and waiting for the group", registry=registry).set_function(
        lambda: service.queue_depth
    )
    Gauge("vaeshard_uploads", "Request bodies being received", registry=registry).set_function(lambda: uploads.active)
    Gauge("vaeshard_uploads_waiting", "Admitted requests waiting to send their body", registry=registry).set_function(
        lambda: uploads.waiting
    )
    service.on_request = lambda op, seconds, peaks: [metrics.record_peak(r, p) for r, p in peaks.items()]

    def error(code: int, message: str, headers: dict | None = None):
        return JSONResponse({"error": message}, status_code=code, headers=headers)

    def authorized(request) -> bool:
        if not job.api_key:
            return True
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(given.encode(), job.api_key.encode())

    def counted(route: str):
        def wrap(handler):
            async def inner(request):
                started = time.perf_counter()
                health = route.startswith("/health")
                try:
                    if not health and not authorized(request):
                        raise HTTPError(
                            401, "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
                        )
                    response = await handler(request)
                except HTTPError as exc:
                    response = error(exc.code, exc.message, exc.headers)
                except _Gone:
                    log.warning("vaeshard serve: a client closed its connection before its %s body arrived", route)
                    response = Response(status_code=499)  # nobody reads it: the count says what happened
                if health and not authorized(request):
                    # without the key, a health route says only its status: the model, hosts and pids, and a
                    # failure's peer addresses, are for those who hold the key
                    state = json.loads(response.body) if isinstance(response, JSONResponse) else {}
                    response = JSONResponse({"status": state.get("status")}, status_code=response.status_code)
                http_requests.labels(route, str(response.status_code)).inc()
                if not isinstance(response, StreamingResponse):
                    latency.labels(route).observe(time.perf_counter() - started)
                else:
                    response.background = _Observe(latency.labels(route), started)
                return response

            return inner

        return wrap

    async def run_request(request, op: str):
        if service.status != STATUS_READY:
            raise HTTPError(503, f"the service is {service.status}" + (f": {service.error}" if service.error else ""))
        params = _params(request.query_params, op, job)
        deadline = time.monotonic() + _timeout(request, job)
        length = _declared_length(request.headers, job.max_body)
        refused = service.reserve()  # from the headers alone: a refused body is never read
        if refused == "full":
            raise HTTPError(
                429,
                f"the queue is full ({job.max_queue} requests hold a place): retry later",
                {"retry-after": str(RETRY_AFTER_S)},
            )
        if refused is not None:
            raise HTTPError(503, f"the service is {refused}")
        reserved, buffer = True, mmap.mmap(-1, length)  # its pages are taken as the body arrives
        try:
            await _receive(request, buffer, uploads, limits.body_timeout)
            from starlette.concurrency import run_in_threadpool

            # off the event loop: /health and the other connections are answered meanwhile
            tensor = await run_in_threadpool(_parse, buffer, length, "latents" if op == "decode" else "pixels")
            await run_in_threadpool(_check, tensor, op, params, job.model)
            channel = Channel(asyncio.get_running_loop())
            work = Request(op=op, tensor=tensor, out=channel, deadline=deadline, **params)
            reserved = False
            refused = service.submit(work)
        finally:
            if reserved:
                service.release()
                # a refused body's pages go back to the system now: an exception's traceback can keep its
                # tensor, and so the map, alive until the garbage collector runs, which buffers do not prompt
                if hasattr(mmap, "MADV_DONTNEED"):
                    buffer.madvise(mmap.MADV_DONTNEED)
        if refused is not None:
            raise HTTPError(503, f"the service is {refused}")
        first = await _first_or_gone(request, channel, work)
        if first is None:
            return Response(status_code=499)  # nobody reads it: the count says what happened
        if first[0] == "error":
            return error(first[1], first[2])
        kind = params["format"]
        return StreamingResponse(
            _rest(first, channel, work),
            media_type=MEDIA_TYPES[kind],
            headers={"content-disposition": f'attachment; filename="{op}.{SUFFIXES[kind]}"'},
        )

    @counted("/v1/decode")
    async def decode(request):
        return await run_request(request, "decode")

    @counted("/v1/encode")
    async def encode(request):
        return await run_request(request, "encode")

    @counted("/health")
    async def health(request):
        state = service.health()
        return JSONResponse(state, status_code=200 if state["status"] == STATUS_READY else 503)

    @counted("/health/ready")
    async def ready(request):
        return await health(request)

    @counted("/health/live")
    async def live(request):
        # alive while it serves or drains; a failed service is about to exit for its supervisor to restart
        return JSONResponse({"status": service.status}, status_code=503 if service.status == STATUS_FAILED else 200)

    @counted("/metrics")
    async def metrics_route(request):
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/decode", decode, methods=["POST"]),
        Route("/v1/encode", encode, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health/ready", ready, methods=["GET"]),
        Route("/health/live", live, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    listing = ", ".join(f"{m} {r.path}" for r in routes for m in sorted(r.methods - {"HEAD"}))

    async def http_exception(request, exc):  # Starlette's 404 and 405, as JSON like every other error
        if exc.status_code == 404:
            message = f"no route {request.url.path}: this service has {listing}"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not take {request.method}: this service has {listing}"
        else:
            message = exc.detail
        return error(exc.status_code, message, exc.headers)

    async def server_error(request, exc):
        return error(500, f"internal error ({type(exc).__name__}): the service's log has the details")

    return Starlette(routes=routes, exception_handlers={HTTPException: http_exception, Exception: server_error})


class _Observe:
    """A streamed response's latency, observed once its last byte was sent (a Starlette background task)."""

    def __init__(self, histogram, started: float) -> None:
        self.histogram, self.started = histogram, started

    async def __call__(self) -> None:
        self.histogram.observe(time.perf_counter() - self.started)


async def _first_or_gone(request, channel: Channel, work: Request):
    """The first item of the request's output, or None if its client went away first (the request is
    then dropped from the queue, or stopped on every rank at its next chunk). At the request's deadline
    the answer is 504."""
    loop = asyncio.get_running_loop()

    def expire() -> None:
        work.cancel("deadline")
        channel.fail(STOPPED["deadline"][0], STOPPED["deadline"][1])

    timer = loop.call_at(loop.time() + max(0.0, work.deadline - time.monotonic()), expire)
    first = asyncio.ensure_future(channel.get())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        gone.cancel()
    if first.done():
        return first.result()
    first.cancel()
    work.cancel("client")
    return None


async def _disconnected(request) -> None:
    """Returns when the client closes its connection (its body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _rest(first, channel: Channel, work: Request):
    """The response body: the bytes as they come; an error after the first ends the body early (the
    client sees an incomplete response)."""
    try:
        item = first
        while item[0] == "data":
            data = memoryview(item[1])
            for start in range(0, len(data), SEND_BYTES):
                yield data[start : start + SEND_BYTES]
            item = await channel.get()
        if item[0] == "error":
            raise RuntimeError(f"the request failed after its response began: {item[2]}")
    finally:
        work.cancel("client")  # a client gone mid-stream: the dispatcher closes the stream on every rank


# --- request checks --------------------------------------------------------------------------------


def _params(query, op: str, job) -> dict:
    unknown = sorted(set(query) - {"format", "fps", "mode", "exact", "timestep", "timeout"})
    if unknown:
        raise HTTPError(
            400, f"unknown query parameter(s) {', '.join(unknown)}: use format, fps, mode, exact, timestep, timeout"
        )
    name = query.get("format", DEFAULT_FORMAT if op == "decode" else "safetensors")
    if op == "encode" and name != "safetensors":
        raise HTTPError(400, f"format={name!r}: an encode answers safetensors only")
    if name not in FORMATS:
        raise HTTPError(400, f"format={name!r}: choose one of {', '.join(FORMATS)}")
    mode = query.get("mode", job.mode)
    if mode not in MODES:
        raise HTTPError(400, f"mode={mode!r}: choose one of {', '.join(MODES)}")
    return {
        "format": FORMATS[name],
        "fps": _bounded_int(query.get("fps"), job.fps, "fps", MAX_FPS),
        "mode": mode,
        "exact": _flag(query.get("exact"), bool(job.options.get("exact", False))),
        "timestep": _number(query.get("timestep"), "timestep"),
    }


def _timeout(request, job) -> float:
    """A request's deadline in seconds from its arrival: its X-Request-Timeout header or `timeout` query
    parameter, at most --max-request-timeout (also the default)."""
    text = request.headers.get(DEADLINE_HEADER) or request.query_params.get("timeout")
    if text is None:
        return job.max_request_timeout
    value = _number(text, "timeout")
    if not 0 < value <= job.max_request_timeout:
        raise HTTPError(
            400, f"timeout={text!r}: a request's deadline is more than 0 and at most {job.max_request_timeout:g} s"
        )
    return value


def _bounded_int(text, default: int, name: str, most: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise HTTPError(400, f"{name}={text!r}: expected a whole number") from None
    if not 1 <= value <= most:
        raise HTTPError(400, f"{name}={text}: expected a whole number from 1 to {most}")
    return value


def _flag(text, default: bool) -> bool:
    if text is None:
        return default
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise HTTPError(400, f"exact={text!r}: expected true or false")


def _number(text, name: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise HTTPError(400, f"{name}={text!r}: expected a number") from None


def _declared_length(headers, limit: int) -> int:
    """The body's length from its Content-Length: the size of the buffer it is read into."""
    declared = headers.get("content-length")
    if declared is None:
        raise HTTPError(411, "the request has no Content-Length: send the body with its length (not chunked)")
    length = int(declared)  # h11 has checked that it is a number
    if length > limit:
        raise HTTPError(413, f"the body is {length} bytes; this service takes at most {limit} (--max-body-mb)")
    if not length:
        raise HTTPError(400, "the body is empty: send a safetensors file")
    return length


async def _receive(request, buffer: mmap.mmap, uploads: Uploads, timeout: float) -> None:
    """Read the body into `buffer`, an anonymous memory map of its declared length (unmapped, so returned
    to the system, once its tensor is freed). 408 if it is not all there within `timeout` s of the headers."""
    import anyio
    from starlette.requests import ClientDisconnect

    length = len(buffer)
    try:
        with anyio.fail_after(timeout):
            async with uploads.slot():
                view, size = memoryview(buffer), 0
                try:
                    async for part in request.stream():
                        if size + len(part) > length:  # h11 ends the body at Content-Length: never true
                            raise HTTPError(400, f"the body is longer than its Content-Length ({length})")
                        view[size : size + len(part)] = part
                        size += len(part)
                finally:
                    view.release()
    except TimeoutError:
        raise HTTPError(
            408, f"the body did not arrive within {timeout:g} s of the headers (--body-timeout): send it faster"
        ) from None
    except ClientDisconnect:
        raise _Gone() from None
    if size != length:
        raise _Gone()


# safetensors' dtype names (its format's header)
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64",
}  # fmt: skip


def _parse(buffer, length: int, key: str):
    """The tensor `key` of a safetensors body (safetensors holds tensors only: nothing is unpickled), as a
    view of `buffer` when it is the body's only tensor: no copy. safetensors' own parser takes only a
    `bytes` object and copies every tensor out of it (two to three times the body on rank 0), so the
    format's header (8 bytes of length, then JSON) is read here and checked in full."""
    import torch

    def refuse(why: str):
        raise HTTPError(400, f"the body is not a safetensors file ({why})")

    if length < 8:
        refuse(f"{length} bytes, shorter than a safetensors header")
    size = int.from_bytes(buffer[:8], "little")
    if size > min(length - 8, HEADER_MAX):
        refuse(f"its header claims {size} bytes, more than the body's {length - 8} or {HEADER_MAX}")
    try:
        header = json.loads(buffer[8 : 8 + size])
    except (UnicodeDecodeError, ValueError) as exc:
        refuse(f"its header is not JSON: {exc}")
    if not isinstance(header, dict):
        refuse("its header is not a JSON object")
    header.pop("__metadata__", None)
    if key not in header:
        raise HTTPError(
            400, f"the safetensors body has no tensor named {key!r} (it has: {', '.join(header) or 'none'})"
        )
    entry, data = header[key], 8 + size
    try:
        name, shape, (start, end) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        refuse(f"{key!r} has no valid dtype, shape and data_offsets")
    if not isinstance(name, str) or name not in _DTYPES or not hasattr(torch, _DTYPES[name]):
        raise HTTPError(400, f"{key!r} has dtype {name!r}: expected a floating-point tensor")
    dtype = getattr(torch, _DTYPES[name])
    if not all(type(n) is int and n >= 0 for n in [*shape, start, end]):
        refuse(f"{key!r} has shape {shape} and data_offsets {entry['data_offsets']}")
    count = 1
    for n in shape:
        count *= n
    if not 0 <= start <= end <= length - data or end - start != count * dtype.itemsize:
        refuse(f"{key!r} of shape {shape} ({name}) does not match its data_offsets [{start}, {end}]")
    if not dtype.is_floating_point:
        raise HTTPError(400, f"{key!r} has dtype {dtype}: expected a floating-point tensor")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    if sys.byteorder != "little":  # the format is little-endian: safetensors' own parser swaps the bytes
        from safetensors.torch import load

        return load(bytes(buffer))[key]
    offset = data + start
    if len(header) == 1 and offset % dtype.itemsize == 0:
        return torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset).view(shape)
    # other tensors share the body (freed with it), or the data is not aligned for its dtype: copy it out
    tensor = torch.empty(shape, dtype=dtype)
    tensor.view(-1).view(torch.uint8).copy_(
        torch.frombuffer(buffer, dtype=torch.uint8, count=end - start, offset=offset)
    )
    return tensor


def _check(tensor, op: str, params: dict, model) -> None:
    shape = tuple(tensor.shape)
    conditioned = bool(model.config.get("timestep_conditioning", False))
    try:
        if op == "decode":
            if conditioned and params["timestep"] is None:
                raise InputError(
                    "this VAE's decoder is timestep-conditioned: pass timestep=T (the pipeline's decode_timestep)"
                )
            if params["timestep"] is not None and not conditioned:
                raise InputError("timestep: this VAE takes no decoder timestep; leave it out")
            io.check_latent_shape(shape, model, "the request's latents")
            if params["format"] != "safetensors":
                frames = model.frames_out(shape[2]) if len(shape) == 5 else 1
                ratio = model.spatial_ratio()
                size = (shape[-2] * ratio, shape[-1] * ratio)
                kind = "mp4" if params["format"] == "mp4" else "frames"
                io.check_video(kind, shape[0], frames, model.sample_channels(), size)
        else:
            ndim, channels = model.latent_ndim(), model.sample_channels()
            if len(shape) != ndim or shape[1] != channels or 0 in shape:
                layout = "(B, C, T, H, W)" if ndim == 5 else "(B, C, H, W)"
                raise InputError(f"'pixels' have shape {shape}: this VAE encodes {layout} with C = {channels}")
            ratio = model.spatial_ratio()
            if min(shape[-2:]) < ratio:  # its encoder's last strided convolution would have nothing to read
                raise InputError(
                    f"'pixels' of {shape[-2]}x{shape[-1]} are too small to encode: this VAE needs at least "
                    f"{ratio}x{ratio} (one latent pixel)"
                )
    except InputError as exc:
        raise HTTPError(400, str(exc)) from None


# --- the server ------------------------------------------------------------------------------------


def run(service, job) -> None:
    """Serve until SIGTERM or SIGINT (then: drain, finish the request in flight), or until a failed
    service has answered for FAILED_LINGER_S.

    uvicorn's server runs in a thread of its own, through its public API (`Config`, `Server.run`,
    `started`, `should_exit`, `force_exit`): off the main thread uvicorn leaves the process's signals
    alone (its own handlers would re-raise the signal after a graceful exit, where a drained service
    exits 0). This thread takes SIGTERM and SIGINT and watches the service every TICK_S: it ends the
    server once the drain is done or cut, or once a failed service lingered long enough."""
    import signal
    import threading

    import uvicorn

    limits = job.limits or Limits()
    log_repeats_once()
    config = uvicorn.Config(
        make_app(service, job),
        host=job.host,
        port=job.port,
        http=protocol(limits),
        log_level="warning",
        log_config=None,  # uvicorn's loggers reach the root handler, whose filter holds back repeated lines
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        h11_max_incomplete_event_size=HEAD_BYTES,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    server = uvicorn.Server(config)
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            server.run()
        except BaseException as exc:  # (uvicorn exits with SystemExit when it cannot bind)
            failed.append(exc)

    def stop(sig, frame) -> None:
        # a second Ctrl-C while draining stops at once; otherwise the ticks below end the drain
        if service.draining_since is not None and sig == signal.SIGINT:
            server.force_exit = server.should_exit = True
        service.drain()

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    thread = threading.Thread(target=serve, name="vaeshard-http", daemon=True)
    try:
        thread.start()
        announced = False
        while thread.is_alive():
            thread.join(TICK_S)
            if server.started and not announced:
                _announce(service, job)
                announced = True
            if not server.should_exit and _done(service, job, config):
                server.should_exit = True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise failed[0]
    if not announced:
        raise RuntimeError(f"the HTTP server on {job.host}:{job.port} stopped before it listened (see its log)")


def _done(service, job, config) -> bool:
    """Whether the server is to end now: a failed service lingered, or the drain is done or was cut (then
    uvicorn lets the open responses finish: what is left of the drain, at least GRACEFUL_S)."""
    if service.status == STATUS_FAILED and time.time() - service.failed_at > FAILED_LINGER_S:
        return True
    if service.draining_since is None:
        return False
    left = job.drain_timeout - (time.monotonic() - service.draining_since)
    if service.idle() or service.drain_cut:
        config.timeout_graceful_shutdown = max(GRACEFUL_S, left)
        return True
    if left < 0:
        service.cut()  # answered 503 now; the ranks stop at the request's next chunk
    return False


def _announce(service, job) -> None:
    address = f"http://{job.host}:{job.port}"
    print(
        f"vaeshard: serving {job.model.description} on {address} ({service.ctx.world} rank(s), {service.ctx.device})",
        flush=True,
    )
    if job.ready_file:
        with open(job.ready_file, "w") as f:
            json.dump({"address": address}, f)
    if not job.api_key and job.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"vaeshard: warning: {address} takes requests without an API key (--api-key, {API_KEY_ENV})",
            file=sys.stderr,
        )


__all__ = ["API_KEY_ENV", "Channel", "FORMATS", "make_app", "run"]
