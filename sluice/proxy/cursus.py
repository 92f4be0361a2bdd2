"""What the protocol-neutral proxy needs from Cursus.

Cursus clients find brokers by addresses inside replies, so the proxy keeps
them on itself port-per-broker, as Kafka proxies do: the main listener
stands for the configured broker, and every other broker a reply names gets
a listener of its own, opened when a core first asks for it
(``ListenerRequest``), on a port from ``--listener-ports`` (or any free
port). The core rewrites the reply to that listener's advertised address.
Each client connection is relayed to the broker its listener stands for.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sluice.addresses import Address
from sluice.protocols.core import Conn, Tap
from sluice.protocols.cursus.connection import (
    CursusConnection,
    CursusRouting,
    CursusSettings,
    ListenerRequest,
)
from sluice.protocols.faults import Faults
from sluice.protocols.pulsar.urls import BrokerUrl
from sluice.proxy.dial import TlsClientConfig, client_ssl_context

# Opens (or finds) the listener for an upstream broker; its advertised address.
OpenListener = Callable[[Address], Awaitable[Address]]


class NoListener(Exception):
    """No listener can be opened for a broker (the port range is used up)."""


class CursusBackend:
    name = "cursus"

    def __init__(
        self,
        broker: BrokerUrl,
        settings: CursusSettings,
        routing: CursusRouting,
        *,
        broker_tls: TlsClientConfig | None = None,
        connect_timeout: float,
        faults: Faults | None = None,
    ) -> None:
        self.broker = broker.address
        # cursus+ssl://: every broker of the cluster is dialled with TLS.
        self.tls = broker.tls
        self._tls_context = (
            client_ssl_context(broker_tls or TlsClientConfig()) if broker.tls else None
        )
        self.faults = faults if faults is not None else Faults()
        self.settings = settings
        self.routing = routing
        self.connect_timeout = connect_timeout
        self.open_listener: OpenListener | None = None
        # --sni-route: TLS server names that stand for a broker.
        self.named: dict[str, BrokerUrl] = {}

    def tls_context(self, tls: bool) -> ssl.SSLContext | None:
        return self._tls_context if tls else None

    def start(self, nursery: trio.Nursery, tap: Tap) -> None:
        """Nothing of its own to run: Cursus has no proxy-side requests."""

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> CursusConnection:
        return CursusConnection(
            conn, self.settings, self.routing, tap, upstream=upstream, tls=self.tls,
            faults=self.faults,
        )  # fmt: skip

    def route_name(self, name: str) -> Address | None:
        """SNI routing: the broker a TLS server name stands for: an
        --sni-route, or a broker a reply named by that host."""
        url = self.named.get(name)
        if url is not None:
            return url.address
        for upstream in (self.broker, *self.routing.listeners):
            if upstream.host.lower().removesuffix(".") == name:
                return upstream
        return None

    async def ask(self, address: Address, request: Any) -> Address | Exception:
        """A core's ``ListenerRequest``: the listener for its broker."""
        assert isinstance(request, ListenerRequest) and self.open_listener is not None
        existing = self.routing.listener_for(request.upstream)
        if existing is not None:
            return existing
        try:
            return await self.open_listener(request.upstream)
        except (OSError, NoListener) as exc:
            return exc

    async def probe(self) -> str | None:
        """None when the configured broker accepts a connection; otherwise why not."""
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self.broker.host, self.broker.port)
        except (OSError, trio.TooSlowError) as exc:
            return f"cannot reach {self.broker}: {exc or 'timed out'}"
        await stream.aclose()
        return None

    async def aclose(self) -> None:
        pass
