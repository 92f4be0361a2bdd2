"""What the protocol-neutral proxy needs from a protocol: its ``Backend``.

``Proxy`` (``server.py``) builds one backend for the protocol the config
names, by the factory its ``ProtocolSpec.backend`` names:
``make_backend(config, services) -> Backend``. The proxy lends the backend
``Services``: the fault rules, the directory ``--workers`` share state in,
and the port-per-broker listeners when the protocol asks for them
(``ProtocolSpec.port_per_broker``, ``ports.py``). Everything a protocol does
with sockets of its own (shared upstream connections, probes, listeners per
broker) lives behind this interface; ``server.py`` and ``workers.py`` name
no protocol.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from sluice.addresses import Address
from sluice.protocols.core import Conn, Tap
from sluice.protocols.faults import Faults
from sluice.protocols.urls import BrokerUrl
from sluice.proxy.ports import BrokerPorts
from sluice.proxy.relay import Core


@dataclass
class Services:
    """What the proxy lends the backend it builds."""

    faults: Faults
    # --workers: the directory the workers share state in (None: a lone proxy).
    state: Path | None = None
    # Port-per-broker listeners (None unless the protocol asks for them).
    ports: BrokerPorts | None = None


class Backend(Protocol):
    """One protocol's side of a proxy.

    Life: ``start`` once the proxy runs (background tasks of its own go in
    ``nursery``), ``listening`` once the proxy's listeners accept (on
    ``main``, its first listener's port), ``aclose`` when it stops.
    Per connection: ``new_core`` makes the sans-I/O core the relay drives
    (``upstream``: the broker the connection's listener or TLS server name
    stands for) and ``ask`` carries out the core's ``Ask`` actions. The proxy
    dials brokers with ``tls_context``, routes TLS server names with
    ``route_name`` (``named``: the ``--sni-route`` ones) and keeps /readyz
    current with ``probe``."""

    name: str
    # The state every connection of the proxy shares (the protocol's own).
    routing: Any
    named: dict[str, BrokerUrl]

    def start(self, nursery: trio.Nursery, tap: Tap) -> None: ...

    async def listening(self, main: int | None) -> None: ...

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> Core: ...

    async def ask(self, address: Address, request: Any) -> Any: ...

    def route_name(self, name: str) -> Address | None: ...

    def tls_context(self, tls: bool) -> ssl.SSLContext | None: ...

    async def probe(self) -> str | None: ...

    async def aclose(self) -> None: ...
