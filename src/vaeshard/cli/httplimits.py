"""The limits of `vaeshard serve`'s HTTP front end (cli/http.py): what one client may hold on rank 0.

The API key's sources, the flags of the limits, the number of bodies received at once, and uvicorn's
protocol with what it lacks for a service open to a network (a cap on open connections, a time limit on
a request's head, JSON for its own 400), and a log that holds back repeated lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass

from .args import positive_float, positive_int
from .io import InputError

API_KEY_ENV = "VAESHARD_API_KEY"
# A Wan 2.1 720p latent of 81 frames is 18.5 MiB in float32, HunyuanVideo's of 129 frames 29 MiB: 64 MiB
# takes every supported family's latents at 720p; encodes of long videos need --max-body-mb raised.
DEFAULT_BODY_MB = 64.0
KEEP_ALIVE_S = 5  # an idle connection after a response is closed after this (uvicorn's timeout_keep_alive)
HEAD_BYTES = 16 << 10  # the largest request line and headers (h11's limit; more is a 400)
LOG_WINDOW_S = 10.0  # a repeated log line (same logger and text) is printed at most once in this time

log = logging.getLogger("vaeshard")


@dataclass(frozen=True)
class Limits:
    """What one client may hold on rank 0 (flags of `vaeshard serve`, checked by the command line)."""

    max_connections: int = 128  # open connections; more are closed at once
    max_uploads: int = 4  # bodies received at the same time; more wait their turn
    header_timeout: float = 10.0  # seconds to send a request's line and headers
    body_timeout: float = 60.0  # seconds to send a request's whole body, from its headers' arrival


def add_arguments(parser) -> None:
    """`vaeshard serve`'s flags for the key's sources and the HTTP limits."""
    parser.add_argument(
        "--api-key-file", default=None, metavar="PATH", help="read the API key from this file (its first line)"
    )
    defaults = Limits()
    for flag, kind, value, what in [
        ("--max-connections", positive_int, defaults.max_connections, "open connections; more are closed at once"),
        ("--max-uploads", positive_int, defaults.max_uploads, "request bodies received at once; more wait"),
        ("--header-timeout", positive_float, defaults.header_timeout, "seconds a client has to send its headers"),
        ("--body-timeout", positive_float, defaults.body_timeout, "seconds a client has to send a body (408)"),
    ]:
        parser.add_argument(flag, type=kind, default=value, help=f"{what} (default {value:g})")


def limits(args) -> Limits:
    return Limits(args.max_connections, args.max_uploads, args.header_timeout, args.body_timeout)


def api_key(args) -> str | None:
    """The key every route but /health's status needs: from --api-key-file, VAESHARD_API_KEY or --api-key
    (which any user of the machine can read in the process list: a warning says so); None without any.
    InputError for an empty key (it would turn authentication off) or one an HTTP header cannot carry."""
    given = [(name, value) for name, value in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file))]
    given = [(name, value) for name, value in given if value is not None]
    if len(given) > 1:
        raise InputError("--api-key and --api-key-file both give a key: pass one (or VAESHARD_API_KEY)")
    if given and given[0][0] == "--api-key":
        where, key = "--api-key", args.api_key
        print(
            f"vaeshard: warning: --api-key shows the key to every user of this machine (ps); "
            f"set {API_KEY_ENV} or pass --api-key-file instead",
            file=sys.stderr,
        )
    elif given:
        where = f"--api-key-file {args.api_key_file}"
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: cannot read the key ({type(exc).__name__}: {exc})") from None
    elif API_KEY_ENV in os.environ:
        where, key = API_KEY_ENV, os.environ[API_KEY_ENV]
    else:
        return None
    key = key.strip()
    if not key:
        raise InputError(
            f"{where} gives an empty API key, which would let every request in: give a key, or no key at all "
            "to serve without one"
        )
    if not all(33 <= ord(c) <= 126 for c in key):
        raise InputError(
            f"the API key from {where} holds spaces, control or non-ASCII characters, which an HTTP header "
            "cannot carry: use printable ASCII, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key


class Uploads:
    """At most `limit` bodies received at a time; the others wait their turn (they hold a place in the
    queue, not memory)."""

    def __init__(self, limit: int) -> None:
        self._semaphore, self.active, self.waiting = asyncio.Semaphore(limit), 0, 0

    @contextlib.asynccontextmanager
    async def slot(self):
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._semaphore.release()


def protocol(limits: Limits):
    """An asyncio protocol class for uvicorn's `Config(http=...)`: uvicorn's own HTTP/1.1 protocol, made
    and driven only through asyncio.Protocol's methods, behind a guard that adds what it lacks for a
    service open to a network:

    - its `limit_concurrency` answers a request 503 once that many connections are open, but never closes
      one, and it counts idle connections: a few hundred connections that send nothing keep everyone out
      (and use up the process's file descriptors). Here a connection over `max_connections` is closed at
      once, and one that has not sent a whole request line and headers within `header_timeout` s (idle, or
      slow on purpose) is closed; uvicorn's `timeout_keep_alive` covers only the wait after a response.
    - its own 400, for a request that is not HTTP/1.1 or whose head is over HEAD_BYTES, is plain text:
      here it is JSON like every other error.

    The guard holds each request head back until it is whole, checks it with h11 (the parser uvicorn's
    protocol uses), then hands uvicorn's protocol what it received; it follows the request's body with
    h11 too, so it knows where the next head starts. The time for a later head on a kept-alive
    connection starts with its first byte; an idle kept-alive connection is uvicorn's to close
    (`timeout_keep_alive`), and so is one whose next head takes longer than that to become whole.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_guards: set = set()  # the connections the server took

    class Guarded(asyncio.Protocol):
        def __init__(self, **uvicorn_arguments) -> None:
            self.http = H11Protocol(**uvicorn_arguments)
            self.transport = self.timer = None
            self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES)
            self.in_body = False  # past a whole head, until its body ended
            self.head = bytearray()  # the bytes of a head not yet whole
            self.taken = False

        def connection_made(self, transport) -> None:
            self.transport = transport
            if len(open_guards) >= limits.max_connections:
                log.warning(
                    "vaeshard serve: closed a connection: %d are open already (--max-connections)",
                    limits.max_connections,
                )
                transport.abort()
                return
            open_guards.add(self)
            self.taken = True
            self.http.connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self.taken or self.transport.is_closing():
                return
            if self.in_body:
                self.parser.receive_data(data)
                self._pass_body(data)
            else:
                self._take_head(data)

        def eof_received(self):
            return self.http.eof_received() if self.taken else None

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self.taken:
                open_guards.discard(self)
                self.http.connection_lost(exc)

        def pause_writing(self) -> None:
            if self.taken:
                self.http.pause_writing()

        def resume_writing(self) -> None:
            if self.taken:
                self.http.resume_writing()

        def _take_head(self, data: bytes) -> None:
            """Hold a head back until it is whole; a bad one is answered here, a good one passed on with
            whatever came after it."""
            if not data:
                return
            if self.timer is None:
                self._arm()  # a later head on this connection: its time starts with its first byte
            self.head += data
            self.parser.receive_data(data)
            try:
                event = self.parser.next_event()
            except h11.RemoteProtocolError:
                self._refuse()
                return
            if event is h11.NEED_DATA:
                return
            self._disarm()
            received, self.head = bytes(self.head), bytearray()
            self.in_body = True
            self._pass_body(received)

        def _pass_body(self, data: bytes) -> None:
            """Pass `data` on up to the end of the request it belongs to; what follows is the next head."""
            while True:
                try:
                    event = self.parser.next_event()
                except h11.RemoteProtocolError:  # a bad body: uvicorn's protocol answers it
                    break
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.EndOfMessage):
                    rest = self.parser.trailing_data[0]
                    self.http.data_received(data[: len(data) - len(rest)])
                    self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES)
                    self.in_body = False
                    self._take_head(rest)
                    return
            self.http.data_received(data)

        def _refuse(self) -> None:
            self._disarm()
            body = json.dumps(
                {"error": f"not a valid HTTP/1.1 request, or its line and headers are over {HEAD_BYTES} bytes"}
            ).encode()
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self.timer = asyncio.get_running_loop().call_later(limits.header_timeout, self._head_expired)

        def _disarm(self) -> None:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

        def _head_expired(self) -> None:
            self.timer = None
            if not self.in_body and not self.transport.is_closing():
                log.warning(
                    "vaeshard serve: closed a connection that sent no whole request head in %g s (--header-timeout)",
                    limits.header_timeout,
                )
                self.transport.abort()

    return Guarded


class _Repeats(logging.Filter):
    """Lets a line through at most once per LOG_WINDOW_S for each logger and message; the next one that
    passes says how many were held back. A flood of connections or bad requests cannot fill the disk."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict = {}  # (logger, level, message) -> (when it last passed, lines held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = (record.name, record.levelno, str(record.msg)), time.monotonic()
        last, held = self._seen.get(key, (None, 0))
        if last is not None and now - last < LOG_WINDOW_S:
            self._seen[key] = (last, held + 1)
            return False
        if len(self._seen) > 1000:  # messages that vary: keep the table small
            self._seen.clear()
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like this in the last {now - last:.0f} s)"
        return True


def log_repeats_once() -> None:
    """Every line rank 0 logs (vaeshard's, uvicorn's, asyncio's) goes through one `_Repeats`."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    for handler in root.handlers:
        if not any(isinstance(f, _Repeats) for f in handler.filters):
            handler.addFilter(_Repeats())


__all__ = [
    "API_KEY_ENV", "DEFAULT_BODY_MB", "HEAD_BYTES", "KEEP_ALIVE_S", "Limits", "Uploads", "add_arguments", "api_key",
    "limits", "log_repeats_once", "protocol",
]  # fmt: skip
