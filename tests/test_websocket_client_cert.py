"""A WebSocket upgrade through Sluice's HTTP listener, where Sluice's own
credential toward the broker is its TLS client certificate
(``--broker-tls-cert``/``--broker-tls-key``, no token file): the broker's
web service, which requires a client certificate, sees Sluice's on the
upgrade, and the client gets the broker's ``101``."""

from __future__ import annotations

import base64
import hashlib
import socket
import ssl
from pathlib import Path

import trustme

from sluice.brokers.apache_pulsar import hs256_token
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from tests.helpers.support import ClientCertListener, common_name, start_proxy

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11B65"
SECRET = b"0123456789abcdef0123456789abcdef"


class ClientCertServer(ClientCertListener):
    """A TLS web service on loopback that requires a client certificate of
    ``ca`` and answers a WebSocket upgrade with ``101``; the subject of the
    certificate each upgrade came with, in ``seen``."""

    def __init__(self, ca: trustme.CA) -> None:
        self.failed: list[str] = []
        super().__init__(ca, "localhost")

    def _one(self, raw: socket.socket) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as conn:
                head = read_head(conn)
                if b"\r\n\r\n" not in head:
                    return
                self.seen.append(common_name(conn))
                key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                           if line.lower().startswith(b"sec-websocket-key:"))  # fmt: skip
                accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                             b"\r\n\r\n")  # fmt: skip
                conn.recv(1)  # until either side hangs up
        except (OSError, ssl.SSLError, StopIteration) as exc:
            self.failed.append(repr(exc))


def read_head(sock: socket.socket) -> bytes:
    """What ``sock`` reads up to the end of an HTTP head, or up to its end
    if it ends first."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


def upgrade(port: int, token: str) -> bytes:
    """A WebSocket upgrade to Sluice's HTTP listener on ``port``: the head
    of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"GET /ws/v2/producer/persistent/public/default/h3 HTTP/1.1\r\n"
            b"Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n\r\n"
        )
        return read_head(sock)


def test_a_websocket_upgrade_presents_sluices_client_certificate(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    own = tmp_path / "sluice.pem"
    ca.issue_cert("sluice.proxy.test", common_name="sluice").private_key_and_cert_chain_pem \
        .write_to_path(str(own))  # fmt: skip
    key = tmp_path / "clients.key"
    key.write_bytes(SECRET)
    http_port = free_port()
    with ClientCertServer(ca) as web:
        proxy = start_proxy(
            broker.url, tmp_path, "--http-listen", f"127.0.0.1:{http_port}",
            "--broker-http", f"https://localhost:{web.port}", "--broker-tls-ca", str(ca_file),
            "--broker-tls-cert", str(own), "--broker-tls-key", str(own),
            "--auth-mode", "proxy", "--auth-token-secret-key", str(key),
        )  # fmt: skip
        try:
            wait_for_port("127.0.0.1", http_port, 20, proxy.process)
            head = upgrade(http_port, hs256_token(SECRET, "app"))
        finally:
            proxy.kill()
        assert head.startswith(b"HTTP/1.1 101 "), (head, web.failed, proxy.log())
        assert web.seen == ["sluice"], (web.seen, web.failed)
    assert "Traceback" not in proxy.log()
