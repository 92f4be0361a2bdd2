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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from sluice.addresses import Address, AllowList
from sluice.protocols import registry
from sluice.protocols.core import Conn, Tap
from sluice.protocols.faults import Faults
from sluice.protocols.filtering import Filtering
from sluice.protocols.urls import BrokerUrl
from sluice.proxy.dial import client_ssl_context, open_tcp
from sluice.proxy.ports import BrokerPorts, NoListener
from sluice.proxy.relay import Core


class Unauthorized(Exception):
    """A web request whose client the backend did not authenticate (the
    message says why: the HTTP listener answers it with 401)."""


@dataclass
class Services:
    """What the proxy lends the backend it builds."""

    faults: Faults
    # --workers: the directory the workers share state in (None: a lone proxy).
    state: Path | None = None
    # Port-per-broker listeners (None unless the protocol asks for them).
    ports: BrokerPorts | None = None
    # --filter: the process's message filters (None: none configured).
    filters: Filtering | None = None


@dataclass
class Prepared:
    """A reloaded configuration a backend made ready (``Backend.prepare``):
    ``apply`` puts it in force; ``drop`` lets it go when the reload is not
    put in force after all (another worker refused it), stopping what was
    started for it (an issuer's keys, Sluice's own token, fetched on
    schedule). One of the two is called, once."""

    apply: Callable[[], None]
    drop: Callable[[], None] = lambda: None


class Backend(Protocol):
    """One protocol's side of a proxy.

    Life: ``start`` once the proxy runs (background tasks of its own go in
    ``nursery``), ``listening`` once the proxy's listeners accept (on
    ``main``, its first listener's port), ``aclose`` when it stops.
    Per connection: ``new_core`` makes the sans-I/O core the relay drives
    (``upstream``: the broker the connection's listener or TLS server name
    stands for) and ``ask`` carries out the core's ``Ask`` actions.
    ``listener_urls`` serves the HTTP listener (``http.py``): from the
    binary URLs of one broker an HTTP lookup answer names, the URLs of
    Sluice's listeners for that broker, by kind (``PLAIN``, ``TLS``; empty:
    none, and the answer's URLs stay as they are);
    ``web_credentials`` the client of a web request: None to pass its
    credentials on as they are, or the headers that replace them (the
    protocol's proxy-mode authentication), or ``Unauthorized``. The proxy
    dials brokers with ``tls_context``, routes TLS server names with
    ``route_name`` (``named``: the ``--sni-route`` ones) and keeps /readyz
    current with ``probe``."""

    name: str
    # The state every connection of the proxy shares (the protocol's own).
    routing: Any
    named: dict[str, BrokerUrl]
    # Whether its clients make a connection per request (Cursus: one per
    # commit), which the proxy then serves on its relay thread from the
    # first byte, without a trio task (``Relay.park``).
    short_lived: bool

    async def start(self, nursery: trio.Nursery, tap: Tap) -> None: ...

    async def listening(self, main: int | None) -> None: ...

    async def prepare(self, config: Any, filters: Any) -> Prepared: ...

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> Core: ...

    async def ask(self, address: Address, request: Any) -> Any: ...

    async def listener_urls(self, urls: Sequence[str]) -> dict[str, str]: ...
    async def web_credentials(
        self, authorization: str | None, peer_role: str | None
    ) -> list[tuple[bytes, bytes]] | None: ...

    def route_name(self, name: str) -> Address | None: ...

    def tls_context(self, tls: bool) -> ssl.SSLContext | None: ...

    async def probe(self) -> str | None: ...

    async def aclose(self) -> None: ...


class DirectBackend:
    """The parts of a backend whose client connections each dial their own
    broker and share nothing else (Cursus, and any protocol like it):
    nothing runs in the background, a probe is a TCP connect, and with
    port-per-broker (``ports``) the main listener stands for the configured
    broker and a core's ``Ask`` for a broker gets that broker's listener.
    A subclass sets ``name`` and ``routing`` (a ``ListenerMap`` with
    ``listeners`` when it uses ``ports``) and makes its cores; one that
    dials its brokers with TLS, ``_tls_context`` (``dial.client_ssl_context``
    of the config's ``broker_tls``), which a reload makes anew."""

    name: str
    routing: Any
    short_lived = False
    _tls_context: ssl.SSLContext | None = None

    def __init__(
        self, broker: BrokerUrl, services: Services, connect_timeout: float, routing: Any
    ) -> None:
        self.broker = broker.address
        self.connect_timeout = connect_timeout
        self.faults = services.faults
        self.ports = services.ports
        self.routing = routing
        if self.ports is not None:
            self.ports.map = routing
        # --sni-route: TLS server names that stand for a broker.
        self.named: dict[str, BrokerUrl] = {}

    async def start(self, nursery: trio.Nursery, tap: Tap) -> None:
        """Nothing of its own to run."""

    async def prepare(self, config: Any, filters: Any) -> Prepared:
        """A reloaded configuration (a ``ProxyConfig``): its allow-list and
        TLS toward brokers (its files read again), checked and made now
        (ConfigError), put in force by ``apply`` (nothing to drop)."""
        rules = AllowList(config.allow_broker, "--allow-broker").rules
        tls = client_ssl_context(config.broker_tls) if self._tls_context is not None else None

        def apply() -> None:
            self.routing.allowlist.rules = rules
            if tls is not None:
                self._tls_context = tls

        return Prepared(apply)

    async def listening(self, main: int | None) -> None:
        """The main listener stands for the configured broker; the ports an
        earlier run gave brokers are listened on again."""
        if self.ports is None:
            return
        if main is not None:
            self.ports.stands_for(self.broker, main)
        await self.ports.reopen_known()

    async def ask(self, address: Address, request: Any) -> Address | Exception:
        """A core's request for the listener of the broker at ``address``."""
        assert self.ports is not None
        try:
            return await self.ports.open(address)
        except (OSError, NoListener) as exc:
            return exc

    async def web_credentials(
        self, authorization: str | None, peer_role: str | None
    ) -> list[tuple[bytes, bytes]] | None:
        """Web requests' credentials pass on as they are."""
        return None

    async def listener_urls(self, urls: Sequence[str]) -> dict[str, str]:
        """No web port with lookups: every URL stays as it is."""
        return {}

    def route_name(self, name: str) -> Address | None:
        """SNI routing: the broker a TLS server name stands for: an
        --sni-route, or a broker that has a listener, by its host."""
        url = self.named.get(name)
        if url is not None:
            return url.address
        known: tuple[Address, ...] = (self.broker, *getattr(self.routing, "listeners", ()))
        for upstream in known:
            if upstream.host.lower().removesuffix(".") == name:
                return upstream
        return None

    def tls_context(self, tls: bool) -> ssl.SSLContext | None:
        return self._tls_context if tls else None

    async def probe(self) -> str | None:
        """None when the configured broker accepts a connection; otherwise why not."""
        return await reach(self.broker, self.connect_timeout)

    async def aclose(self) -> None:
        pass


async def reach(broker: Address, timeout: float) -> str | None:
    """None when ``broker`` accepts a TCP connection within ``timeout``; else why not."""
    try:
        with trio.fail_after(timeout):
            stream = await open_tcp(broker)
    except (OSError, trio.TooSlowError) as exc:
        return f"cannot reach {broker}: {exc or 'timed out'}"
    await stream.aclose()
    return None


async def check_reachable(config: Any) -> str | None:
    """A startup check (``ProtocolSpec.check_broker``) for a protocol whose
    broker need only accept a connection."""
    problem = await reach(config.broker.address, config.connect_timeout)
    if problem is None:
        return None
    title = registry.get(config.protocol).title
    return f"cannot reach {title} broker {problem.removeprefix('cannot reach ')}"
