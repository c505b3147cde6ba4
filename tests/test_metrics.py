"""vaeshard.metrics: every decode, encode and stream records its time, strategy, family, world size,
outcome and the rank's peak memory into a prometheus_client registry; nothing without it."""

from __future__ import annotations

import pytest
import torch

import vaeshard
from vaeshard import metrics

from .models import build, latent


@pytest.fixture
def registry(monkeypatch):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    monkeypatch.setattr(metrics, "_available", None)
    metrics.use_registry(reg)
    yield reg
    metrics.use_registry(None)


def _count(reg, name: str, **labels) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def test_requests_record_their_time_strategy_and_outcome(registry):
    vae = vaeshard.parallelize(build("wan21"))
    z = latent((1, 4, 3, 2, 2))
    vae.decode(z)
    labels = {"family": "wan", "strategy": "direct", "world_size": "1"}
    assert _count(registry, "vaeshard_decode_seconds_count", **labels) == 1
    assert _count(registry, "vaeshard_decode_seconds_sum", **labels) > 0
    assert _count(registry, "vaeshard_requests_total", op="decode", status="ok") == 1
    chunks = list(vaeshard.stream_decode(vae, z))  # a stream is a decode
    assert len(chunks) == 3 and _count(registry, "vaeshard_decode_seconds_count", **labels) == 2
    with vaeshard.stream_decode(vae, z) as stream:
        next(stream)  # closed after its first chunk
    assert _count(registry, "vaeshard_requests_total", op="decode", status="closed") == 1
    with pytest.raises(ValueError, match="channels"):
        vae.decode(latent((1, 3, 3, 2, 2)))
    assert _count(registry, "vaeshard_requests_total", op="decode", status="error") == 1
    assert _count(registry, "vaeshard_decode_seconds_count", family="wan", strategy="none", world_size="1") == 1
    vae.encode(latent((1, 3, 1, 16, 16)).clamp(-1, 1))
    assert _count(registry, "vaeshard_encode_seconds_count", **labels) == 1
    assert _count(registry, "vaeshard_requests_total", op="encode", status="ok") == 1
    # peak memory is a CUDA figure: nothing for these CPU requests
    assert registry.get_sample_value("vaeshard_peak_memory_bytes", {"rank": "0"}) is None


def test_nothing_is_recorded_without_prometheus_client(registry, monkeypatch):
    monkeypatch.setattr(metrics, "_available", False)
    vae = vaeshard.parallelize(build("wan21"))
    vae.decode(latent((1, 4, 1, 2, 2)))
    assert _count(registry, "vaeshard_requests_total", op="decode", status="ok") == 0
    assert registry not in metrics._made_for  # not even made


def test_the_default_registry_serves_a_host_applications_metrics(monkeypatch):
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    monkeypatch.setattr(metrics, "_available", None)
    metrics.use_registry(CollectorRegistry())  # made there, then back to the default: both kept apart
    vaeshard.parallelize(build("wan21")).decode(latent((1, 4, 1, 2, 2)))
    metrics.use_registry(None)
    vae = vaeshard.parallelize(build("wan21"))
    with torch.no_grad():
        vae.decode(latent((1, 4, 1, 2, 2)))
    text = generate_latest(REGISTRY).decode()
    assert 'vaeshard_decode_seconds_count{family="wan",strategy="direct",world_size="1"}' in text
    assert "vaeshard_requests_total" in text
