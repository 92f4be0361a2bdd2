"""The proxy: listeners, connection limits, dispatch, graceful drain.

``Proxy`` is where the parts meet: a protocol backend (cores for client
connections, the proxy's own upstream connections), the taps (metrics, the
recorder), the admin endpoint, and one ``Relay`` per client connection.
Nothing here looks at frames.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import gc
import itertools
import logging
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from sluice.addresses import Address, server_name
from sluice.errors import ConfigError
from sluice.filters.chain import make_filters
from sluice.logs import LogLimit
from sluice.protocols import registry
from sluice.protocols.core import Accepted, Conn, Rejected, Taps
from sluice.protocols.faults import Faults
from sluice.protocols.haproxy import HeaderError, v2_header
from sluice.proxy import hangup
from sluice.proxy.admin import (
    RELOAD_TIME,
    ConfigEndpoint,
    FaultsEndpoint,
    Handler,
    SnapshotEndpoint,
    bound,
    open_admin,
    serve_admin,
)
from sluice.proxy.backend import Backend, Services
from sluice.proxy.config import ProxyConfig, listening_for, proxy_protocol_in
from sluice.proxy.dial import (
    CertificateReloader,
    accepted,
    certificate_cn,
    close_stream,
    dial,
    open_listeners,
    server_ssl_context,
    socket_stream,
    start_tcp,
)
from sluice.proxy.http import HTTP, HTTPS, HttpRelay
from sluice.proxy.http_recording import HttpRecording
from sluice.proxy.inbound import local_address, peer_address, transport
from sluice.proxy.live import LiveEndpoint, LiveTap
from sluice.proxy.metrics import HttpMetrics, Metrics
from sluice.proxy.ports import BROKER, BrokerPorts
from sluice.proxy.relay import Dialer, Parking, Relay, RuleRemovals, Timing
from sluice.proxy.relay_thread import RelayThread, relay_thread
from sluice.proxy.relay_thread import wanted as relay_thread_wanted
from sluice.proxy.reload import (
    Generation,
    Outcome,
    effective,
    flags,
    held,
    read_again,
    split,
    watched,
)
from sluice.proxy.shared import (
    BROKER_PORTS_FILE,
    BROKER_PORTS_LOCK,
    HTTP_LIMITS_FILE,
    LIMITS_FILE,
    PLAIN,
    TLS,
    LocalLimits,
    SharedBrokerPorts,
    SharedLimits,
)
from sluice.recording.format import PayloadPolicy
from sluice.recording.writer import Recorder

try:  # a parked connection's accept in compiled code (rust/src/sockets.rs)
    from sluice._frames import accept_now
except ImportError:  # a source tree nobody built
    accept_now = None  # type: ignore[assignment]

log = logging.getLogger("sluice.proxy")

# How often the upstream broker is probed for /readyz and sluice_upstream_up.
PROBE_INTERVAL = 5.0
# How long a connection may stay parked on the relay thread (Relay.park)
# before trio takes it over (sooner with short handshake or keepalive
# settings): a commit's connection lives a millisecond or so.
PARKED_FOR = 1.0


@dataclass
class _ServerName:
    """One TLS handshake under SNI routing, as the server-name callback
    left it: the name, the broker it chose, or why it was refused."""

    name: str | None = None
    route: Address | None = None
    refused: str | None = None


# A TLS alert record: fatal (2), unrecognized_name (112), before any
# encryption (the server-name callback runs before the ServerHello).
_UNRECOGNIZED_NAME = bytes([21, 3, 3, 0, 2, 2, ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME])


def _callback_failed(exc: BaseException) -> bool:
    """Whether a failed handshake is OpenSSL's server-name callback failing."""
    cause = exc.__cause__
    return isinstance(cause, ssl.SSLError) and cause.reason == "CALLBACK_FAILED"


def _quiet_undecodable_names(unraisable: Any) -> None:
    """Python's ssl reports a server name it cannot decode as an exception
    "ignored" on stderr, a traceback any client could have printed at will;
    the handshake's failure is counted and logged (``sni_invalid``) instead."""
    if isinstance(unraisable.exc_value, UnicodeDecodeError) and isinstance(
        unraisable.object, bytes
    ):
        return
    _UNRAISABLE(unraisable)


_UNRAISABLE = sys.unraisablehook

# The handshake the callback belongs to: OpenSSL calls it synchronously
# inside do_handshake(), in the task that handles the connection.
_HANDSHAKE: contextvars.ContextVar[_ServerName | None] = contextvars.ContextVar(
    "sluice_sni", default=None
)


@dataclass
class WorkerRole:
    """How a worker process of ``--workers N`` differs from a lone proxy:
    its listening sockets come from the supervisor, state shared with its
    siblings lives in ``state``, and its connection ids never collide with
    theirs (worker i of N numbers its connections i+1, i+1+N, …). Sockets
    of kind ``broker`` are the ``--listener-ports`` (port-per-broker), each
    standing for the broker ``SharedBrokerPorts`` names, once one is given it."""

    index: int
    count: int
    state: Path
    sockets: list[tuple[str, socket.socket]]


# A reload's fetches before it can be put in force (Backend.prepare), one
# after another, each given --connect-timeout: Sluice's own OAuth2 token
# (its issuer's discovery document, then the token endpoint), then a changed
# OpenID Connect issuer's discovery document and its keys (issuers side by
# side). Besides: key files read, filters made.
RELOAD_FETCHES = 4
RELOAD_SLACK = 10.0


def prepare_time(config: ProxyConfig) -> float:
    """The longest a reload may take to be made ready (``Proxy.preparing``)
    under ``config`` (--connect-timeout is kept by a reload)."""
    return RELOAD_FETCHES * config.connect_timeout + RELOAD_SLACK


class Proxy:
    def __init__(self, config: ProxyConfig, worker: WorkerRole | None = None) -> None:
        self.config = config
        self.worker = worker
        self.protocol = registry.get(config.protocol)
        self.limits = self._limits(
            config.max_connections, config.max_connections_per_ip, LIMITS_FILE
        )
        if worker is None:
            self._ids = itertools.count(1)
        else:
            self._ids = itertools.count(worker.index + 1, worker.count)
        # One rule set for every connection; the config's rules are copied so
        # that their hit counts start from zero with each proxy.
        self.faults = Faults()
        self._removals = RuleRemovals(self.faults)
        self.faults.extend(copy.deepcopy(config.faults))
        # Configuration reloads: the generation in force, how to read the
        # settings again (set by the command; None: no reloads), the fault
        # rules that came with the configuration (a reload replaces those).
        self.generation = Generation(1, time.time(), "start")
        self.load: Callable[[], ProxyConfig] | None = None
        self._config_rules = [rule.id for rule in self.faults.rules]
        self._reloading = trio.Lock()
        self.ports = self._broker_ports() if self.protocol.port_per_broker else None
        # Made before the filters, which count into it (sluice_filter_messages_total).
        self.metrics = Metrics(config.topic_metrics_limit, self.protocol)
        self.filters = (
            make_filters(config.filters, self.protocol, self.metrics.filter_seen)
            if config.filters
            else None
        )
        # What the key files held when the backend below loaded them.
        self._held = held(config)
        make_backend = self.protocol.load(self.protocol.backend)
        self.backend: Backend = make_backend(
            config,
            Services(self.faults, worker.state if worker else None, self.ports, self.filters),
        )
        # --sni-route: names for brokers (the backend's), and for Sluice itself.
        routes = config.sni_routes()
        self.backend.named = {n: url for n, url in routes.items() if url is not None}
        self._own_names = {n for n, url in routes.items() if url is None}
        self.inbound = proxy_protocol_in(config)
        self._refusals = LogLimit()  # what anyone may repeat is logged once a minute
        self.timing = Timing(
            config.handshake_timeout, config.connect_timeout, config.keepalive_interval
        )
        self.metrics.generation(self.generation)
        if self.filters is not None:
            self.metrics.filters_configured(f.spec.id for f in self.filters.loaded)
        self.taps = Taps([self.metrics])
        # --http-listen: the broker's web port, relayed (sluice/proxy/http.py).
        self.http: HttpRelay | None = None
        if config.http_on:
            self.http = HttpRelay(
                config,
                HttpMetrics(self.metrics.registry),
                self.backend.listener_urls,
                self.backend.web_credentials,
                self.faults,
                lambda rule, action: self.metrics.faults_injected.labels(rule, action).inc(),
                self._limits(
                    config.http_max_connections, config.http_max_connections, HTTP_LIMITS_FILE
                ),
                proxy_protocol_in(config),
                self._header_refused("HTTP"),
                filters=lambda: self.filters,
            )
        self.recorder: Recorder | None = None
        if config.record is not None:
            listen = [str(a) for a in (config.listen, config.listen_tls) if a is not None]
            record = config.record
            if self.protocol.recorded is not None and not record.decoding:
                # What its frames decode with (Cursus: the broker's
                # compression), kept in every file's header for its readers.
                record = dataclasses.replace(record, decoding=self.protocol.recorded(config))
            self.recorder = Recorder(
                record,
                listen=listen,
                broker=str(config.broker),
                protocol=self.protocol,
                writers=worker.count if worker is not None else 1,
            )
            self.metrics.watch(self.recorder)
            self.taps.add(self.recorder)
            if self.http is not None:  # the HTTP listener's exchanges too
                self.http.watch = HttpRecording(
                    self.recorder, config.record.payloads, config.http_max_body
                )
        # The live view (POST /live on the admin endpoint): idle until watched.
        self.live: LiveTap | None = None
        if config.admin is not None:
            listen = [str(a) for a in (config.listen, config.listen_tls) if a is not None]
            payloads = config.record.payloads if config.record is not None else PayloadPolicy.HASH
            self.live = LiveTap(self.taps, self.protocol.name, payloads, listen=listen,
                                broker=str(config.broker))  # fmt: skip
            self.taps.add(self.live)
        # None until the first probe answers (within connect_timeout of start).
        self.upstream_ok: bool | None = None
        self.listening = False
        self.relays: set[Relay] = set()
        self._listeners: list[tuple[str, trio.abc.Listener[Any]]] = []
        self.addresses: dict[str, Address] = {}
        self._handlers: trio.Nursery | None = None
        self._stop = trio.Event()
        self.certificates: CertificateReloader | None = None
        self._tls_context: ssl.SSLContext | None = None  # the TLS listeners'
        self._thread: RelayThread | None = None  # while running, unless turned off
        # Connections served by the relay thread alone (``Relay.park``): when
        # each was accepted, and its client's IP (for the connection limits),
        # oldest first; the sweep hands those that live on to trio.
        self._parked: dict[Relay, tuple[float, str]] = {}
        self._parking = Parking(self._adopt, self._ended_parked, self._connect)
        self._stopping = False
        # Plain listeners the relay thread accepts on (``_accept_parked``),
        # by listener: the duplicate of its socket that the thread reads.
        self._accepting: dict[trio.SocketListener, socket.socket] = {}

    @property
    def routing(self) -> Any:
        """The state the backend's connections share."""
        return self.backend.routing

    def _broker_ports(self) -> BrokerPorts:
        """Port-per-broker listeners: which port stands for which broker, in
        a journal that outlives the proxy (--broker-ports-file) or its
        workers' state; and a worker's ports, the supervisor's."""
        config, worker = self.config, self.worker
        journal = None
        if worker is not None and (config.listener_ports or config.broker_ports_file):
            # (--broker-ports-file is held by the supervisor for its life.)
            journal = SharedBrokerPorts(
                config.broker_ports_file or worker.state / BROKER_PORTS_FILE,
                self._kind,
                lock=worker.state / BROKER_PORTS_LOCK,
            )
        elif config.broker_ports_file is not None:
            journal = SharedBrokerPorts(config.broker_ports_file, self._kind, held=True)
        return BrokerPorts(
            config.main_listen.host,
            config.advertise_host,
            config.listener_ports,
            journal,
            [] if worker is not None and config.listener_ports is not None else None,
            self._broker_listener,
            self._kinds,
        )

    # --- lifecycle ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``drain()``; ``task_status.started`` once listening."""
        # Listening errors (port in use) surface here, outside any nursery,
        # as a plain OSError the CLI can report in one line.
        # Admin first: once the proxy port accepts connections, the probes
        # endpoint is already there.
        admin = None
        if self.config.admin is not None:
            with listening_for("--admin", self.config.admin):
                admin = await open_admin(self.config.admin)
            self.addresses["admin"] = bound(admin)
        await self._open_listeners()
        if self.http is not None:
            self.addresses.update(await self.http.open())
        async with trio.open_nursery() as outer:
            if self.http is not None:
                outer.start_soon(self.http.serve)
            await self.backend.start(outer, self.taps)
            outer.start_soon(self._probe_upstream)
            if self.certificates is not None:
                outer.start_soon(self.certificates.run)
            if self.recorder is not None:
                await outer.start(self.recorder.run)
            if admin is not None:
                token = self.config.admin_token
                endpoints: dict[str, Handler] = {
                    "/faults": FaultsEndpoint(self.faults, registry.all_faults(), token),
                    "/recording": SnapshotEndpoint(self.recorder, token),
                    "/live": LiveEndpoint(self.live, token),
                    "/config": ConfigEndpoint(
                        self.generation_json,
                        self._reload_json,
                        token,
                        time_limit=max(RELOAD_TIME, prepare_time(self.config)),
                    ),
                }
                outer.start_soon(functools.partial(
                    serve_admin, admin, self.metrics.exposed, self.readiness, endpoints,
                    inbound=self.inbound, refused=self._header_refused("admin"),
                ))  # fmt: skip
            async with relay_thread(relay_thread_wanted()) as self._thread, \
                    trio.open_nursery() as handlers:  # fmt: skip
                self.metrics.watch_relay(self._thread)
                self._handlers = handlers
                if self._parks:
                    handlers.start_soon(self._sweep_parked)
                for kind, listener in self._listeners:
                    self._listen(listener, kind, None)
                if self.ports is not None:
                    self.ports.serve = self._serve_broker_listener
                main = self.addresses.get(PLAIN) or self.addresses.get(TLS)
                await self.backend.listening(main.port if main is not None else None)
                self.listening = True
                # Everything made while starting (modules, schema, config)
                # lives as long as the process: keep it out of the garbage
                # collector's full passes, which otherwise walk it all on
                # the hot path (measured: about 1 µs less per relayed message).
                gc.freeze()
                task_status.started(self)
                await self._stop.wait()
                self._stop_accepting()
                for relay in list(self._parked):  # no task of theirs to cancel
                    relay.abandon()
            await self.backend.aclose()
            outer.cancel_scope.cancel()

    # --- configuration reload ------------------------------------------------------

    def generation_json(self) -> dict[str, Any]:
        return self.generation.to_json()

    async def _reload_json(self) -> dict[str, Any]:
        return (await self.reload_from_source("admin")).to_json()

    async def reload_from_source(self, source: str) -> Outcome:
        """Read the settings again (``self.load``) and reload them."""
        if self.load is None:
            return self.refuse_reload(source, ["not started with reloadable settings"])
        new, errors = await read_again(self.load)
        if errors:
            return self.refuse_reload(source, errors)
        return await self.reload(new, source)

    async def reload(self, new: ProxyConfig, source: str, number: int | None = None) -> Outcome:
        """Put ``new`` in force where it may change live (``reload.LIVE``),
        keeping the rest as it was; all of it or, when any part does not
        check out, none. ``number``: the generation to call it (a worker
        takes its supervisor's)."""
        async with self.preparing(new, source, number) as prepared:
            return prepared if isinstance(prepared, Outcome) else prepared()

    @contextlib.asynccontextmanager
    async def preparing(
        self, new: ProxyConfig, source: str, number: int | None = None
    ) -> AsyncIterator[Outcome | Callable[[], Outcome]]:
        """``new`` checked and made ready to be put in force, no other
        reload meanwhile: a refused Outcome (nothing changed), or the
        function that puts it in force and says how it went. Left uncalled,
        nothing changes, and what was made for it is dropped on leaving
        (the background tasks the backend started for it stopped): so a
        worker puts a reload in force only once every worker could, and
        one aborted leaves nothing running (``workers._Reloads``)."""
        async with self._reloading:
            prepared = await self._prepare(new, source, number)
            if isinstance(prepared, Outcome):
                yield prepared
                return
            put_in_force, drop = prepared
            called = False

            def put() -> Outcome:
                nonlocal called
                called = True
                return put_in_force()

            try:
                yield put
            finally:
                if not called:
                    drop()

    async def _prepare(
        self, new: ProxyConfig, source: str, number: int | None
    ) -> Outcome | tuple[Callable[[], Outcome], Callable[[], None]]:
        """What ``preparing`` yields, and how to drop it when left uncalled."""
        old = self.config
        files = await trio.to_thread.run_sync(held, new)
        live, kept = split(old, new, self._held, files)
        kept_flags = flags(kept)
        if not live:

            def unchanged() -> Outcome:
                if number is not None:  # a supervisor's generation, whatever changed here
                    self.generation = Generation(number, time.time(), source)
                    self.metrics.generation(self.generation)
                outcome = Outcome.unchanged(self.generation, source, kept_flags)
                self.metrics.reloads.labels("unchanged").inc()
                self.metrics.config_refused.set(0)
                log.info("%s", outcome.summary())
                return outcome

            return unchanged, lambda: None
        try:
            config = effective(old, new, kept)
            filters = (
                make_filters(config.filters, self.protocol, self.metrics.filter_seen)
                if config.filters
                else None
            )
            faults = copy.deepcopy(config.faults)
            # The TLS listeners' context anew (a changed --tls-client-ca,
            # say): the connections accepted from then on are wrapped with it.
            context = None
            if "tls" in live and config.tls is not None and self._tls_context is not None:
                context = self._new_server_context(config)
            http = (
                self.http.prepare(config, "tls" in live)
                if self.http is not None
                else (lambda: None)
            )
            # Last: the backend may start tasks (an issuer's keys, Sluice's
            # own token) for what it made, which nothing after may undo.
            made = await self.backend.prepare(config, filters)
        except ConfigError as exc:
            return self.refuse_reload(source, str(exc).splitlines())

        def applied() -> Outcome:
            made.apply()
            if context is not None and config.tls is not None:
                self._tls_context = context
                if self.certificates is not None:  # its certificate and key, re-read there
                    self.certificates.config, self.certificates.context = config.tls, context
            if "faults" in live:  # (rules kept as they were keep their counts and holds)
                wanted = {rule.id: rule.definition() for rule in faults}
                kept = []
                for rule in [r for r in self.faults.rules if r.id in self._config_rules]:
                    if wanted.get(rule.id) == rule.definition():
                        kept.append(rule.id)  # unchanged: its hits, times and holds stay
                    else:
                        self.faults.remove(rule.id)
                added = [r for r in faults if not any(r.id == o.id for o in self.faults.rules)]
                self.faults.extend(added)
                self._config_rules = kept + [rule.id for rule in added]
                # In the file's order (the first rule that fires acts),
                # behind the rules added on /faults, as every reload put them.
                place = {rule.id: n for n, rule in enumerate(faults)}
                config_rules = set(self._config_rules)
                self.faults.rules.sort(
                    key=lambda r: place.get(r.id, -1) if r.id in config_rules else -1
                )
            self.limits.total = config.max_connections
            self.limits.per_ip = config.max_connections_per_ip
            http()
            if self.recorder is not None and config.record is not None:
                self.recorder.set_triggers(config.record.triggers)
            self.config, self.filters, self._held = config, filters, files
            if filters is not None:
                self.metrics.filters_configured(f.spec.id for f in filters.loaded)
            self.generation = Generation(
                number if number is not None else self.generation.number + 1, time.time(), source
            )
            self.metrics.generation(self.generation)
            self.metrics.reloads.labels("applied").inc()
            self.metrics.config_refused.set(0)
            outcome = Outcome("applied", self.generation, flags(live), kept_flags)
            log.warning("%s", outcome.summary())
            return outcome

        return applied, made.drop

    def watched(self) -> list[Path]:
        """The key and certificate files of the configuration in force, and
        the ``SLUICE_DEFAULTS`` file, whose change is a reload
        (``reload_when_asked``)."""
        return watched(self.config)

    def refuse_reload(self, source: str, errors: list[str]) -> Outcome:
        """A reload refused for ``errors`` (one line each): counted, logged,
        the generation in force kept."""
        self.metrics.reloads.labels("refused").inc()
        self.metrics.config_refused.set(time.time())
        outcome = Outcome.refused(self.generation, source, errors)
        log.error("%s", outcome.summary())
        return outcome

    def readiness(self, exclude: frozenset[str] = frozenset()) -> list[str]:
        """Why the proxy is not ready (empty: ready), for /readyz; the
        broker left out if ``exclude`` names ``upstream``."""
        problems = []
        if not self.listening:
            problems.append("not listening")
        if "upstream" not in exclude:
            if self.upstream_ok is None:
                problems.append(f"upstream {self.config.broker} not checked yet")
            elif not self.upstream_ok:
                problems.append(f"upstream {self.config.broker} unreachable")
        return problems

    def _server_context(self) -> ssl.SSLContext | None:
        """The TLS listeners' context (one for all), re-read when its
        certificate and key change (``certificates``), made anew when a
        reload changes the TLS settings (``_new_server_context``): each
        connection is wrapped with the one in force when it is accepted."""
        if self.config.tls is None:
            return None
        if self._tls_context is None:
            self._tls_context = self._new_server_context(self.config)
            self.certificates = CertificateReloader(self.config.tls, self._tls_context)
        return self._tls_context

    def _new_server_context(self, config: ProxyConfig) -> ssl.SSLContext:
        """A TLS listeners' context for ``config`` (ConfigError: files that do not load)."""
        assert config.tls is not None
        context = server_ssl_context(config.tls)
        if config.sni_on:
            context.sni_callback = self._server_name
            sys.unraisablehook = _quiet_undecodable_names
        return context

    def _tls_stream(self, tcp: trio.abc.Stream) -> trio.SSLStream[Any]:
        """An accepted connection of a TLS listener, with the context in force."""
        context = self._server_context()
        assert context is not None  # ProxyConfig: --listen-tls needs --tls-cert
        return trio.SSLStream(tcp, context, server_side=True, https_compatible=False)

    def _server_name(self, _: Any, name: str | None, __: Any) -> int | None:
        """SNI routing, inside the TLS handshake: the broker the client's
        server name stands for. No name: Sluice serves the client as usual
        (clients that dial an IP address send none); a name that is no DNS
        name, or names no broker: the handshake ends with the alert
        unrecognized_name."""
        handshake = _HANDSHAKE.get()
        if handshake is None or name is None:
            return None
        handshake.name = name
        normal = server_name(name)
        if normal is None:
            handshake.refused = "sni_invalid"
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        if normal in self._own_names:
            return None
        try:
            handshake.route = self.backend.route_name(normal)
        except Exception as exc:  # an exception here would end the handshake unexplained
            log.error("SNI routing of %r failed: %r", normal, exc)
            handshake.refused = "sni_unknown"
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        if handshake.route is None:
            handshake.refused = "sni_unknown"
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None

    def _limits(self, total: int, per_ip: int, table: str) -> LocalLimits:
        """Connection counts of this process, or with ``--workers`` of all
        of them (``table``: the supervisor's file for this kind of listener)."""
        if self.worker is None:
            return LocalLimits(total, per_ip)
        limits = SharedLimits(
            total, per_ip, self.worker.state / table, self.worker.index, self.worker.count
        )
        limits.reset_row()
        return limits

    @property
    def _kinds(self) -> tuple[str, ...]:
        """The kinds of listener the proxy has, the main one's (the first of
        --listen, --listen-tls) first; port-per-broker listeners are of these."""
        config = self.config
        return tuple(k for k, a in ((PLAIN, config.listen), (TLS, config.listen_tls)) if a)

    @property
    def _kind(self) -> str:
        """The main listener's kind."""
        return self._kinds[0]

    def _broker_listener(self, tcp: trio.SocketListener, kind: str) -> trio.abc.Listener[Any]:
        """A port-per-broker listener, speaking ``kind`` (its connections
        are wrapped in TLS as they are accepted: ``_accept_loop``)."""
        return tcp

    @property
    def active(self) -> int:
        """Client connections this process serves now."""
        return self.limits.active

    async def _open_listeners(self) -> None:
        config = self.config
        if self.worker is not None:
            for kind, sock in self.worker.sockets:
                tcp = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                if kind == BROKER:  # its kind (TLS or not) is known once a broker has it
                    assert self.ports is not None and self.ports.pool is not None
                    self.ports.pool.append(sock.getsockname()[1])
                    self._listeners.append((kind, tcp))
                elif kind in (HTTP, HTTPS):
                    assert self.http is not None
                    self.http.adopt(tcp, tls=kind == HTTPS)
                else:
                    self._add_listener(kind, tcp)
            return
        if config.listen is not None:
            with listening_for("--listen", config.listen):
                listeners = await open_listeners(config.listen)
            for listener in listeners:
                self._add_listener(PLAIN, listener)
        if config.listen_tls is not None:
            with listening_for("--listen-tls", config.listen_tls):
                listeners = await open_listeners(config.listen_tls)
            for listener in listeners:
                self._add_listener(TLS, listener)

    def _add_listener(self, kind: str, listener: trio.SocketListener) -> None:
        """A listener of ``kind`` (a TLS one's connections are wrapped in
        TLS as they are accepted: ``_accept_loop``)."""
        if kind == TLS:
            self._server_context()  # files that stopped loading: said now, not per client
        host, port = listener.socket.getsockname()[:2]
        self.addresses.setdefault(kind, Address(host, port))
        self._listeners.append((kind, listener))

    def _serve_broker_listener(
        self, listener: trio.abc.Listener[Any], upstream: Address, kind: str
    ) -> None:
        """Port-per-broker: accept on a new listener of ``kind``, relaying to
        ``upstream``. (Those of brokers forgotten since, closed, are let go.)"""
        assert self._handlers is not None
        self._listeners = [entry for entry in self._listeners if not closed_listener(entry[1])]
        self._listeners.append((f"broker {upstream}", listener))
        self._listen(listener, kind, upstream)

    @property
    def _parks(self) -> bool:
        """Whether this proxy's plain connections start parked on the relay
        thread (``Relay.park``): its protocol's clients make a connection
        per request, and nothing must be read or written before the
        protocol's first bytes (a PROXY header) or waited for before a read
        (lossless recording)."""
        return (
            self._thread is not None
            and self.backend.short_lived
            and self.inbound is None
            and not self.config.proxy_protocol_out
            and not (self.recorder is not None and self.recorder.config.lossless)
        )

    def _listen(
        self, listener: trio.abc.Listener[Any], kind: str, upstream: Address | None
    ) -> None:
        """Accept on ``listener``: on the relay thread where connections
        start parked and the listener is plain (not a worker's port-per-broker
        port either, whose broker is looked up as it accepts), otherwise in a
        task."""
        assert self._handlers is not None
        thread = self._thread
        if (
            thread is None
            or not self._parks
            or kind != PLAIN
            or not isinstance(listener, trio.SocketListener)
        ):
            self._handlers.start_soon(self._accept_loop, listener, kind, upstream)
            return
        # A duplicate of its socket, for plain accept() calls on the thread
        # (trio's socket accepts only in trio).
        listening = listener.socket
        raw = socket.socket(listening.family, listening.type, fileno=os.dup(listening.fileno()))
        raw.setblocking(False)
        # The options trio's streams set, set once here: accepted sockets
        # inherit them (a parked connection's socket never becomes a stream).
        with contextlib.suppress(OSError):
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if hasattr(socket, "TCP_NOTSENT_LOWAT"):  # (where the platform has it)
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 2**14)
        self._accepting[listener] = raw
        accept = functools.partial(self._accept_parked, thread, listener, raw, kind, upstream)
        failed = functools.partial(self._accept_failed, thread, listener, kind, upstream)
        thread.listen(raw.fileno(), accept, failed)

    def _accept_parked(
        self,
        thread: RelayThread,
        listener: trio.SocketListener,
        raw: socket.socket,
        kind: str,
        upstream: Address | None,
    ) -> None:
        """On the relay thread: a connection waiting on a listener, started
        parked. One a wake: the listener stays readable while more wait
        (epoll is level-triggered), and a second accept() would usually find
        none, a failed call and an exception per connection. A failed
        accept (out of file descriptors, say) hands the listener to trio's
        accept loop, which logs and retries."""
        if self._stopping:
            return
        try:
            accepted = _accept(raw)
        except ConnectionError:  # (gone before its accept)
            return
        except OSError:
            self._hand_to_trio(thread, listener, kind, upstream)
            return
        if accepted is not None:
            fd, host, port = accepted
            self._park(fd, kind, upstream, Address(host, port))

    def _accept_failed(
        self,
        thread: RelayThread,
        listener: trio.SocketListener,
        kind: str,
        upstream: Address | None,
        exc: BaseException,
    ) -> None:
        """On the relay thread: its accept step raised (a bug). The
        listener goes on accepting in trio's loop rather than fall silent."""
        log.error("%s listener: accepting on the relay thread failed; trio accepts from now on",
                  kind, exc_info=exc)  # fmt: skip
        if not self._stopping:
            self._hand_to_trio(thread, listener, kind, upstream)

    def _hand_to_trio(
        self,
        thread: RelayThread,
        listener: trio.SocketListener,
        kind: str,
        upstream: Address | None,
    ) -> None:
        """Accept on ``listener`` in trio's accept loop from now on (which
        logs and retries a failed accept) instead of on the relay thread."""
        self._stop_accepting(listener)
        assert self._handlers is not None
        loop = functools.partial(self._handlers.start_soon, self._accept_loop, listener, kind,
                                 upstream)  # fmt: skip
        thread.soon(loop)

    def _stop_accepting(self, listener: trio.SocketListener | None = None) -> None:
        """Close the relay thread's duplicates of listeners' sockets (of
        ``listener``, or of every one), so that they accept no more."""
        for each in [listener] if listener is not None else list(self._accepting):
            raw = self._accepting.pop(each, None)
            if raw is not None:
                if self._thread is not None:
                    self._thread.drop(raw.fileno())
                raw.close()

    async def _accept_loop(
        self, listener: trio.abc.Listener[Any], kind: str, upstream: Address | None
    ) -> None:
        assert self._handlers is not None
        async for stream in accepted(listener, f"{kind} listener"):
            if kind == BROKER:  # a worker's port-per-broker port
                assert self.ports is not None
                found = self.ports.broker_of(_port(listener))
                if found is None:
                    await close_stream(stream)
                    continue
                upstream, speaks = found
                self._start(self._tls_stream(stream) if speaks == TLS else stream, speaks,
                            upstream)  # fmt: skip
                continue
            self._start(self._tls_stream(stream) if kind == TLS else stream, kind, upstream)

    def _start(self, stream: trio.abc.Stream, kind: str, upstream: Address | None) -> None:
        """Serve a connection trio accepted: parked on the relay thread
        where it may be, otherwise by a task of its own."""
        assert self._handlers is not None
        if self._thread is None or type(stream) is not trio.SocketStream or not self._parks:
            self._handlers.start_soon(self.handle, stream, kind, upstream)
            return
        self._park(stream, kind, upstream, peer_address(stream))

    def _park(
        self, client: trio.SocketStream | int, kind: str, upstream: Address | None, peer: Address
    ) -> None:
        """Serve an accepted connection parked on the relay thread
        (``Relay.park``): a stream trio accepted, or, on the relay thread
        (``_accept_parked``), the descriptor of a socket it accepted."""
        thread, handlers = self._thread, self._handlers
        assert thread is not None and handlers is not None
        if self._stopping:  # (trio never waited on it)
            os.close(client if isinstance(client, int) else client.socket.detach())
            return
        conn = Conn(next(self._ids), str(peer), kind, self.backend.name)
        refused = self.limits.acquire(peer.host)
        if refused is not None:
            stream = socket_stream(client) if isinstance(client, int) else client
            thread.soon(functools.partial(handlers.start_soon, self._reject, stream, conn, refused))
            return
        try:
            self.taps.event(conn, Accepted())
            relay = self._relay(client, conn, upstream, self._dial)
        except BaseException:
            # A bug (raised on, to the accept step's ``_accept_failed``):
            # the connection is not served, so nothing is left of it, not
            # a socket its client waits on for ever, nor a place held.
            self.limits.release(peer.host)
            os.close(client if isinstance(client, int) else client.socket.detach())
            raise
        self.relays.add(relay)
        self._parked[relay] = (thread.now(), peer.host)
        relay.park(thread, self._parking)

    def _adopt(self, relay: Relay) -> None:
        """A parked connection goes to trio (in the trio thread)."""
        _, ip = self._parked.pop(relay)
        if self._thread is not None:
            self._thread.parked_adopted += 1
        if self._stopping or self._handlers is None:
            relay.abandon()
            self._forget(relay, ip)
            return
        self._handlers.start_soon(self._run_adopted, relay, ip)

    async def _run_adopted(self, relay: Relay, ip: str) -> None:
        try:
            await relay.run()
        finally:
            self._forget(relay, ip)
            await close_stream(relay.client)

    def _ended_parked(self, relay: Relay) -> None:
        """A parked connection ended on the relay thread."""
        _, ip = self._parked.pop(relay)
        if self._thread is not None:
            self._thread.parked_ended += 1
        self._forget(relay, ip)

    def _forget(self, relay: Relay, ip: str) -> None:
        self.relays.discard(relay)
        self.limits.release(ip)

    async def _sweep_parked(self) -> None:
        """Hand to trio each parked connection that lives on: its clocks
        (the handshake's deadline, keepalive) are trio's. (Twice a second:
        a wake costs less than keeping count of the parked from the thread.)"""
        timing = self.timing
        age = min(PARKED_FOR, timing.handshake_timeout / 2, timing.keepalive_interval / 2)
        while True:
            await trio.sleep(age / 2)
            now = trio.current_time()
            for relay, (since, _) in list(self._parked.items()):
                if now - since < age:
                    break
                relay.adopt()

    async def _probe_upstream(self) -> None:
        """Keep sluice_upstream_up and /readyz current."""
        while True:
            problem = await self.backend.probe()
            if problem is not None and self.upstream_ok is not False:
                log.warning("upstream broker unreachable: %s", problem)
            self.upstream_ok = problem is None
            self.metrics.upstream_up.set(1 if self.upstream_ok else 0)
            await trio.sleep(PROBE_INTERVAL)

    async def drain(self) -> None:
        """Stop accepting, hand clients back gracefully, stop within the drain timeout."""
        deadline = trio.current_time() + self.config.drain_timeout
        log.info("draining %d connections (timeout %gs)", self.active, self.config.drain_timeout)
        self.listening = False
        self._stop_accepting()
        for _, listener in self._listeners:
            await listener.aclose()
        if self.ports is not None:  # a proxy started in this one's place takes them
            self.ports.let_go()
        if self.http is not None:
            await self.http.drain()
        # Every connection, whatever it carries: its core says what goodbye
        # it owes (a Pulsar lookup connection owes none and closes at once,
        # which its client takes as any lost connection and dials again).
        for relay in list(self._parked):  # a drain is trio's
            relay.adopt()
        async with trio.open_nursery() as nursery:
            for relay in list(self.relays):
                nursery.start_soon(relay.drain, deadline)
        with trio.move_on_at(deadline):
            while self.active or (self.http is not None and self.http.active):
                await trio.sleep(0.02)
        self.stop()

    def stop(self) -> None:
        """Stop at once, closing every connection (a relay stuck in a write
        its drain shields too)."""
        self._stopping = True
        for relay in list(self.relays):
            relay.abort()
        if self._handlers is not None:
            self._handlers.cancel_scope.cancel()
        self._stop.set()

    # --- one connection ----------------------------------------------------

    async def handle(
        self, stream: trio.abc.Stream, kind: str, upstream: Address | None = None
    ) -> None:
        """Serve one accepted client connection (any trio stream) to its end;
        ``upstream``: the broker its listener stands for (port-per-broker)."""
        peer = client = peer_address(stream)
        destination = local_address(stream)
        via = ""
        counted: str | None = None  # the address whose place this connection holds
        if self.inbound is None or not self.inbound.trusts(peer.host):
            # The peer is the client: counted before anything is read, so
            # that connections sending nothing hold places from the start
            # (not uncounted for the PROXY header's timeout).
            refused = self.limits.acquire(peer.host)
            if refused is not None:
                conn = Conn(next(self._ids), str(peer), kind, self.backend.name)
                await self._reject(stream, conn, refused)
                return
            counted = peer.host
        try:
            if self.inbound is not None:  # --proxy-protocol-in: before anything else is read
                try:
                    header = await self.inbound.read(stream, peer)
                except HeaderError as exc:
                    conn = Conn(next(self._ids), str(peer), kind, self.backend.name)
                    await self._reject(stream, conn, f"PROXY header: {exc.message}",
                                       f"proxy_header_{exc.reason}")  # fmt: skip
                    return
                if header is not None and header.source is not None:
                    client, via = header.source, str(peer)
                    destination = header.destination or destination
                    log.debug("conn from %s via %s (PROXY v%d)", client, peer, header.version)
            conn = Conn(next(self._ids), str(client), kind, self.backend.name, via=via)
            if isinstance(stream, trio.SSLStream):
                conn.peer_role = lambda: certificate_cn(stream)
            if counted is None:  # a listed balancer's: the client its header names
                refused = self.limits.acquire(client.host)
                if refused is not None:
                    await self._reject(stream, conn, refused)
                    return
                counted = client.host
            if self.config.sni_on and isinstance(stream, trio.SSLStream):
                handshaken, routed = await self._route_by_name(stream, conn)
                if not handshaken:
                    return
                upstream = routed or upstream
            await self._serve(stream, conn, upstream, self._dialer(client, destination))
        finally:
            if counted is not None:
                self.limits.release(counted)
            await close_stream(stream)  # (shielded where it must wait)

    async def _serve(
        self, stream: trio.abc.Stream, conn: Conn, upstream: Address | None, dialer: Dialer
    ) -> None:
        self.taps.event(conn, Accepted())
        relay = self._relay(stream, conn, upstream, dialer)
        self.relays.add(relay)
        try:
            await relay.run()
        finally:
            self.relays.discard(relay)

    def _relay(
        self, stream: trio.abc.Stream | int, conn: Conn, upstream: Address | None, dialer: Dialer
    ) -> Relay:
        recorder = self.recorder
        return Relay(
            self.backend.new_core(conn, self.taps, upstream),
            stream,
            timing=self.timing,
            dial=dialer,
            ask=self.backend.ask,
            tap=self.taps,
            room=recorder.room if recorder is not None and recorder.config.lossless else None,
            thread=self._thread,
            removals=self._removals,
        )

    async def _route_by_name(
        self, stream: trio.SSLStream[Any], conn: Conn
    ) -> tuple[bool, Address | None]:
        """SNI routing: the TLS handshake, now, for the server name in the
        ClientHello. Whether it went through (if not, the connection was
        refused, counted and closed), and the broker the name chose (None:
        Sluice serves the client as usual)."""
        handshake = _ServerName()
        token = _HANDSHAKE.set(handshake)
        try:
            with trio.fail_after(self.timing.handshake_timeout):
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
            if handshake.name is None and _callback_failed(exc):
                # A server name Python's ssl cannot decode (not ASCII): the
                # callback was never called with it. No DNS name either.
                handshake.name, handshake.refused = "(not ASCII)", "sni_invalid"
            if handshake.refused is not None:
                # OpenSSL wrote the alert, but trio drops what is unsent when
                # a handshake fails: the same record, sent here.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await transport(stream).send_all(_UNRECOGNIZED_NAME)
                why = f"TLS server name {handshake.name!r} names no broker it may reach"
                if handshake.refused == "sni_invalid":
                    why = f"TLS server name {handshake.name!r} is not a DNS name"
                await self._reject(stream, conn, why, handshake.refused)
            elif isinstance(exc, trio.TooSlowError):
                await self._reject(stream, conn, "no TLS handshake in time", "handshake_timeout")
            else:
                await self._reject(stream, conn, f"TLS handshake failed: {exc.__cause__ or exc}",
                                   "tls")  # fmt: skip
            return False, None
        finally:
            _HANDSHAKE.reset(token)
        if handshake.route is not None:
            log.debug("%s: TLS server name %s: broker %s", conn.name, handshake.name,
                      handshake.route)  # fmt: skip
        return True, handshake.route

    def _dialer(self, client: Address, destination: Address | None) -> Dialer:
        """How a client's relay dials its broker: with --proxy-protocol-out,
        a v2 header naming the client goes first."""
        if not self.config.proxy_protocol_out:
            return self._dial
        preamble = v2_header(client, destination)

        async def dial_with_header(address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
            return await dial(address, timeout=timeout, tls=self.backend.tls_context(tls),
                              preamble=preamble)  # fmt: skip

        return dial_with_header

    def _connect(self, address: Address) -> tuple[int, bool] | None:
        """How a parked connection dials its broker (``start_tcp``)."""
        return start_tcp(address)

    async def _dial(self, address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
        return await dial(address, timeout=timeout, tls=self.backend.tls_context(tls))

    async def _reject(
        self, stream: trio.abc.Stream, conn: Conn, why: str, reason: str = "limit"
    ) -> None:
        self.taps.event(conn, Rejected(reason))
        level = self._refusals.level((reason, conn.client.rpartition(":")[0]), trio.current_time())
        log.log(level, "%s: rejected: %s", conn.name, why)
        await close_stream(stream)

    def _header_refused(self, listener: str) -> Callable[[Address, HeaderError], None]:
        """How the admin endpoint or the HTTP listener reports a connection
        whose PROXY header it refused: counted and logged as the protocol's
        listeners do."""

        def refused(peer: Address, error: HeaderError) -> None:
            self.metrics.connections_rejected.labels(f"proxy_header_{error.reason}").inc()
            level = self._refusals.level((error.reason, peer.host), trio.current_time())
            log.log(level, "%s connection from %s: rejected: PROXY header: %s", listener, peer,
                    error.message)  # fmt: skip

        return refused


class Drainable(Protocol):
    async def drain(self) -> None: ...

    def stop(self) -> None: ...


class Reloadable(Protocol):
    async def reload_from_source(self, source: str) -> Outcome: ...

    def watched(self) -> list[Path]:
        """The files of the configuration in force whose change is a reload
        (its key and certificate files, ``reload.FILES``, and the
        ``SLUICE_DEFAULTS`` file)."""
        ...


# How often the --config file and the key files are looked at for a change.
CONFIG_CHECK_EVERY = 2.0
# A changed file is read once it has stayed the same this long (an editor
# that writes in place: the empty or half-written file in between would
# reload as defaults, proxy-mode authentication off among them), at most
# SETTLE_TRIES times over.
SETTLE = 0.5
SETTLE_TRIES = 10
# A reload the files' change brought that was refused is tried again after
# these pauses (a Kubernetes Secret the new ConfigMap names is mounted up to
# a minute or so after it): then not until the files change again.
RETRY_REFUSED = (2.0, 4.0, 8.0, 16.0, 30.0, 60.0)


async def reload_when_asked(
    server: Reloadable,
    config_file: Path | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reload ``server``'s configuration on SIGHUP and when a file it is
    read from changes: ``config_file``, or a key or certificate file of the
    configuration in force (``server.watched()``); until cancelled; started
    once SIGHUP is caught. A SIGHUP that came while the process started
    (noted by ``hangup.hold``) is taken first: one reload for all of them."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_files, server, config_file)
            # Asked after the receiver took SIGHUP over: none is lost between.
            if hangup.take():
                log.info("SIGHUP came while starting: reloading now")
                await server.reload_from_source("SIGHUP")
            async for _ in signals:
                await server.reload_from_source("SIGHUP")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()  # through links, to the file they name now
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


async def _watch_files(server: Reloadable, config_file: Path | None) -> None:
    """Reload when ``config_file`` or a file ``server.watched()`` names
    changes: its inode, time or size, through links (a Kubernetes
    ConfigMap's or Secret's mounted file is a link the kubelet points at a
    new file, swapping the ``..data`` link), once the files have stayed
    the same for ``SETTLE``. A file that went away is no change (the
    running configuration stays); one that comes back changed is. A file
    newly named by a reload was read by it. A refused reload is tried again
    after each of ``RETRY_REFUSED``'s pauses, then not until a change."""

    def stamps() -> dict[Path, tuple[int, int, int] | None]:
        paths = ([config_file] if config_file is not None else []) + server.watched()
        return {path: _stamp(path) for path in paths}

    last = stamps()
    pauses: list[float] = []  # before the next tries of a refused reload
    retry_at: float | None = None
    while True:
        await trio.sleep(CONFIG_CHECK_EVERY)
        now = stamps()
        changed = any(
            path in last and stamp is not None and stamp != last[path]
            for path, stamp in now.items()
        )
        for _ in range(SETTLE_TRIES if changed else 0):  # until the writing is over
            await trio.sleep(SETTLE)
            if (settled := stamps()) == now:
                break
            now = settled
        last = {path: stamp if stamp is not None else last.get(path) for path, stamp in now.items()}
        if not changed and (retry_at is None or trio.current_time() < retry_at):
            continue
        outcome = await server.reload_from_source("file")
        if outcome.outcome != "refused":
            pauses, retry_at = [], None
            continue
        if changed:
            pauses = list(RETRY_REFUSED)
        retry_at = trio.current_time() + pauses.pop(0) if pauses else None


def closed_listener(listener: trio.abc.Listener[Any]) -> bool:
    """Whether ``listener`` (a socket listener, or a TLS one around it) was closed."""
    inner = getattr(listener, "transport_listener", listener)
    sock = getattr(inner, "socket", None)
    return sock is not None and sock.fileno() == -1


async def serve_until_signalled(server: Drainable) -> None:
    """Serve until SIGTERM or SIGINT, then drain; a second signal stops at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s: draining", signal.Signals(signum).name)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_second_signal_stops, signals, server)
                await server.drain()
                nursery.cancel_scope.cancel()
            return


async def _second_signal_stops(signals: Any, server: Drainable) -> None:
    async for _ in signals:
        log.warning("second signal: stopping now")
        server.stop()
        return


def _accept(listening: socket.socket) -> tuple[int, str, int] | None:
    """A connection waiting on a non-blocking listening socket: its
    descriptor (non-blocking) and its peer's address; None when none is
    waiting. In compiled code where built (``accept_now``: no socket
    object, and non-blocking in the same call)."""
    if accept_now is not None:
        found: tuple[int, str, int] | None = accept_now(listening.fileno())
        return found
    try:
        sock, peer = listening.accept()
    except BlockingIOError:
        return None
    sock.setblocking(False)
    return sock.detach(), peer[0], peer[1]


def _port(listener: trio.abc.Listener[Any]) -> int:
    """The port a TCP listener is bound to."""
    assert isinstance(listener, trio.SocketListener)
    return int(listener.socket.getsockname()[1])
