"""Each latency histogram's buckets resolve the times it is meant to show:
histogram_quantile() reads any share above the highest finite bucket as that
bucket's bound, so a time past it is shown as the bound, however long."""

from __future__ import annotations

import itertools
import math

from prometheus_client import CollectorRegistry

from sluice.proxy.config import ProxyConfig
from sluice.proxy.metrics import HttpMetrics, Metrics


def finite_bounds(registry: CollectorRegistry, name: str) -> list[float]:
    for family in registry.collect():
        if family.name == name:
            bounds = sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels})
            return [bound for bound in bounds if not math.isinf(bound)]
    raise AssertionError(f"{name} is not exported")


def test_http_latency_reaches_the_request_timeout() -> None:
    """An HTTP request is answered 504 after --http-request-timeout (300 s by
    default); with buckets up to 30 s, every request slower than 30 s (an
    admin call deleting a namespace, a timeout) read as 30 s in the p99."""
    metrics = Metrics()
    HttpMetrics(metrics.registry)
    top = finite_bounds(metrics.exposed, "sluice_http_request_duration_seconds")[-1]
    assert top >= ProxyConfig.http_request_timeout


def test_relay_delay_resolves_a_slow_reader() -> None:
    """sluice_relay_delay_seconds runs to the write's end, a wait for a
    slow reader's socket included: with buckets up to 0.1 s, the overview's
    "Proxy's own delay p99" could not tell 0.2 s from 20 s."""
    top = finite_bounds(Metrics().exposed, "sluice_relay_delay_seconds")[-1]
    assert top >= 1.0


def test_request_latency_reaches_the_clients_operation_timeout() -> None:
    """Pulsar's clients give up on a request (a SEND's receipt, a PRODUCER's
    answer) after 30 s by default: answers up to then read as 10 s with
    buckets that end there."""
    top = finite_bounds(Metrics().exposed, "sluice_request_duration_seconds")[-1]
    assert top >= 30.0


def test_no_gap_between_buckets_is_wider_than_a_factor_of_five() -> None:
    """Within a bucket histogram_quantile() interpolates linearly; between
    bounds far apart (30 s to 300 s) a p99 is a guess. (Kept as the
    buckets above were added.)"""
    metrics = Metrics()
    HttpMetrics(metrics.registry)
    for name in (
        "sluice_request_duration_seconds",
        "sluice_relay_delay_seconds",
        "sluice_lookup_duration_seconds",
        "sluice_upstream_dial_seconds",
        "sluice_http_request_duration_seconds",
    ):
        bounds = finite_bounds(metrics.exposed, name)
        for low, high in itertools.pairwise(bounds):
            assert high / low <= 5.0, (name, low, high)
