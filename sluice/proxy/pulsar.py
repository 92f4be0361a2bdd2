"""Pulsar's trio glue: frames over a trio stream, and the connections Sluice
opens to brokers on its own account.

Proxied connections are relayed by the protocol-neutral ``Relay`` around a
``PulsarConnection`` core; what is Pulsar-specific and needs I/O lives here:
``connect_broker`` (dial plus CONNECT/CONNECTED, the one place Sluice
handshakes with a broker for itself, and so where it learns the feature
flags each broker announces), the shared upstream connections that
carry lookups with Sluice's own request ids, and ``PulsarBackend``, which
gives the proxy cores and answers their ``Ask`` actions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address, AllowList, is_own_host
from sluice.errors import ConfigError
from sluice.protocols.core import Conn, Dialed, Tap
from sluice.protocols.faults import Faults
from sluice.protocols.oidc import ClientCredentials, KeysNeeded
from sluice.protocols.pulsar import (
    CLOSED,
    DEFAULT_MAX_MESSAGE_SIZE,
    Frame,
    FrameDecoder,
    ProtocolError,
    Type,
    command,
    encode,
    pb,
)
from sluice.protocols.pulsar.auth import AuthError, ProxyAuth, UpstreamAuth, proxy_auth
from sluice.protocols.pulsar.connection import (
    PROTOCOL_VERSION,
    SLUICE_VERSION,
    SWEEP_EVERY,
    PulsarConnection,
    PulsarSettings,
    Route,
    Routing,
    UpstreamFailure,
)
from sluice.protocols.pulsar.features import BROKERS
from sluice.protocols.pulsar.urls import SCHEMES, BrokerUrl, parse_broker_url
from sluice.proxy.backend import Prepared, Services, Unauthorized
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsClientConfig, client_ssl_context, dial
from sluice.proxy.oidc import Issuers, client_context, keep_own_token
from sluice.proxy.ports import BrokerPorts, Listeners, NoListener
from sluice.proxy.relay import READ_SIZE
from sluice.proxy.reload import FILES, held
from sluice.proxy.shared import ROUTES_FILE, TLS, Journal

log = logging.getLogger("sluice.upstream")

# How long one upstream request may take before the client gets an error.
REQUEST_TIMEOUT = 30.0


class FrameStream:
    """Frames in, bytes out, over one trio stream (tools and own-account connections).

    Sends are serialized with a lock: several tasks may write to the same
    connection.
    """

    def __init__(
        self, stream: trio.abc.Stream, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(max_message_size)
        self._send_lock = trio.StrictFIFOLock()

    async def receive_frame(self) -> Frame | None:
        """The next frame; None when the peer closed cleanly.

        Raises ``RemoteProtocolError`` (fatal) when framing is lost, and
        trio's stream errors when the connection breaks.
        """
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is CLOSED:
                return None
            self.decoder.receive_data(await self.stream.receive_some(READ_SIZE))

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def aclose(self) -> None:
        await self.stream.aclose()


# What a connection of Sluice's logs in with: a client's credentials (or,
# in proxy mode, Sluice's naming the client's role); None: none at all.
Credentials = UpstreamAuth | None


def own_connect() -> pb.CommandConnect:
    """The CONNECT Sluice sends when it talks to a broker for itself."""
    return pb.CommandConnect(client_version=SLUICE_VERSION, protocol_version=PROTOCOL_VERSION)


async def connect_broker(
    address: Address,
    *,
    timeout: float,
    tls: ssl.SSLContext | None,
    connect: pb.CommandConnect | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> tuple[FrameStream, Frame]:
    """Dial a broker and handshake: the stream and the broker's CONNECTED.

    Raises ``UpstreamFailure`` with a one-line reason otherwise.
    """
    deadline = trio.current_time() + timeout  # dial and handshake together
    try:
        raw = await dial(address, timeout=timeout, tls=tls)
    except OSError as exc:
        raise UpstreamFailure(f"cannot reach broker {address}: {exc}") from exc
    stream = FrameStream(raw, max_message_size)
    try:
        await stream.send(encode(command(Type.Value("CONNECT"), connect or own_connect())))
        with trio.move_on_at(deadline):
            frame = await stream.receive_frame()
            if frame is None:
                raise UpstreamFailure("broker closed the connection during handshake")
            if frame.type == Type.Value("CONNECTED"):
                # What the broker promises (PIP-344), for the CONNECTED
                # Sluice writes itself to lookup clients.
                if isinstance(frame.body, pb.CommandConnected):
                    BROKERS.learn(address, frame.body)
                return stream, frame
            if frame.type == Type.Value("ERROR"):
                raise UpstreamFailure(
                    f"broker refused CONNECT: {frame.body.message}", frame.body.error
                )
            raise UpstreamFailure(f"broker answered CONNECT with {frame.name}")
        raise UpstreamFailure(f"broker did not answer CONNECT within {timeout:g}s")
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await raw.aclose()
        if isinstance(exc, ProtocolError):
            raise UpstreamFailure(f"broker broke the protocol during handshake: {exc}") from exc
        if isinstance(exc, trio.BrokenResourceError | OSError):
            raise UpstreamFailure(f"broker {address} dropped the connection: {exc}") from exc
        raise


class BrokerConnection:
    """One connection to a broker, multiplexing requests by request_id."""

    def __init__(self, stream: FrameStream, address: Address, connected: Frame) -> None:
        self.stream = stream
        self.address = address
        self.connected = connected
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[Frame]]] = {}
        self.closed = False
        # No new requests (a request got no answer in time): closed once
        # those already sent have theirs (``request``).
        self.retired = False
        self.credentials: Credentials = None
        self.last_used = trio.current_time()

    @classmethod
    async def open(
        cls,
        nursery: trio.Nursery,
        address: Address,
        *,
        timeout: float,
        tls: ssl.SSLContext | None,
        credentials: Credentials = None,
    ) -> BrokerConnection:
        hello = own_connect()
        if credentials is not None:
            credentials.apply(hello)
        stream, connected = await connect_broker(address, timeout=timeout, tls=tls, connect=hello)
        conn = cls(stream, address, connected)
        conn.credentials = credentials
        nursery.start_soon(conn._read_loop)
        return conn

    async def request(self, type_: int, body: Any, timeout: float) -> Frame:
        """Send a request (its request_id is set here) and wait for its answer."""
        if self.closed or self.retired:
            raise UpstreamFailure(f"connection to broker {self.address} is closed")
        rid = next(self._ids)
        body.request_id = rid
        self.last_used = trio.current_time()
        slot: tuple[trio.Event, list[Frame]] = (trio.Event(), [])
        self._waiting[rid] = slot
        try:
            try:
                await self.stream.send(encode(command(type_, body)))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise UpstreamFailure(f"connection to broker {self.address} broke") from exc
            with trio.move_on_after(timeout):
                await slot[0].wait()
            if not slot[1]:
                if self.closed:
                    raise UpstreamFailure(f"broker {self.address} closed the connection")
                # Not used again: a broker whose host died without a word
                # would otherwise cost every lookup this timeout until the
                # kernel gives the connection up (about 15 minutes). The
                # requests already sent on it may still get their answers
                # (a slow broker): it is closed once none waits.
                if not self.retired:
                    log.info("upstream connection to %s: no answer within %gs, not used again",
                             self.address, timeout)  # fmt: skip
                self.retired = True
                raise UpstreamFailure(f"broker {self.address} did not answer within {timeout:g}s")
            return slot[1][0]
        finally:
            self._waiting.pop(rid, None)
            if self.retired and not self._waiting and not self.closed:
                with trio.CancelScope(shield=True):
                    await self.aclose()

    async def _read_loop(self) -> None:
        try:
            while (frame := await self.stream.receive_frame()) is not None:
                if frame.type == Type.Value("PING"):
                    await self.stream.send(encode(command(Type.Value("PONG"))))
                    continue
                if frame.type == Type.Value("AUTH_CHALLENGE") and self.credentials is not None:
                    # A credentials refresh: the ones this connection was opened with.
                    answer = self.credentials.response()
                    await self.stream.send(encode(command(Type.Value("AUTH_RESPONSE"), answer)))
                    continue
                body = frame.body
                rid = getattr(body, "request_id", None) if body is not None else None
                slot = self._waiting.get(rid) if isinstance(rid, int) else None
                if slot is not None:
                    slot[1].append(frame)
                    slot[0].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            if not self.closed:  # not our own aclose()
                log.info("upstream connection to %s ended: %s", self.address, exc)
        finally:
            self.closed = True
            for event, _ in self._waiting.values():
                event.set()
            await self.stream.aclose()

    @property
    def busy(self) -> bool:
        return bool(self._waiting)

    @property
    def usable(self) -> bool:
        """Open, and taking new requests."""
        return not (self.closed or self.retired)

    async def aclose(self) -> None:
        self.closed = True
        await self.stream.aclose()


# A pooled connection nobody asked anything of for this long is closed
# (clients whose tokens are refreshed bring new credentials, and with them
# new pooled connections: without this they would pile up for ever).
IDLE_UPSTREAM = 300.0

_Key = tuple[Address, Credentials]


@dataclasses.dataclass
class _Attempt:
    """A pooled connection being opened, awaited by those who asked for it
    meanwhile: ``failure`` once it failed."""

    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    failure: UpstreamFailure | None = None


class UpstreamPool:
    """At most one open BrokerConnection per broker address and set of client
    credentials (lookups carry the credentials of the client they are for),
    opened on demand; at most ``limit`` open at once (opening included): at
    the limit the least recently used idle one is closed to make room, and
    with none idle the request fails with TooManyRequests."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        timeout: float,
        tls_for: Callable[[Address], ssl.SSLContext | None],
        dialed: Callable[[float | None], None] = lambda seconds: None,
        limit: int = 1_000,
    ) -> None:
        self._nursery = nursery
        self._timeout = timeout
        self._tls_for = tls_for
        self._dialed = dialed
        self.limit = limit
        self._connections: dict[_Key, BrokerConnection] = {}
        self._attempts: dict[_Key, _Attempt] = {}  # connections being opened
        self._opening = 0

    async def get(self, address: Address, credentials: Credentials = None) -> BrokerConnection:
        """The open connection for ``address`` and ``credentials``, opened
        if need be. Those who ask while it is being opened share that one
        attempt and its failure: ten lookups queued behind a broker that
        does not answer wait one --connect-timeout, not ten in turn."""
        key = (address, credentials)
        while True:
            conn = self._connections.get(key)
            if conn is not None and conn.usable:
                conn.last_used = trio.current_time()
                return conn
            attempt = self._attempts.get(key)
            if attempt is not None:
                await attempt.done.wait()
                if attempt.failure is not None:
                    raise UpstreamFailure(attempt.failure.message, attempt.failure.error)
                continue  # opened (or its opener was cancelled: try again)
            attempt = self._attempts[key] = _Attempt()
            try:
                conn = await self._open(key)
            except UpstreamFailure as exc:
                attempt.failure = exc
                raise
            finally:
                del self._attempts[key]
                attempt.done.set()
            conn.last_used = trio.current_time()
            return conn

    async def _open(self, key: _Key) -> BrokerConnection:
        address, credentials = key
        if credentials is not None:  # its kind and size, never the credential
            log.debug("upstream connection to %s as %r (%d-byte credential)",
                      address, credentials, len(credentials.data))  # fmt: skip
        self._connections.pop(key, None)
        await self._make_room()
        self._opening += 1
        started = trio.current_time()
        try:
            conn = await BrokerConnection.open(
                self._nursery,
                address,
                timeout=self._timeout,
                tls=self._tls_for(address),
                credentials=credentials,
            )
        except UpstreamFailure:
            self._dialed(None)
            raise
        finally:
            self._opening -= 1
        self._dialed(trio.current_time() - started)
        self._connections[key] = conn
        return conn

    async def _make_room(self) -> None:
        """Below the limit, by closing the least recently used idle connection."""
        for key, conn in list(self._connections.items()):
            if conn.closed:
                del self._connections[key]
        while len(self._connections) + self._opening >= self.limit:
            idle = [(c.last_used, k) for k, c in self._connections.items() if not c.busy]
            if not idle:
                raise UpstreamFailure(
                    f"all {self.limit} upstream connections are busy (--max-upstream-connections)",
                    pb.TooManyRequests,
                )
            _, oldest = min(idle, key=lambda pair: pair[0])
            conn = self._connections.pop(oldest)
            await conn.aclose()

    async def aclose(self) -> None:
        for conn in list(self._connections.values()):
            await conn.aclose()
        self._connections.clear()

    def __len__(self) -> int:
        return sum(not c.closed for c in self._connections.values())

    async def close_idle(self, idle: float = IDLE_UPSTREAM) -> int:
        """Close the connections unused for ``idle`` seconds; how many."""
        now = trio.current_time()
        closed = 0
        for key, conn in list(self._connections.items()):
            if conn.closed or (now - conn.last_used >= idle and not conn.busy):
                del self._connections[key]
                if not conn.closed:
                    await conn.aclose()
                    closed += 1
        return closed

    async def keep_tidy(self, idle: float = IDLE_UPSTREAM) -> None:
        """Run ``close_idle`` for ever, a few times per ``idle``."""
        while True:
            await trio.sleep(idle / 4)
            closed = await self.close_idle(idle)
            if closed:
                log.debug("closed %d idle upstream connection(s)", closed)


class PulsarBackend:
    """What the protocol-neutral proxy needs from Pulsar: a core per client
    connection, answers to its ``Ask`` actions, a broker probe, and a
    listener of Sluice's for each broker an HTTP lookup names
    (``listener_urls``, port-per-broker: ``ports``). A client connection
    on such a listener whose CONNECT names no ``proxy_to_broker_url`` is
    relayed to that broker (as an SNI-routed one is); the main listener
    serves lookups, as without them."""

    name = "pulsar"
    short_lived = False  # clients keep their connections

    def __init__(
        self,
        broker: BrokerUrl,
        settings: PulsarSettings,
        routing: Routing,
        *,
        broker_tls: TlsClientConfig,
        connect_timeout: float,
        faults: Faults | None = None,
        max_upstream_connections: int = 1_000,
        ports: BrokerPorts | None = None,
        oidc_ca: Path | None = None,
        oidc_fields: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ()),
    ) -> None:
        self.broker = broker
        # Port-per-broker: Sluice's listeners (plain, TLS) for each broker
        # HTTP lookups named.
        self.ports = ports
        if ports is not None:
            ports.map = Listeners()
            # A broker only HTTP lookups name (whose answers Sluice rewrites
            # to its listener, not learning it afresh) is kept while they do.
            routing.keep = lambda address: ports.asked_since(
                address, ports.clock() - routing.forget_after
            )
        self.max_upstream_connections = max_upstream_connections
        self.faults = faults if faults is not None else Faults()
        self.settings = settings
        self.routing = routing
        self.connect_timeout = connect_timeout
        self._tls = client_ssl_context(broker_tls) if broker.tls else None
        self._broker_tls = broker_tls
        self._pool: UpstreamPool | None = None
        # --auth-oidc-issuers: their keys, fetched; --broker-auth-oauth2-*:
        # Sluice's own token, fetched and kept fresh. Each runs in a scope of
        # its own, replaced when a reload changes its settings.
        self._oidc_ca = oidc_ca
        # The settings they were made from: the issuers', Sluice's token's.
        self._oidc = oidc_fields
        self.issuers: Issuers | None = None
        self._issuer_tasks = trio.CancelScope()
        self._own_tasks = trio.CancelScope()
        self._nursery: trio.Nursery | None = None

    def tls_context(self, tls: bool) -> ssl.SSLContext | None:
        if not tls:
            return None
        if self._tls is None:
            self._tls = client_ssl_context(self._broker_tls)
        return self._tls

    def _own_tls(self, address: Address) -> ssl.SSLContext | None:
        """How Sluice's own connection to ``address`` (lookups, redirects,
        the probe) speaks: as a relay to that broker does (Routing.tls_of).
        (Not by whether any connection ever needed TLS: one client's
        CONNECT to a pulsar+ssl:// URL made every later own connection to a
        plain broker try TLS, and fail.)"""
        return self.tls_context(self.routing.tls_of(address))

    async def start(self, nursery: trio.Nursery, tap: Tap) -> None:
        """Open for business: own-account connections live in ``nursery``.
        Sluice's own OAuth2 token is asked for first (its first answer, or
        failure, is waited for: no client is served before)."""
        self._pool = UpstreamPool(
            nursery,
            timeout=self.connect_timeout,
            tls_for=self._own_tls,
            dialed=lambda seconds: tap.event(None, Dialed(seconds)),
            limit=self.max_upstream_connections,
        )
        nursery.start_soon(self._pool.keep_tidy)
        nursery.start_soon(self._forget_brokers)
        self._nursery = nursery
        auth = self.settings.auth
        self._own_tasks = await self._start_own(_oauth2(auth), self._oidc_ca)
        oidc = auth.oidc if auth is not None else None
        self.issuers, self._issuer_tasks = await self._start_issuers(oidc, self._oidc_ca)

    async def _forget_brokers(self) -> None:
        """Learned brokers no answer named lately are forgotten
        (``Routing.expire``) even when no client connects; the listeners of
        those forgotten, here or by a core at CONNECT, are closed
        (port-per-broker)."""
        while True:
            await trio.sleep(SWEEP_EVERY)
            self.routing.expire(trio.current_time(), self.settings.trusted)
            forgotten, self.routing.forgotten = self.routing.forgotten, []
            if self.ports is not None:
                for address in forgotten:
                    await self.ports.forget(address)

    async def _start_own(
        self, own: ClientCredentials | None, ca: Path | None, reloading: bool = False
    ) -> trio.CancelScope:
        """Sluice's own OAuth2 token fetched (the first one waited for) and
        fetched again before it expires, in the scope returned. ``reloading``:
        a first token that did not come is a ConfigError (the reload is
        refused, what is in force kept), not a start without it."""
        scope = trio.CancelScope()
        if own is None:
            return scope
        context = client_context(ca)
        failed: list[str] = []

        async def keep(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                async with trio.open_nursery() as tasks:
                    why = await tasks.start(keep_own_token, own, context, self.connect_timeout)
                    if why is not None and reloading:
                        failed.append(f"Sluice's own token from OAuth2 issuer {own.issuer} "
                                      f"could not be fetched: {why}")  # fmt: skip
                        scope.cancel()
                    task_status.started()

        assert self._nursery is not None
        await self._nursery.start(keep)
        if failed:
            raise ConfigError(failed[0])
        return scope

    async def _start_issuers(
        self, oidc: Any, ca: Path | None, reloading: bool = False
    ) -> tuple[Issuers | None, trio.CancelScope]:
        """Proxy mode's issuers (``oidc``, a verifier): their keys fetched on
        schedule, in the scope returned. ``reloading``: their keys are
        fetched first, and an issuer whose keys cannot be fetched is a
        ConfigError (the reload is refused, what is in force kept)."""
        scope = trio.CancelScope()
        if oidc is None:
            return None, scope
        issuers = Issuers(oidc, client_context(ca), self.connect_timeout)
        failed: list[str] = []

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                async with trio.open_nursery() as tasks:
                    if reloading:
                        # A changed issuer's keys come before it is put in
                        # force: one that cannot be fetched refuses the reload.
                        verifier = issuers.verifier
                        async with trio.open_nursery() as first:
                            for issuer in verifier.issuers:
                                first.start_soon(issuers.fetch, issuer)
                        for issuer in verifier.issuers:
                            if (why := verifier.failure(issuer)) is not None:
                                failed.append(f"OpenID Connect issuer {issuer}: keys could "
                                              f"not be fetched: {why}")  # fmt: skip
                                scope.cancel()
                                break
                    if not failed:
                        tasks.start_soon(issuers.run)
                    task_status.started()

        assert self._nursery is not None
        await self._nursery.start(run)
        if failed:
            raise ConfigError(failed[0])
        return issuers, scope

    async def prepare(self, config: ProxyConfig, filters: Any) -> Prepared:
        """A reloaded configuration: its allow and trust lists, limits,
        credentials (key files read again, a changed issuer's keys or own
        token fetched before it is put in force) and filters, checked and
        made now (ConfigError), put in force by ``apply``. An unchanged
        OpenID Connect issuer setting keeps its issuers and what they
        fetched, an unchanged OAuth2 setting Sluice's own token (each
        weighed apart: a changed leeway does not fetch the token again);
        ``drop`` stops what a changed one started (its keys or token
        fetched on schedule), for a reload not put in force after all."""
        # What the files hold before they are loaded (here, and the CA by
        # the issuers and the token made below): one rewritten meanwhile
        # counts as changed at the next reload.
        fields = _oidc_fields(config)
        auth = proxy_auth(config)
        trusted = AllowList(config.trust_broker, "--trust-broker")
        rules = AllowList(config.allow_broker + config.trust_broker, "--allow-broker").rules
        # Sluice's TLS toward brokers made anew from its files (a renewed
        # client certificate): the connections opened from then on use it.
        tls = client_ssl_context(config.broker_tls) if self._tls is not None else None
        old = self.settings.auth
        issuers, issuer_tasks = self.issuers, self._issuer_tasks
        own_tasks = self._own_tasks
        if auth is not None and old is not None:
            if fields[0] == self._oidc[0]:
                auth = dataclasses.replace(auth, oidc=old.oidc)
            if fields[1] == self._oidc[1] and isinstance(old.own_token, ClientCredentials):
                auth = dataclasses.replace(auth, own_token=old.own_token)
        same_issuers = old is not None and auth is not None and fields[0] == self._oidc[0]
        same_own = old is not None and auth is not None and fields[1] == self._oidc[1]
        same_own = same_own and _oauth2(auth) is _oauth2(old)
        if not same_own:
            own_tasks = await self._start_own(_oauth2(auth), config.auth_oidc_ca, reloading=True)
        if not same_issuers:
            oidc = auth.oidc if auth is not None else None
            try:
                issuers, issuer_tasks = await self._start_issuers(
                    oidc, config.auth_oidc_ca, reloading=True
                )
            except BaseException:
                if own_tasks is not self._own_tasks:
                    own_tasks.cancel()
                raise

        def apply() -> None:
            settings = self.settings
            settings.auth, settings.trusted, settings.filtering = auth, trusted, filters
            settings.max_redirects = config.max_redirects
            self.routing.allowlist.rules = rules
            self.routing.max_lookups = config.max_concurrent_lookups
            if self._pool is not None:
                self._pool.limit = config.max_upstream_connections
            drop_old()
            self.issuers, self._issuer_tasks, self._own_tasks = issuers, issuer_tasks, own_tasks
            self._oidc = fields  # as the files were before they were loaded
            self._tls, self._broker_tls = tls, config.broker_tls

        def drop_old() -> None:
            if issuer_tasks is not self._issuer_tasks:
                self._issuer_tasks.cancel()
            if own_tasks is not self._own_tasks:
                self._own_tasks.cancel()

        def drop() -> None:
            if issuer_tasks is not self._issuer_tasks:
                issuer_tasks.cancel()
            if own_tasks is not self._own_tasks:
                own_tasks.cancel()

        return Prepared(apply, drop)

    async def listening(self, main: int | None) -> None:
        """The main listener serves lookups, so it stands for no broker; the
        ports an earlier run gave brokers (--broker-ports-file) are listened
        on again, and their brokers count as learned now: forgotten like
        any other an hour on unless an answer names them (else they stayed
        allowed, their listeners open, for ever)."""
        if self.ports is not None:
            for broker in await self.ports.reopen_known():
                if broker not in self.routing.routes:
                    self.routing.learn(BrokerUrl(broker.host, broker.port, self.broker.tls))

    async def web_credentials(
        self, authorization: str | None, peer_role: str | None
    ) -> list[tuple[bytes, bytes]] | None:
        """--auth-mode proxy on the web port: the client's token (or
        certificate) checked, Sluice's own credential and the client's role
        in its place. Passthrough: the client's credentials as they are."""
        auth = self.settings.auth
        if auth is None:
            return None
        try:
            try:
                _, headers = auth.web_credentials(authorization, peer_role)
            except KeysNeeded as needed:  # fetched, then checked once more
                if self.issuers is not None:
                    await self.issuers.fetch(needed.issuer, join=needed.join)
                _, headers = auth.web_credentials(authorization, peer_role, fetched=True)
        except AuthError as exc:
            raise Unauthorized(str(exc)) from None
        return headers

    async def listener_urls(self, urls: Sequence[str]) -> dict[str, str]:
        """An HTTP lookup's answer (``sluice/proxy/http.py``) names one
        broker by its binary URLs, plain and TLS: the one Sluice dials (TLS
        as for the configured broker, else whichever is named) is learned
        (allowed, dialled as its URL says) and gets a listener of Sluice's of
        each kind Sluice listens with (``--listen``: plain, ``--listen-tls``:
        TLS), opened now if need be, whichever kinds the broker named: a
        client's TLS to Sluice does not depend on the broker's. Sluice's URL
        for that broker by kind (``PLAIN``, ``TLS``); empty when no listener
        can be opened: the answer stays as the broker wrote it, which the
        HTTP listener logs."""
        if self.ports is None:
            return {}
        named: list[BrokerUrl] = []
        for text in urls:
            with contextlib.suppress(ConfigError):
                named.append(parse_broker_url(text, what="an HTTP lookup's broker URL"))
        if not named:
            return {}
        target = next((u for u in named if u.tls == self.broker.tls), named[0])
        if self.broker.tls and not target.tls:  # never in the clear what Sluice speaks TLS for
            level = self.routing.warned.level(("plain", target.address), trio.current_time())
            log.log(level, "an HTTP lookup named broker %s by its plain URL only, and "
                    "Sluice speaks TLS to its brokers: no listener stands for it",
                    target.address)  # fmt: skip
            return {}
        if self._own_listener(target.address):
            level = self.routing.warned.level(("own", target.address), trio.current_time())
            log.log(level, "an HTTP lookup named %s, a port of Sluice's own listeners: no "
                    "listener stands for it (it would dial itself)", target.address)  # fmt: skip
            return {}
        if target.address not in self.routing.routes:  # (a chained route is kept)
            self.routing.learn(target)
        self.routing.seen(target.address, trio.current_time())
        ours: dict[str, str] = {}
        for kind in self.ports.kinds:
            try:
                own = await self.ports.open(target.address, kind)
            except (NoListener, OSError) as exc:
                level = self.routing.warned.level(("listener", target.address, kind),
                                                  trio.current_time())  # fmt: skip
                log.log(level, "no %s listener for broker %s, which an HTTP lookup named: %s",
                        kind, target.address, exc or "the port range is used up")  # fmt: skip
                return {}
            tls = kind == TLS
            ours[kind] = str(BrokerUrl(own.host, own.port, tls, SCHEMES[tls]))
        return ours

    def _own_listener(self, address: Address) -> bool:
        """Whether ``address`` is one of Sluice's own per-broker ports (its
        ``--listener-ports`` range, or a port it listens on for a broker)
        by the host Sluice listens on or advertises: a listener standing
        for it would dial itself, every connection another one."""
        assert self.ports is not None
        ports = self.ports
        if not is_own_host(address.host, ports.host, ports.advertised(address.port).host):
            return False
        span = ports.span
        if span is not None and span[0] <= address.port <= span[1]:
            return True
        map_ = ports.map
        return isinstance(map_, Listeners) and address in map_.values()

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> PulsarConnection:
        """``upstream``: the broker SNI routing chose (``route_name``), or
        the one the connection's per-broker listener stands for, if any."""
        return PulsarConnection(conn, self.settings, self.routing, tap, self.faults, upstream)

    def route_name(self, name: str) -> Address | None:
        """SNI routing: the allowed broker a TLS server name stands for."""
        return self.routing.route_name(name)

    @property
    def named(self) -> dict[str, BrokerUrl]:
        """--sni-route: TLS server names that stand for a broker."""
        return self.routing.named

    @named.setter
    def named(self, routes: dict[str, BrokerUrl]) -> None:
        self.routing.named = routes

    async def ask(self, address: Address, request: Any) -> Frame | UpstreamFailure | None:
        """Run a core's request on the shared connection to ``address``; or
        fetch the keys of the issuer a client's token names (none when the
        issuers in force no longer hold it: a reload took it out since the
        core asked, and the token is refused when checked again)."""
        if isinstance(request, KeysNeeded):
            issuers = self.issuers
            if issuers is not None and request.issuer in issuers.verifier.issuers:
                await issuers.fetch(request.issuer, join=request.join)
            return None
        assert self._pool is not None
        type_, body, credentials = request
        try:
            upstream = await self._pool.get(address, credentials)
            return await upstream.request(type_, body, REQUEST_TIMEOUT)
        except UpstreamFailure as failure:
            return failure

    async def probe(self) -> str | None:
        """None when the configured broker answers; otherwise why not.

        A broker that refuses Sluice's own (credential-less) CONNECT with
        AuthenticationError is up: it wants its clients' credentials, which
        lookups carry. From then on it is only dialled, so that it does not
        log a refused login every probe."""
        assert self._pool is not None
        if self.routing.broker_authenticates:
            try:
                stream = await dial(
                    self.broker.address,
                    timeout=self.connect_timeout,
                    tls=self.tls_context(self.broker.tls),
                )
            except OSError as exc:
                return f"cannot reach broker {self.broker.address}: {exc}"
            await stream.aclose()
            return None
        try:
            await self._pool.get(self.broker.address)
        except UpstreamFailure as failure:
            if failure.error == pb.AuthenticationError:
                self.routing.broker_authenticates = True
                return None
            return failure.message
        return None

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()


class _JournalAllowList(AllowList):
    """An allow-list that reads the journal before saying no."""

    def __init__(self, rules: tuple[str, ...], routing: SharedRouting) -> None:
        super().__init__(rules)
        self._routing = routing

    def allows(self, address: Address) -> bool:
        if super().allows(address):
            return True
        self._routing.refresh()
        return super().allows(address)


class SharedRouting(Routing):
    """``Routing`` whose learned brokers are shared through a journal file."""

    def __init__(
        self,
        broker: BrokerUrl,
        journal: Path,
        allow_rules: tuple[str, ...] = (),
        max_lookups: int = 1_000,
    ) -> None:
        super().__init__(broker, allow_rules, max_lookups)
        self.allowlist = _JournalAllowList(allow_rules, self)
        self.allowlist.learn(broker.address)
        self._journal = Journal(journal)

    def learn(self, url: BrokerUrl, *, via_upstream: bool = False) -> None:
        route = Route(url.tls, via_upstream)
        if self.routes.get(url.address) == route:
            return
        super().learn(url, via_upstream=via_upstream)
        host, port = url.address.host, url.address.port
        self._journal.append(f"{host} {port} {int(url.tls)} {int(via_upstream)}")

    def refresh(self) -> None:
        """Take in what other workers learned since the last look."""
        for parts in self._journal.new_lines():
            if len(parts) != 4:
                continue
            host, port, tls, via = parts
            address = Address(host, int(port))
            self.allowlist.learn(address)
            self.routes[address] = Route(tls == "1", via == "1")
            self.heard(address)

    def close(self) -> None:
        self._journal.close()


def make_backend(config: ProxyConfig, services: Services) -> PulsarBackend:
    """The registry's factory (``sluice.protocols.pulsar.spec``)."""
    # --trust-broker rules allow as well as trust.
    relay_rules = config.allow_broker + config.trust_broker
    oidc_fields = _oidc_fields(config)  # (before proxy_auth loads the files)
    routing: Routing
    if services.state is None:
        routing = Routing(config.broker, relay_rules, config.max_concurrent_lookups)
    else:
        routing = SharedRouting(
            config.broker, services.state / ROUTES_FILE, relay_rules,
            config.max_concurrent_lookups,
        )  # fmt: skip
    return PulsarBackend(
        config.broker,
        PulsarSettings(
            config.on_invalid,
            DEFAULT_MAX_MESSAGE_SIZE
            if config.max_message_size is None
            else config.max_message_size,
            config.max_redirects,
            proxy_auth(config),
            AllowList(config.trust_broker, "--trust-broker"),
            proxy_header_out=config.proxy_protocol_out,
            filtering=services.filters,
        ),
        routing,
        broker_tls=config.broker_tls,
        connect_timeout=config.connect_timeout,
        faults=services.faults,
        max_upstream_connections=config.max_upstream_connections,
        oidc_ca=config.auth_oidc_ca,
        oidc_fields=oidc_fields,
        ports=services.ports,
    )


async def check_broker(config: ProxyConfig) -> str | None:
    """``sluice proxy``'s startup check: None when the broker answers a
    CONNECT (or wants the clients' credentials), otherwise why not."""
    tls = client_ssl_context(config.broker_tls) if config.broker.tls else None
    try:
        stream, _ = await connect_broker(
            config.broker.address, timeout=config.connect_timeout, tls=tls
        )
    except UpstreamFailure as failure:
        if failure.error == pb.AuthenticationError:
            return None  # it answered: it wants the clients' credentials, which they bring
        return failure.message
    await stream.aclose()
    return None


def _oidc_fields(config: ProxyConfig) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The settings of the OpenID Connect issuers, and apart those of
    Sluice's OAuth2 token (a change to one does not make the other anew),
    each with what its files hold (a client secret or CA rotated in place is
    a change: the keys or token are fetched with it)."""
    fields = {f.name for f in dataclasses.fields(config)}
    issuers = tuple(sorted(name for name in fields if name.startswith("auth_oidc_")))
    # The token is fetched trusting --auth-oidc-ca, its issuer allowed over
    # http by --auth-oidc-allow-http.
    own = tuple(sorted(name for name in fields if name.startswith("broker_auth_oauth2_")))
    own += ("auth_oidc_ca", "auth_oidc_allow_http")
    return _fingerprint(config, issuers), _fingerprint(config, own)


def _fingerprint(config: ProxyConfig, names: tuple[str, ...]) -> tuple[Any, ...]:
    files = held(config, tuple(name for name in names if name in FILES))
    return tuple(getattr(config, name) for name in names) + tuple(sorted(files.items()))


def _oauth2(auth: ProxyAuth | None) -> ClientCredentials | None:
    """Sluice's own credential when an OAuth2 issuer hands it out."""
    own = auth.own_token if auth is not None else None
    return own if isinstance(own, ClientCredentials) else None
