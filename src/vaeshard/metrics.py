"""Prometheus metrics of every decode and encode, where `prometheus_client` is installed.

Each request made through a parallelized VAE (`vae.decode`, `vae.encode`, `vaeshard.stream_decode`)
records, on the rank that ran it:

- `vaeshard_decode_seconds` / `vaeshard_encode_seconds` (histograms; labels `family`, `strategy`,
  `world_size`): the request's time on this rank, from its call to its result (a stream: to its last
  chunk), agreement included;
- `vaeshard_requests_total` (counter; labels `op`, `status`): `ok`, `error` (it raised), or `closed`
  (a stream ended early);
- `vaeshard_peak_memory_bytes` (gauge; label `rank`): the device's peak allocated memory on this rank
  after the request (`torch.cuda.max_memory_allocated`: since the process started or its last reset;
  vaeshard never resets it). CUDA only.

They go to `prometheus_client`'s default registry unless `use_registry` names another, so a host
application's own `/metrics` exports them. Without `prometheus_client` nothing is recorded and
nothing is imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time

# seconds: a small image decode on a fast GPU to a long video on a slow rank
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0)

_available: bool | None = None
_registry = None  # None: prometheus_client's default registry
_made_for: dict = {}  # registry -> vaeshard's metrics in it (made once per registry)


def available() -> bool:
    """Whether prometheus_client is installed (looked up once)."""
    global _available
    if _available is None:
        _available = importlib.util.find_spec("prometheus_client") is not None
    return _available


def use_registry(registry) -> None:
    """Record into `registry` (a prometheus_client CollectorRegistry) from now on; None: the default."""
    global _registry
    _registry = registry


def _made() -> dict:
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    registry = REGISTRY if _registry is None else _registry
    made = _made_for.get(registry)
    if made is None:
        labels = ("family", "strategy", "world_size")
        made = _made_for[registry] = {
            "decode": Histogram(
                "vaeshard_decode_seconds",
                "Time of a vaeshard decode request on this rank",
                labels,
                buckets=BUCKETS,
                registry=registry,
            ),  # fmt: skip
            "encode": Histogram(
                "vaeshard_encode_seconds",
                "Time of a vaeshard encode request on this rank",
                labels,
                buckets=BUCKETS,
                registry=registry,
            ),  # fmt: skip
            "requests": Counter(
                "vaeshard_requests", "vaeshard requests by operation and outcome", ("op", "status"), registry=registry
            ),
            "peak": Gauge(
                "vaeshard_peak_memory_bytes",
                "Peak allocated device memory on this rank after its last vaeshard request",
                ("rank",),
                registry=registry,
            ),
        }
    return made


class Request:
    """What one request says about itself while it runs (`strategy` once planned)."""

    def __init__(self, op: str, family: str, world: int, rank: int, device) -> None:
        self.op, self.family, self.world, self.rank, self.device = op, family, world, rank, device
        self.strategy = "none"  # refused before a plan was made
        self.status = "ok"


@contextlib.contextmanager
def request(op: str, family: str, world: int, rank: int, device):
    """Time the request inside and record it (nothing where prometheus_client is missing). `op`:
    "decode" or "encode" (a stream counts as a decode)."""
    if not available():
        yield Request(op, family, world, rank, device)
        return
    record = Request(op, family, world, rank, device)
    started = time.perf_counter()
    try:
        yield record
    except BaseException:
        if record.status == "ok":  # (a stream closed early has said so)
            record.status = "error"
        raise
    finally:
        _record(record, time.perf_counter() - started)


def record_peak(rank: int, peak_bytes: int) -> None:
    """Set `vaeshard_peak_memory_bytes` of `rank` (a service's rank 0 reports its other ranks' peaks
    this way); nothing where prometheus_client is missing."""
    if available():
        _made()["peak"].labels(str(rank)).set(peak_bytes)


def _record(record: Request, seconds: float) -> None:
    import torch

    made = _made()
    made[record.op].labels(record.family, record.strategy, str(record.world)).observe(seconds)
    made["requests"].labels(record.op, record.status).inc()
    device = record.device
    if isinstance(device, torch.device) and device.type == "cuda":
        made["peak"].labels(str(record.rank)).set(torch.cuda.max_memory_allocated(device))


__all__ = ["BUCKETS", "Request", "available", "record_peak", "request", "use_registry"]
