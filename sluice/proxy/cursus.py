"""What the protocol-neutral proxy needs from Cursus.

Cursus clients find brokers by addresses inside replies, so the proxy keeps
them on itself port-per-broker (``sluice/proxy/ports.py``): the main listener
stands for the configured broker, and every other broker a reply names gets
a listener of its own, opened when a core first asks for it
(``ListenerRequest``). The core rewrites the reply to that listener's
advertised address. Each client connection is relayed to the broker its
listener stands for.
"""

from __future__ import annotations

import ssl
from typing import Any

import trio

from sluice.addresses import Address
from sluice.protocols.core import Conn, Tap
from sluice.protocols.cursus.compression import Compression
from sluice.protocols.cursus.connection import (
    CursusConnection,
    CursusRouting,
    CursusSettings,
    ListenerRequest,
)
from sluice.protocols.faults import Faults
from sluice.protocols.urls import BrokerUrl
from sluice.proxy.backend import Services
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsClientConfig, client_ssl_context
from sluice.proxy.ports import BrokerPorts, NoListener


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
        ports: BrokerPorts | None = None,
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
        self.ports = ports
        if ports is not None:
            ports.map = routing
        # --sni-route: TLS server names that stand for a broker.
        self.named: dict[str, BrokerUrl] = {}

    def tls_context(self, tls: bool) -> ssl.SSLContext | None:
        return self._tls_context if tls else None

    def start(self, nursery: trio.Nursery, tap: Tap) -> None:
        """Nothing of its own to run: Cursus has no proxy-side requests."""

    async def listening(self, main: int | None) -> None:
        """The main listener stands for the configured broker; the ports an
        earlier run gave brokers are listened on again."""
        if self.ports is None:
            return
        if main is not None:
            self.ports.stands_for(self.broker, main)
        await self.ports.reopen_known()

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
        assert isinstance(request, ListenerRequest) and self.ports is not None
        try:
            return await self.ports.open(request.upstream)
        except (OSError, NoListener) as exc:
            return exc

    async def probe(self) -> str | None:
        """None when the configured broker accepts a connection; otherwise why not."""
        return await _reach(self.broker, self.connect_timeout)

    async def aclose(self) -> None:
        pass


async def _reach(broker: Address, timeout: float) -> str | None:
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(broker.host, broker.port)
    except (OSError, trio.TooSlowError) as exc:
        return f"cannot reach {broker}: {exc or 'timed out'}"
    await stream.aclose()
    return None


def make_backend(config: ProxyConfig, services: Services) -> CursusBackend:
    """The registry's factory (``sluice.protocols.cursus.spec``)."""
    return CursusBackend(
        config.broker,
        CursusSettings(
            config.on_invalid,
            max_frame_size=config.max_frame_size,
            compression=Compression.parse(config.broker_compression),
        ),
        CursusRouting(config.broker.address, config.allow_broker),
        broker_tls=config.broker_tls,
        connect_timeout=config.connect_timeout,
        faults=services.faults,
        ports=services.ports,
    )


async def check_broker(config: ProxyConfig) -> str | None:
    """``sluice proxy``'s startup check: None when the broker takes a connection."""
    problem = await _reach(config.broker.address, config.connect_timeout)
    if problem is None:
        return None
    return f"cannot reach Cursus broker {problem.removeprefix('cannot reach ')}"
