"""Port-per-broker: a listener on the proxy for each broker clients must reach.

A protocol whose clients find brokers by addresses inside answers (Cursus
does, and Pulsar's HTTP lookups; Kafka proxies work the same way) keeps them
on the proxy by giving every broker a listener of its own: the main
listener stands for the configured broker (unless it serves clients
otherwise, ``ProtocolSpec.main_is_broker_listener``: Pulsar's serves
lookups), and every other broker an answer names gets one when its backend
first asks (``BrokerPorts.open``), on a port from
``--listener-ports`` (or any free port). A listener speaks TLS or not; a
broker gets one of each kind the proxy listens with (``--listen``,
``--listen-tls``) that an answer asks for, so that a client told a TLS
broker URL reaches the broker through Sluice over TLS. Each client
connection is relayed to the broker its listener stands for. Which port stands for which broker
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

import contextlib
import errno
import ipaddress
import itertools
import logging
import resource
import socket
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

from sluice.addresses import Address, advertised
from sluice.proxy.dial import bind_all, listen_targets, open_listeners
from sluice.proxy.shared import PLAIN, TLS, SharedBrokerPorts

log = logging.getLogger("sluice.proxy")

# The socket kind of a worker's --listener-ports port (the supervisor's).
BROKER = "broker"


def broker_key(upstream: Address) -> Address:
    """One spelling of a broker's address, for telling brokers apart: a
    host name in lower case without a trailing dot (the same name to DNS),
    an IP address as ``ipaddress`` writes it (``0:0::1``, ``[::1]``: ``::1``)."""
    host = upstream.host
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        host = host.lower().removesuffix(".")
    return Address(host, upstream.port)


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

    def drop_listener(self, upstream: Address) -> None:
        """``upstream`` (however an answer spelled it) has no listener now."""
        key = broker_key(upstream)
        for spelled in [u for u in self if broker_key(u) == key]:
            del self[spelled]


# Starts serving a new listener for a broker: (listener, its broker, its kind).
Serve = Callable[[trio.abc.Listener[Any], Address, str], None]
# Makes a TCP listener speak a kind (PLAIN: as it is; TLS: wrapped).
Wrap = Callable[[trio.SocketListener, str], trio.abc.Listener[Any]]


class BrokerPorts:
    """The proxy's port-per-broker listeners for one backend.

    ``host``: where they listen (the main listener's host), ``advertise``:
    the host clients are told (None: from ``host``), ``span``: the
    ``--listener-ports`` range (None: any free port), ``journal``: which
    port stands for which broker (shared by workers, kept by
    ``--broker-ports-file``), ``pool``: a worker's ports, bound by the
    supervisor (None: a lone proxy, which binds them itself). ``kinds``:
    the kinds of listener the proxy has (``PLAIN``, ``TLS``), the main
    listener's first: a broker's listener is of the main kind unless asked
    otherwise. ``serve`` starts a new listener; ``wrap`` makes a TCP
    listener speak a kind. The backend sets ``map``, where the main kind's
    listeners are kept (its cores read it); the other kind's are kept here."""

    def __init__(
        self,
        host: str,
        advertise: str | None,
        span: tuple[int, int] | None,
        journal: SharedBrokerPorts | None,
        pool: list[int] | None,
        wrap: Wrap,
        kinds: tuple[str, ...] = (PLAIN,),
    ) -> None:
        self.host = host
        self.advertise = advertise
        self.span = span
        self.journal = journal
        if journal is not None and journal.span is None:
            journal.span = span  # its lines for ports outside the range are ignored
        self.pool = pool
        self.wrap = wrap
        self.kinds = kinds
        self.map: ListenerMap | None = None  # the backend's, set by it
        self._other: dict[str, Listeners] = {kind: Listeners() for kind in kinds[1:]}
        self.serve: Serve | None = None  # the proxy's, once it accepts
        self._used: set[int] = set()
        # The port of each broker (``broker_key``) and kind that has a
        # listener, however answers spell the broker; and those whose
        # listener is being opened (``open``).
        self._given: dict[tuple[Address, str], int] = {}
        self._opening: dict[tuple[Address, str], trio.Event] = {}
        # The listeners this proxy opened for each broker and kind (a lone
        # proxy's: a worker's ports are the supervisor's), and when an
        # answer last asked for each broker's (``open``, on ``clock``).
        self._opened: dict[tuple[Address, str], list[trio.abc.Listener[Any]]] = {}
        self._asked: dict[Address, float] = {}
        # Asks (``open``) and let-gos (``asked_since`` saying no, on which
        # the backend forgets the broker) in the order they came, by
        # broker: a ``forget`` whose broker was asked for after its let-go
        # (named again before the backend's sweep came to it) is stale.
        self._order = itertools.count()
        self._asked_at: dict[Address, int] = {}
        self._let_go_at: dict[Address, int] = {}
        self.clock: Callable[[], float] = trio.current_time
        self.draining = False  # (``let_go``)
        # A worker's ports whose forgotten broker a connection was refused
        # for (``broker_of``): said once.
        self._said_forgotten: set[int] = set()
        # Told of each broker forgotten (``forget``): a worker's, so that
        # workers started later know (``shared.ForgottenRoutes``).
        self.forgetting: Callable[[Address], None] | None = None

    def let_go(self) -> None:
        """Draining: no new broker is given a port (a proxy started in this
        one's place gives them), and the journal is let go to that proxy."""
        self.draining = True
        if self.journal is not None:
            self.journal.let_go()

    def _map(self, kind: str) -> ListenerMap:
        if kind == self.kinds[0]:
            assert self.map is not None
            return self.map
        return self._other[kind]

    def advertised(self, port: int) -> Address:
        """The address clients are told to dial for a listener on ``port``."""
        return advertised(self.host, port, self.advertise)

    def stands_for(self, upstream: Address, port: int, kind: str | None = None) -> None:
        """The proxy's listener on ``port`` (of ``kind``; None: the main
        kind) relays to ``upstream``."""
        kind = kind or self.kinds[0]
        self._given[broker_key(upstream), kind] = port
        self._map(kind).add_listener(upstream, self.advertised(port))

    async def open(self, upstream: Address, kind: str | None = None) -> Address:
        """The listener of ``kind`` (None: the main kind) relaying to
        ``upstream``, opened if need be; its advertised address. Raises
        NoListener or OSError."""
        kind = kind or self.kinds[0]
        self._asked[broker_key(upstream)] = self.clock()
        self._asked_at[broker_key(upstream)] = next(self._order)
        existing = self._map(kind).listener_for(upstream)
        if existing is not None:
            return existing
        # Lookups naming a new broker at the same moment (clients that
        # reconnect together): the first opens its listener, the others
        # wait for it and are told the same one (opening it again would
        # leave a listener, and a journal line, for nobody).
        key = (broker_key(upstream), kind)
        while (opening := self._opening.get(key)) is not None:
            await opening.wait()
        port = self._given.get(key)
        if port is not None:  # the broker as another answer spelled it
            self.stands_for(upstream, port, kind)
            return self.advertised(port)
        self._opening[key] = trio.Event()
        try:
            return await self._open(upstream, key[0], kind)
        finally:
            self._opening.pop(key).set()

    async def _open(self, upstream: Address, broker: Address, kind: str) -> Address:
        """``open``'s listener, not yet opened; ``broker``: ``upstream`` as
        the journal keeps it (``broker_key``)."""
        what = f"{'TLS ' if kind == TLS else ''}broker {upstream}"
        if self.pool is not None:  # a worker: the port is the supervisor's
            assert self.journal is not None
            try:
                port = self.journal.assign(broker, self.pool, kind)
            except ValueError as exc:
                raise NoListener(str(exc)) from None
            if port is None:
                low, high = self.span or (0, 0)
                raise NoListener(f"every port of --listener-ports {low}-{high} has a broker")
            self.stands_for(upstream, port, kind)
            log.info("port %d stands for %s", port, what)
            return self.advertised(port)
        assert self.serve is not None
        if self.draining:  # (a worker's journal says so itself)
            raise NoListener(f"draining: no listener is opened for {what}")
        span, journal = self.span, self.journal
        known = journal.port_of(broker, kind) if journal is not None else None
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
                if port and exc.errno != errno.EADDRINUSE:  # (out of descriptors, say)
                    # Not this port's doing: no other would do, and "no free
                    # port" would have the range widened, in vain.
                    raise NoListener(f"cannot listen on {self.host}:{port} for {what}: "
                                     f"{exc.strerror or exc}") from None  # fmt: skip
                if known is not None:
                    where = journal.path if journal is not None else "the journal"
                    raise NoListener(
                        f"port {port}, which {where} gives {what}, is taken: {exc}"
                    ) from None
                if span is None:
                    raise
                continue
            bound_port = listeners[0].socket.getsockname()[1]
            self._used.add(bound_port)
            # (A known port is given again too: one whose broker was
            # forgotten is its own once more.)
            if journal is not None:
                try:
                    journal.assign(broker, [bound_port], kind)
                except ValueError as exc:  # a host name no line can hold: this run only
                    log.warning("%s: %s", journal.path, exc)
            opened = self._opened.setdefault((broker, kind), [])
            for listener in listeners:  # one per address the host resolves to
                wrapped = self.wrap(listener, kind)
                opened.append(wrapped)
                self.serve(wrapped, upstream, kind)
            self.stands_for(upstream, bound_port, kind)
            log.info("listening on %s:%d for %s", self.host, bound_port, what)
            return self.advertised(bound_port)
        raise NoListener(f"no free port in --listener-ports {span[0]}-{span[1]}" if span else "")

    def asked_since(self, upstream: Address, since: float) -> bool:
        """Whether an answer asked for ``upstream``'s listener (``open``) at
        ``since`` or later, on ``clock``. (No: the backend lets the
        broker go, and ``forget`` follows, unless it is asked for first.)"""
        broker = broker_key(upstream)
        asked = self._asked.get(broker)
        if asked is not None and asked >= since:
            return True
        self._let_go_at[broker] = next(self._order)
        return False

    async def forget(self, upstream: Address) -> bool:
        """A broker no answer names any more: its listeners (of every kind)
        closed, so that nothing relays to its address again. Its port stays
        its own in the journal (``--broker-ports-file``: a broker that
        comes back is given it again), marked forgotten there, so that a
        restart does not listen for it again; without one it may be given to
        another broker. A worker's ports are the supervisor's and stay
        bound: what this worker knew of it is dropped, and the journal marks
        it forgotten once every worker has forgotten it (a connection to its
        port is closed then, ``broker_of``). Whether a listener was closed.
        Nothing is done for a broker asked for (``open``) since the backend
        let it go (``asked_since``): an answer named it again meanwhile,
        whose client is told its listener (the backend learned it again)."""
        broker = broker_key(upstream)
        let_go = self._let_go_at.pop(broker, None)
        if let_go is not None and self._asked_at.get(broker, -1) > let_go:
            return False
        self._asked.pop(broker, None)
        self._asked_at.pop(broker, None)
        if self.forgetting is not None:
            self.forgetting(upstream)
        closed = False
        for kind in self.kinds:
            key = (broker, kind)
            port = self._given.pop(key, None)
            if self.journal is not None:
                self.journal.forget(broker, kind)
            map_ = self._map(kind)
            if isinstance(map_, Listeners):
                map_.drop_listener(upstream)
            listeners = self._opened.pop(key, [])
            for listener in listeners:
                with contextlib.suppress(trio.ClosedResourceError, OSError):
                    await listener.aclose()
            if port is not None and listeners:
                # (The journal, if any, keeps it from other brokers.)
                self._used.discard(port)
                closed = True
                log.debug("closed the %s listener on port %d for broker %s", kind, port, upstream)
        return closed

    async def reopen_known(self) -> list[Address]:
        """Listen at once on every port the journal (an earlier run) gave a
        broker, for clients that still dial it. (Workers need not: the
        supervisor has bound the whole range: a port of the journal it
        could not bind is only warned about.) The brokers listened for so
        (none for a worker), for a backend that forgets brokers to count
        as learned: no answer of this run may ever name them."""
        reopened: list[Address] = []
        if self.journal is None:
            return reopened
        self.journal.refresh()
        if self.pool is not None:
            for (broker, _kind), port in self.journal.by_broker.items():
                if port not in self.pool:
                    log.warning("broker %s: port %d, which %s gives it, was in use at "
                                "start (by another program): the broker "
                                "is given another port when a reply names it", broker, port,
                                self.journal.path)  # fmt: skip
            return reopened
        for (broker, kind), port in list(self.journal.by_broker.items()):
            if port in self.journal.forgotten:  # until a lookup names it again
                continue
            if kind not in self.kinds:
                log.warning("broker %s: no listener on its earlier port %d: this proxy has "
                            "no %s listener", broker, port, kind)  # fmt: skip
                continue
            try:
                await self.open(broker, kind)
            except (NoListener, OSError) as exc:
                log.warning("broker %s: no listener on its earlier port: %s", broker, exc)
                continue
            if broker not in reopened:
                reopened.append(broker)
        return reopened

    def broker_of(self, port: int) -> tuple[Address, str] | None:
        """The broker a worker's ``--listener-ports`` port stands for (given
        by whichever worker first needed it) and the port's kind, learned
        here on first use."""
        assert self.journal is not None
        found = self.journal.broker_for(port)
        if found is None:
            if port not in self.journal.forgotten:
                log.warning("connection on port %d, which stands for no broker yet: closed", port)
            elif port not in self._said_forgotten:  # (once: its clients look up again)
                self._said_forgotten.add(port)
                log.info("connection on port %d, whose broker %s was forgotten: closed (a "
                         "lookup naming the broker again gives it its port back)", port,
                         self.journal.by_port[port][0])  # fmt: skip
            return None
        self._said_forgotten.discard(port)
        upstream, kind = found
        if kind not in self.kinds:
            log.warning("connection on port %d, a %s port, which this proxy does not "
                        "serve: closed", port, kind)  # fmt: skip
            return None
        # (Not where this worker forgot the broker: a lookup naming it here
        # must give the port again, taking this worker's forgetting back.)
        if self._map(kind).listener_for(upstream) is None and not self.journal.has_voted(port):
            self.stands_for(upstream, port, kind)
        return found


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
    busy: list[int] = []
    for port in range(low, high + 1):
        try:
            sockets = bind_all(Address(host, port), targets=targets)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                busy.append(port)
                continue  # the main listener, say: a lone proxy would skip it too
            raise OSError(f"--listener-ports: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from None  # fmt: skip
        bound.extend(sockets)
        bound_ports += 1
    if not bound_ports:
        raise OSError(f"no free port in --listener-ports {low}-{high}")
    if busy:
        shown = ", ".join(map(str, busy[:10])) + (
            f" and {len(busy) - 10} more" if busy[10:] else ""
        )
        log.warning("--listener-ports: %s in use by another listener: no broker is given "
                    "%s", shown, "them" if len(busy) > 1 else "it")  # fmt: skip
    log.info("%d of --listener-ports %d-%d bound for the brokers replies name", bound_ports,
             low, high)  # fmt: skip
    return bound
