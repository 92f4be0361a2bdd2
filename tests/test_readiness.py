"""``/readyz`` and the checks a probe may leave out: ``?exclude=upstream``
answers ready while the proxy listens, whatever its broker (a sidecar's
probe: a Pulsar outage must not take the application's pod out of its
Service); a query naming no check is refused, so a probe's typo fails at
once rather than passing for ever."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.admin import bound, open_admin, serve_admin
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import Proxy
from sluice.proxy.workers import http
from tests.helpers.support import http_get, start_proxy


def test_a_proxy_leaves_its_broker_out_when_asked() -> None:
    proxy = Proxy(ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650")))
    upstream = frozenset({"upstream"})
    assert proxy.readiness() == [
        "not listening",
        "upstream pulsar://127.0.0.1:6650 not checked yet",
    ]
    assert proxy.readiness(upstream) == ["not listening"]
    proxy.listening, proxy.upstream_ok = True, False
    assert proxy.readiness() == ["upstream pulsar://127.0.0.1:6650 unreachable"]
    assert proxy.readiness(upstream) == []
    proxy.upstream_ok = True
    assert proxy.readiness() == proxy.readiness(upstream) == []


async def test_readyz_takes_the_checks_to_leave_out() -> None:
    asked: list[frozenset[str]] = []

    def readiness(exclude: frozenset[str]) -> list[str]:
        asked.append(exclude)
        return [] if "upstream" in exclude else ["upstream pulsar://b:6650 unreachable"]

    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admin, listeners, CollectorRegistry(), readiness)
        with trio.fail_after(10):
            assert await http(address, "GET", "/readyz") == (
                503,
                b"upstream pulsar://b:6650 unreachable\n",
            )
            assert await http(address, "GET", "/readyz?exclude=upstream") == (200, b"ready\n")
            assert await http(address, "GET", "/readyz?exclude=upstream&exclude=upstream") == (
                200,
                b"ready\n",
            )
            status, body = await http(address, "GET", "/readyz?exclude=upstrem")
            assert status == 400 and b"no check named 'upstrem'" in body, body
            status, body = await http(address, "GET", "/readyz?verbose")
            assert status == 400 and b"only exclude=CHECK" in body, body
        nursery.cancel_scope.cancel()
    assert asked == [frozenset(), frozenset({"upstream"}), frozenset({"upstream"})]


@pytest.mark.e2e
def test_workers_are_ready_without_their_broker_when_asked(tmp_path: Path) -> None:
    """Two workers in front of a broker nobody listens for: the supervisor's
    /readyz stays 503, its /readyz?exclude=upstream turns 200 once both
    workers listen, and a client connection is accepted meanwhile."""
    unreachable = f"pulsar://127.0.0.1:{free_port()}"
    admin = free_port()
    proxy = start_proxy(unreachable, tmp_path, "--no-check-broker", "--workers", "2",
                        "--admin", f"127.0.0.1:{admin}")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (answer := http_get(f"http://127.0.0.1:{admin}/readyz?exclude=upstream"))[0] != 200:
            assert time.monotonic() < deadline, (answer, proxy.log())
            time.sleep(0.05)
        assert answer == (200, "ready\n")
        # (Each worker "starting" until the supervisor has asked it, then its
        # "upstream … not checked yet" or "unreachable".)
        status, text = http_get(f"http://127.0.0.1:{admin}/readyz")
        assert status == 503 and ("starting" in text or "upstream" in text), text
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10).close()
        assert proxy.terminate() == 0, proxy.log()
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()
