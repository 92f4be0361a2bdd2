"""--proxy-protocol-in on the admin endpoint: a listed source (the
balancer) may send a PROXY header or not, since the kubelet's probes and
Prometheus reach the port from a listed address without one; an unlisted
source still may not send one, and a bad header is still refused."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from sluice.brokers.embedded import EmbeddedBroker
from tests.test_proxy_protocol import INET, dial, header_reading_proxy, v2_with

GET = b"GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"


def status(sock: socket.socket) -> str:
    """The status line of the admin endpoint's answer, or "closed"."""
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    sock.close()
    return data.split(b"\r\n", 1)[0].decode() if data else "closed"


def test_a_listed_source_may_send_a_header_to_the_admin_endpoint_or_not(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    with header_reading_proxy(broker, tmp_path) as (proxy, admin):
        ok = "HTTP/1.1 200 OK"
        # A listed source: a probe with no header, with a v1 or a v2 one.
        assert status(dial(admin, GET)) == ok, proxy.log()
        assert status(dial(admin, b"PROXY TCP4 203.0.113.9 127.0.0.1 1 2\r\n" + GET)) == ok
        assert status(dial(admin, v2_with(INET) + GET)) == ok
        # A request whose method begins as "PROXY " does, sent a byte at a time.
        sock = dial(admin, b"P")
        for byte in b"OST /config/reload HTTP/1.1\r\nContent-Length: 0\r\n\r\n":
            sock.sendall(bytes([byte]))
        assert status(sock).startswith("HTTP/1.1 40"), proxy.log()  # no token: refused by HTTP
        # A bad header from a listed source is still refused.
        assert status(dial(admin, b"PROXY TCP4 nonsense\r\n" + GET)) == "closed"
        # An unlisted source: served without a header, refused with one;
        # on loopback its Host must name the endpoint (DNS rebinding), where
        # a listed balancer's names what its own clients asked it.
        named = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{admin}\r\n\r\n".encode()
        assert status(dial(admin, named, source="127.0.0.1")) == ok
        assert status(dial(admin, GET, source="127.0.0.1")) == "HTTP/1.1 403 Forbidden"
        assert status(dial(admin, b"PROXY TCP4 203.0.113.9 127.0.0.1 1 2\r\n" + GET,
                           source="127.0.0.1")) == "closed"  # fmt: skip
        assert proxy.terminate() == 0
    assert "Traceback" not in proxy.log()
