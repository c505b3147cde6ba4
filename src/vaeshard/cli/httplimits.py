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
    """uvicorn's HTTP/1.1 protocol, with what it lacks for a service open to a network:

    - its `limit_concurrency` answers a request 503 once that many connections are open, but never closes
      one, and it counts idle connections: a few hundred connections that send nothing keep everyone out
      (and use up the process's file descriptors). Here a connection over `max_connections` is closed at
      once, and one that has not sent a whole request line and headers within `header_timeout` s (idle, or
      slow on purpose) is closed; `timeout_keep_alive` covers only the wait after a response.
    - its own 400, for a request that is not HTTP/1.1 or whose head is over HEAD_BYTES, is plain text:
      here it is JSON like every other error.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = None
            if len(self.connections) > limits.max_connections:
                log.warning(
                    "vaeshard serve: closed a connection: %d are open already (--max-connections)",
                    limits.max_connections,
                )
                transport.abort()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and not self._waiting_for_head():
                self._head_timer.cancel()
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._waiting_for_head():
                self._arm()  # the next request on this connection gets the same time for its head

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            body = json.dumps(
                {"error": f"not a valid HTTP/1.1 request, or its line and headers are over {HEAD_BYTES} bytes"}
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(limits.header_timeout, self._head_expired)

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                log.warning(
                    "vaeshard serve: closed a connection that sent no whole request head in %g s (--header-timeout)",
                    limits.header_timeout,
                )
                self.transport.abort()

    return Protocol


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
