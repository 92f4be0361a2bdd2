"""``[::]:PORT`` is the IPv6 wildcard alone, and takes IPv4 clients too
(dual stack): in IPv6-only and dual-stack Kubernetes clusters one wildcard
serves both families. Where an IPv4 address is bound on the same port as
well (a host resolving to both wildcards), the IPv6 socket keeps to IPv6;
an explicit address is bound as it is. Every listener goes through ``bind_all``: a lone proxy's
and a supervisor's client and admin listeners are tried here through
127.0.0.1 and ::1, and the per-broker range as the supervisor binds it."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.proxy.dial import bind_all
from sluice.proxy.ports import bind_range
from tests.helpers.support import (
    SLUICE,
    ProxyProcess,
    RawClient,
    http_get,
    kill_with_workers,
    worker_pids,
)


def reaches(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def v6only(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)


def test_the_ipv6_wildcard_alone_takes_both_families() -> None:
    sockets = bind_all(Address("::", 0))
    try:
        (sock,) = sockets
        assert sock.family == socket.AF_INET6 and v6only(sock) == 0
        port = sock.getsockname()[1]
        assert reaches("127.0.0.1", port) and reaches("::1", port)
    finally:
        for sock in sockets:
            sock.close()
    # The per-broker range the supervisor binds, alike.
    low = free_port()
    ranged = bind_range("::", low, low)
    try:
        assert [v6only(s) for s in ranged] == [0]
        assert reaches("127.0.0.1", low) and reaches("::1", low)
    finally:
        for sock in ranged:
            sock.close()


def test_an_ipv4_address_beside_it_or_an_explicit_one_is_kept_apart() -> None:
    # Both wildcards on one port (an empty host resolves to both): a socket each.
    both = bind_all(Address("", 0))
    try:
        families = sorted(s.family for s in both)
        assert families == sorted([socket.AF_INET, socket.AF_INET6])
        assert [v6only(s) for s in both if s.family == socket.AF_INET6] == [1]
    finally:
        for sock in both:
            sock.close()
    explicit = bind_all(Address("::1", 0))
    try:
        (sock,) = explicit
        assert v6only(sock) == 1
        port = sock.getsockname()[1]
        assert reaches("::1", port) and not reaches("127.0.0.1", port)
    finally:
        for sock in explicit:
            sock.close()


def connected(host: str, port: int) -> bool:
    """Whether a Pulsar CONNECT through Sluice at ``host`` is answered."""
    with RawClient(port, host) as raw:
        raw.send_connect()
        frame = raw.receive()
        return frame is not None and frame.name == "CONNECTED"


@pytest.mark.e2e
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_proxy_on_the_ipv6_wildcard_serves_ipv4_and_ipv6(
    broker: EmbeddedBroker, tmp_path: Path, workers: str
) -> None:
    port, admin = free_port(), free_port()
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*SLUICE, "proxy", "--broker", broker.url, "--listen", f"[::]:{port}",
             "--admin", f"[::]:{admin}", "--workers", workers],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    proxy = ProxyProcess(process, port, log_path)
    pids: dict[int, int] = {}
    try:
        wait_for_port("::1", admin, 30, process)
        if workers == "2":
            pids = worker_pids(proxy, 2)
        for host in ("127.0.0.1", "[::1]"):
            assert http_get(f"http://{host}:{admin}/healthz")[0] == 200, proxy.log()
        for host in ("127.0.0.1", "::1"):
            wait_for_port(host, port, 30, process)
            assert connected(host, port), proxy.log()
        assert proxy.terminate() == 0
    finally:
        kill_with_workers(proxy, pids)
    assert "Traceback" not in proxy.log()
