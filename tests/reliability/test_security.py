"""The proxy is no open door: certificate rotation without dropping anyone,
no TLS below 1.2, and no CONNECT to addresses nobody named (the admin port,
other loopback ports, link-local and cloud metadata addresses)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trustme

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.http import parse_http_url
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsServerConfig
from sluice.proxy.pulsar import FrameStream
from sluice.proxy.server import Proxy


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


def issue(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A fresh certificate for localhost written over the listener's files;
    its DER bytes."""
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    # Written next to the files and renamed over them, as a secret update does.
    for pem, path in ((leaf.cert_chain_pems[0], cert), (leaf.private_key_pem, key)):
        pem.write_to_path(str(path.with_suffix(".new")))
        path.with_suffix(".new").replace(path)
    return cert, key, ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


async def start_tls_proxy(
    nursery: trio.Nursery, broker: EmbeddedBroker, cert: Path, key: Path
) -> Proxy:
    """A proxy in front of ``broker`` with only a TLS listener (any free port)."""
    config = ProxyConfig(
        broker=parse_broker_url(broker.url),
        listen=None,
        listen_tls=Address("127.0.0.1", 0),
        tls=TlsServerConfig(cert, key),
    )
    proxy: Proxy = await nursery.start(Proxy(config).run)
    return proxy


async def connect_tls(
    address: Address, context: ssl.SSLContext
) -> trio.SSLStream[trio.SocketStream]:
    tcp = await trio.open_tcp_stream(address.host, address.port)
    stream = trio.SSLStream(tcp, context, server_hostname="localhost")
    with trio.fail_after(10):
        await stream.do_handshake()
    return stream


async def hello(stream: trio.abc.Stream) -> str:
    """CONNECT on a lookup connection: the proxy answers it itself."""
    frames = FrameStream(stream)
    connect = pb.CommandConnect(client_version="tests", protocol_version=21)
    await frames.send(encode(command(Type.Value("CONNECT"), connect)))
    with trio.fail_after(10):
        frame = await frames.receive_frame()
    assert frame is not None
    return frame.name


async def test_rotated_certificates_are_used_without_dropping_connections(
    nursery: trio.Nursery, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert, key, first = issue(ca, tmp_path)
    proxy = await start_tls_proxy(nursery, broker, cert, key)
    address = proxy.addresses["tls"]
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    old = await connect_tls(address, trusting)
    assert old.getpeercert(binary_form=True) == first
    assert proxy.certificates is not None and not proxy.certificates.check()  # unchanged

    _, _, second = issue(ca, tmp_path)
    assert second != first
    assert proxy.certificates.check()
    new = await connect_tls(address, trusting)
    assert new.getpeercert(binary_form=True) == second
    # The connection made before the rotation still works.
    assert await hello(old) == "CONNECTED"
    assert await hello(new) == "CONNECTED"

    # A half-written pair (key not matching yet) keeps the old certificate.
    other = trustme.CA().issue_cert("localhost")
    other.cert_chain_pems[0].write_to_path(str(cert))
    assert not proxy.certificates.check()
    again = await connect_tls(address, trusting)
    assert again.getpeercert(binary_form=True) == second
    for stream in (old, new, again):
        await stream.aclose()


async def test_the_https_listener_takes_a_rotated_certificate_too(
    nursery: trio.Nursery, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """--http-listen-tls has a context of its own, re-read as the binary
    listener's is."""
    ca = trustme.CA()
    cert, key, first = issue(ca, tmp_path)
    config = ProxyConfig(
        broker=parse_broker_url(broker.url),
        listen=Address("127.0.0.1", 0),
        http_listen_tls=Address("127.0.0.1", 0),
        broker_http=parse_http_url("http://127.0.0.1:8080"),
        tls=TlsServerConfig(cert, key),
    )
    proxy: Proxy = await nursery.start(Proxy(config).run)
    address = proxy.addresses["https"]
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    old = await connect_tls(address, trusting)
    assert old.getpeercert(binary_form=True) == first
    _, _, second = issue(ca, tmp_path)
    assert proxy.http is not None and proxy.http.certificates is not None
    assert proxy.http.certificates.check()
    new = await connect_tls(address, trusting)
    assert new.getpeercert(binary_form=True) == second
    for stream in (old, new):
        await stream.aclose()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls_below_1_2_is_refused(
    nursery: trio.Nursery, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert, key, _ = issue(ca, tmp_path)
    proxy = await start_tls_proxy(nursery, broker, cert, key)
    old_client = ssl.create_default_context()
    ca.configure_trust(old_client)
    old_client.minimum_version = ssl.TLSVersion.TLSv1
    old_client.maximum_version = ssl.TLSVersion.TLSv1_1
    old_client.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(trio.BrokenResourceError):
        await connect_tls(proxy.addresses["tls"], old_client)
    # The proxy saw it and counted a failed TLS handshake.
    with trio.fail_after(10):
        while not proxy.metrics.registry.get_sample_value(
            "sluice_connections_rejected_total", {"reason": "tls"}
        ):
            await trio.sleep(0.02)


@pytest.mark.parametrize(
    "target",
    ["127.0.0.1:{admin}", "127.0.0.1:22", "localhost:{admin}", "169.254.169.254:80",
     "[fe80::1]:6650", "metadata.google.internal:80", "10.0.0.1:6650"],
)  # fmt: skip
async def test_connect_to_an_address_nobody_named_is_refused(
    nursery: trio.Nursery, broker: EmbeddedBroker, target: str
) -> None:
    config = ProxyConfig(broker=parse_broker_url(broker.url), listen=Address("127.0.0.1", 0),
                         admin=Address("127.0.0.1", 0))  # fmt: skip
    proxy: Proxy = await nursery.start(Proxy(config).run)
    name = target.format(admin=proxy.addresses["admin"].port)
    address = proxy.addresses["plain"]
    frames = FrameStream(await trio.open_tcp_stream(address.host, address.port))
    connect = pb.CommandConnect(client_version="tests", protocol_version=21,
                                proxy_to_broker_url=name)  # fmt: skip
    await frames.send(encode(command(Type.Value("CONNECT"), connect)))
    with trio.fail_after(10):
        answer = await frames.receive_frame()
    assert answer is not None and answer.name == "ERROR"
    assert answer.body.error == pb.ServiceNotReady
    assert "allow-list" in answer.body.message
    assert (
        proxy.metrics.registry.get_sample_value(
            "sluice_connections_rejected_total", {"reason": "relay_refused"}
        )
        == 1
    )
