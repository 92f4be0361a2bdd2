"""Certificates a reload puts in force, rotated as Kubernetes (or
cert-manager) rotates a mounted Secret: Sluice's client certificate toward
brokers (``--broker-tls-cert``/``--broker-tls-key``) for the connections it
opens from then on, and the listeners' client CA (``--tls-client-ca``) for
the clients it accepts from then on. Connections already open keep theirs."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import trustme

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import (
    ClientCertListener,
    RawClient,
    common_name,
    start_proxy,
    tls_files,
)
from tests.test_key_rotation import mount


class ClientCertRecorder(ClientCertListener):
    """A TLS front for a broker on loopback: requires a client certificate
    of ``ca``, keeps the common name each connection came with (``seen``),
    and relays the connection to the broker at ``upstream``."""

    def __init__(self, ca: trustme.CA, upstream: int) -> None:
        self.upstream = upstream
        super().__init__(ca, "127.0.0.1")

    def _one(self, raw: socket.socket) -> None:
        with contextlib.suppress(OSError), \
                self.context.wrap_socket(raw, server_side=True) as conn, \
                socket.create_connection(("127.0.0.1", self.upstream)) as broker:  # fmt: skip
            self.seen.append(common_name(conn))
            threading.Thread(target=_pump, args=(broker, conn), daemon=True).start()
            _pump(conn, broker)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def client_pair(ca: trustme.CA, name: str) -> dict[str, bytes]:
    """A client certificate of ``ca`` for ``name`` and its key, as a
    kubernetes.io/tls Secret names them."""
    issued = ca.issue_cert(name, common_name=name)
    chain = b"".join(blob.bytes() for blob in issued.cert_chain_pems)
    return {"tls.crt": chain, "tls.key": issued.private_key_pem.bytes()}


@pytest.mark.e2e
def test_a_renewed_broker_client_certificate_is_used_for_new_connections(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    secret = tmp_path / "secret"
    mount(secret, "2026_12_01", client_pair(ca, "sluice-one"))
    with ClientCertRecorder(ca, broker.port) as front:
        address = f"127.0.0.1:{front.port}"
        proxy = start_proxy(
            f"pulsar+ssl://{address}", tmp_path, "--broker-tls-ca", str(tmp_path / "ca.pem"),
            "--broker-tls-cert", str(secret / "tls.crt"),
            "--broker-tls-key", str(secret / "tls.key"),
        )  # fmt: skip
        try:
            held = RawClient(proxy.port)
            assert held.connect(address).name == "CONNECTED", proxy.log()
            assert front.seen[-1] == "sluice-one"
            mount(secret, "2026_12_02", client_pair(ca, "sluice-two"))
            deadline = time.monotonic() + 30
            while True:
                with RawClient(proxy.port) as client:
                    assert client.connect(address).name == "CONNECTED", proxy.log()
                if front.seen[-1] == "sluice-two":
                    break
                assert time.monotonic() < deadline, (front.seen, proxy.log())
                time.sleep(0.1)
            assert "generation 2: --broker-tls" in proxy.log()
            # The connection opened before goes on, with the certificate it had.
            assert held.lookup("persistent://public/default/t", 7).name == "LOOKUP_RESPONSE"
            held.close()
            assert proxy.terminate() == 0
        finally:
            proxy.kill()
    assert "Traceback" not in proxy.log()


def tls_client(port: int, ca: Path, pair: dict[str, bytes], where: Path) -> RawClient:
    """A Pulsar connection to Sluice's TLS listener, presenting ``pair``."""
    (where / "client.pem").write_bytes(pair["tls.key"] + pair["tls.crt"])
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(where / "client.pem"))
    client = RawClient(port)
    client.sock = context.wrap_socket(client.sock, server_hostname="localhost")
    return client


def answer(port: int, ca: Path, pair: dict[str, bytes], where: Path) -> str:
    """What Sluice answers a CONNECT with over TLS, presenting ``pair``:
    the frame's name, or "refused" (the handshake or connection ended)."""
    try:
        with tls_client(port, ca, pair, where) as client:
            frame = client.connect()
    except (OSError, ssl.SSLError, AssertionError):
        return "refused"
    return frame.name


@pytest.mark.e2e
def test_a_rotated_client_ca_decides_for_new_tls_clients(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    server_ca, server_pem, _ = tls_files(tmp_path, "localhost")
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old_client, new_client = client_pair(old_ca, "old-client"), client_pair(new_ca, "new-client")
    secret = tmp_path / "secret"
    mount(secret, "2026_12_01", {"ca.crt": old_ca.cert_pem.bytes()})
    tls_port = free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--tls-cert", str(server_pem), "--tls-key", str(server_pem),
        "--tls-client-ca", str(secret / "ca.crt"), tls_port=tls_port,
    )  # fmt: skip
    try:
        assert answer(tls_port, server_ca, old_client, tmp_path) == "CONNECTED", proxy.log()
        assert answer(tls_port, server_ca, new_client, tmp_path) == "refused"
        held = tls_client(tls_port, server_ca, old_client, tmp_path)
        assert held.connect().name == "CONNECTED"
        mount(secret, "2026_12_02", {"ca.crt": new_ca.cert_pem.bytes()})
        deadline = time.monotonic() + 30
        while answer(tls_port, server_ca, new_client, tmp_path) != "CONNECTED":
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        assert answer(tls_port, server_ca, old_client, tmp_path) == "refused"
        assert "generation 2: --tls" in proxy.log()
        # The connection accepted before goes on.
        assert held.lookup("persistent://public/default/t", 7).name == "LOOKUP_RESPONSE"
        held.close()
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()
