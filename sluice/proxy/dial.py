"""TLS settings and dialling: the one place Sluice opens a connection to a broker."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trio

from sluice.addresses import Address


@dataclass(frozen=True)
class TlsServerConfig:
    cert: Path
    key: Path
    # When set, clients must present a certificate signed by this CA.
    client_ca: Path | None = None


@dataclass(frozen=True)
class TlsClientConfig:
    """How Sluice verifies brokers it dials over TLS."""

    ca: Path | None = None  # None: the system trust store
    verify_hostname: bool = True
    # Client certificate for brokers that require one.
    cert: Path | None = None
    key: Path | None = None


def server_ssl_context(config: TlsServerConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(config.cert), str(config.key))
    if config.client_ca is not None:
        context.load_verify_locations(str(config.client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(config: TlsClientConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(config.ca) if config.ca else None)
    context.check_hostname = config.verify_hostname
    if not config.verify_hostname:
        # Hostname checks off means the operator trusts the network path.
        context.verify_mode = ssl.CERT_NONE if config.ca is None else ssl.CERT_REQUIRED
    if config.cert is not None:
        context.load_cert_chain(str(config.cert), str(config.key) if config.key else None)
    return context


async def dial(
    address: Address,
    *,
    timeout: float,
    tls: ssl.SSLContext | None = None,
) -> trio.abc.Stream:
    """Open a TCP (optionally TLS) connection, all within ``timeout`` seconds.

    Raises ``OSError`` with a readable message on failure or timeout.
    """
    stream: trio.abc.Stream
    with trio.move_on_after(timeout) as scope:
        tcp = await trio.open_tcp_stream(address.host, address.port)
        if tls is None:
            return tcp
        stream = trio.SSLStream(tcp, tls, server_hostname=address.host, https_compatible=False)
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await tcp.aclose()
            raise OSError(f"TLS handshake with {address} failed: {exc.__cause__ or exc}") from exc
        return stream
    assert scope.cancelled_caught
    raise OSError(f"connecting to {address} timed out after {timeout:g}s")
