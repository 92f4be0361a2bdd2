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

from sluice.addresses import Address
from sluice.protocols.core import Conn, Tap
from sluice.protocols.cursus.compression import Compression
from sluice.protocols.cursus.connection import (
    CursusConnection,
    CursusRouting,
    CursusSettings,
    ListenerRequest,
)
from sluice.proxy.backend import DirectBackend, Services
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import client_ssl_context


class CursusBackend(DirectBackend):
    name = "cursus"
    routing: CursusRouting
    # A Cursus consumer commits on a connection of its own, each time.
    short_lived = True

    def __init__(self, config: ProxyConfig, services: Services) -> None:
        super().__init__(
            config.broker,
            services,
            config.connect_timeout,
            CursusRouting(config.broker.address, config.allow_broker),
        )
        self.settings = CursusSettings(
            config.on_invalid,
            max_frame_size=config.max_frame_size,
            compression=Compression.parse(config.broker_compression),
        )
        # cursus+ssl://: every broker of the cluster is dialled with TLS.
        self.tls = config.broker.tls
        self._tls_context = client_ssl_context(config.broker_tls) if self.tls else None

    def tls_context(self, tls: bool) -> ssl.SSLContext | None:
        return self._tls_context if tls else None

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> CursusConnection:
        return CursusConnection(
            conn, self.settings, self.routing, tap, upstream=upstream, tls=self.tls,
            faults=self.faults,
        )  # fmt: skip

    async def ask(self, address: Address, request: Any) -> Address | Exception:
        """A core's ``ListenerRequest``: the listener for its broker."""
        assert isinstance(request, ListenerRequest)
        return await super().ask(request.upstream, request)
