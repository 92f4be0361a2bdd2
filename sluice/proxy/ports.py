"""Port-per-broker: a listener on the proxy for each broker clients must reach.

A protocol whose clients find brokers by addresses inside answers (Cursus
does, and Pulsar's HTTP lookups; Kafka proxies work the same way) keeps them
on the proxy by giving every broker a listener of its own: the main
listener stands for the configured broker (unless it serves clients
otherwise, ``ProtocolSpec.main_is_broker_listener``: Pulsar's serves
lookups), and every other broker an answer names gets one when its backend
first asks (``BrokerPorts.open``), on a port from
``--listener-ports`` (or any free port). Each client connection is relayed
to the broker its listener stands for. Which port stands for which broker
can be kept in a journal (``--broker-ports-file``) so a restarted proxy
gives every broker the port its clients know.

With ``--workers`` the supervisor binds the whole range at start
(``bind_range``) and the workers share it: which port a broker has is
decided by whichever worker first needs it, in ``SharedBrokerPorts``.

Any backend may use it (``ProtocolSpec.port_per_broker``); it knows no
protocol. The backend keeps the map of listeners its cores read
(``ListenerMap``); this module fills it.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

from sluice.addresses import Address, advertised
from sluice.proxy.dial import bind_all, listen_targets, open_listeners
from sluice.proxy.shared import SharedBrokerPorts

log = logging.getLogger("sluice.proxy")

# The socket kind of a worker's --listener-ports port (the supervisor's).
BROKER = "broker"


class NoListener(Exception):
    """No listener can be opened for a broker (the port range is used up)."""


class ListenerMap(Protocol):
    """Where a backend keeps which proxy address stands for which broker."""

    def listener_for(self, upstream: Address) -> Address | None: ...

    def add_listener(self, upstream: Address, proxy: Address) -> None: ...


class Listeners(dict[Address, Address]):
    """A plain ``ListenerMap``: the proxy address for each broker, by broker."""

    def listener_for(self, upstream: Address) -> Address | None:
        return self.get(upstream)

    def add_listener(self, upstream: Address, proxy: Address) -> None:
        self[upstream] = proxy


# Starts serving a new listener for a broker: (listener, its broker).
Serve = Callable[[trio.abc.Listener[Any], Address], None]


class BrokerPorts:
    """The proxy's port-per-broker listeners for one backend.

    ``host``: where they listen (the main listener's host), ``advertise``:
    the host clients are told (None: from ``host``), ``span``: the
    ``--listener-ports`` range (None: any free port), ``journal``: which
    port stands for which broker (shared by workers, kept by
    ``--broker-ports-file``), ``pool``: a worker's ports, bound by the
    supervisor (None: a lone proxy, which binds them itself). ``serve``
    starts a new listener; ``wrap`` makes a TCP listener speak what the main
    one speaks (TLS or not)."""

    def __init__(
        self,
        host: str,
        advertise: str | None,
        span: tuple[int, int] | None,
        journal: SharedBrokerPorts | None,
        pool: list[int] | None,
        wrap: Callable[[trio.SocketListener], trio.abc.Listener[Any]],
    ) -> None:
        self.host = host
        self.advertise = advertise
        self.span = span
        self.journal = journal
        self.pool = pool
        self.wrap = wrap
        self.map: ListenerMap | None = None  # the backend's, set by it
        self.serve: Serve | None = None  # the proxy's, once it accepts
        self._used: set[int] = set()

    def advertised(self, port: int) -> Address:
        """The address clients are told to dial for a listener on ``port``."""
        return advertised(self.host, port, self.advertise)

    def stands_for(self, upstream: Address, port: int) -> None:
        """The proxy's listener on ``port`` relays to ``upstream``."""
        assert self.map is not None
        self.map.add_listener(upstream, self.advertised(port))

    async def open(self, upstream: Address) -> Address:
        """The listener relaying to ``upstream``, opened if need be; its
        advertised address. Raises NoListener or OSError."""
        assert self.map is not None
        existing = self.map.listener_for(upstream)
        if existing is not None:
            return existing
        if self.pool is not None:  # a worker: the port is the supervisor's
            assert self.journal is not None
            try:
                port = self.journal.assign(upstream, self.pool)
            except ValueError as exc:
                raise NoListener(str(exc)) from None
            if port is None:
                low, high = self.span or (0, 0)
                raise NoListener(f"every port of --listener-ports {low}-{high} has a broker")
            self.stands_for(upstream, port)
            log.info("port %d stands for broker %s", port, upstream)
            return self.advertised(port)
        assert self.serve is not None
        span, journal = self.span, self.journal
        known = journal.port_of(upstream) if journal is not None else None
        if known is not None:  # given before, maybe by an earlier run: clients know it
            candidates: Iterable[int] = [known]
        elif span is not None:
            taken = journal.by_port if journal is not None else {}
            candidates = (p for p in range(span[0], span[1] + 1) if p not in taken)
        else:
            candidates = [0]
        for port in candidates:
            if port and port in self._used:
                continue
            try:
                listeners = await open_listeners(Address(self.host, port))
            except OSError as exc:
                if known is not None:
                    where = journal.path if journal is not None else "the journal"
                    raise NoListener(
                        f"port {port}, which {where} gives broker {upstream}, is taken: {exc}"
                    ) from None
                if span is None:
                    raise
                continue
            bound_port = listeners[0].socket.getsockname()[1]
            self._used.add(bound_port)
            if journal is not None and known is None:
                try:
                    journal.assign(upstream, [bound_port])
                except ValueError as exc:  # a host name no line can hold: this run only
                    log.warning("%s: %s", journal.path, exc)
            for listener in listeners:  # one per address the host resolves to
                self.serve(self.wrap(listener), upstream)
            self.stands_for(upstream, bound_port)
            log.info("listening on %s:%d for broker %s", self.host, bound_port, upstream)
            return self.advertised(bound_port)
        raise NoListener(f"no free port in --listener-ports {span[0]}-{span[1]}" if span else "")

    async def reopen_known(self) -> None:
        """Listen at once on every port the journal (an earlier run) gave a
        broker, for clients that still dial it. (Workers need not: the
        supervisor has bound the whole range.)"""
        if self.pool is not None or self.journal is None:
            return
        self.journal.refresh()
        for broker in list(self.journal.by_broker):
            try:
                await self.open(broker)
            except (NoListener, OSError) as exc:
                log.warning("broker %s: no listener on its earlier port: %s", broker, exc)

    def broker_of(self, port: int) -> Address | None:
        """The broker a worker's ``--listener-ports`` port stands for (given
        by whichever worker first needed it), learned here on first use."""
        assert self.journal is not None and self.map is not None
        upstream = self.journal.broker_for(port)
        if upstream is None:
            log.warning("connection on port %d, which stands for no broker yet: closed", port)
        elif self.map.listener_for(upstream) is None:
            self.stands_for(upstream, port)
        return upstream


def bind_range(host: str, low: int, high: int) -> list[socket.socket]:
    """The supervisor's part (``--workers``): every port of
    ``--listener-ports`` that is free, bound now and shared by the workers
    (which port stands for which broker is decided later, in
    ``SharedBrokerPorts``)."""
    # Every worker holds every one of them: a range near the open-files
    # limit would leave the workers no descriptors for their clients.
    targets = listen_targets(Address(host, low))  # resolved once for the range
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    descriptors = (high - low + 1) * len(targets)  # one per port and address
    if files != resource.RLIM_INFINITY and descriptors > files // 4:
        raise OSError(
            f"--listener-ports {low}-{high} on {host or 'every interface'} is "
            f"{descriptors} sockets, and each worker holds them all: more than a quarter "
            f"of the open-files limit ({files}; ulimit -n). Give a smaller range."
        )
    bound: list[socket.socket] = []
    bound_ports = 0
    for port in range(low, high + 1):
        try:
            sockets = bind_all(Address(host, port), targets=targets)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                continue  # the main listener, say: a lone proxy would skip it too
            raise OSError(f"--listener-ports: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from None  # fmt: skip
        bound.extend(sockets)
        bound_ports += 1
    if not bound_ports:
        raise OSError(f"no free port in --listener-ports {low}-{high}")
    log.info("%d of --listener-ports %d-%d bound for the brokers replies name", bound_ports,
             low, high)  # fmt: skip
    return bound
