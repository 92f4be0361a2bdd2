"""The HTTP listener (``--http-listen``): Pulsar's web port through Sluice.

h11 on trio streams, both ways: a server connection toward each client, a
client connection (kept alive, one per web service) toward the broker. What
is decided about a request (its kind, the headers passed on, which
redirects to follow, the lookup rewrite) is in ``sluice.protocols.http``;
this module reads, writes, dials, times and counts.

A request's body is read whole, within ``--http-max-body``, so that a 307 or
308 can be replayed to the broker it names; answers are streamed to the
client as the broker writes them, except HTTP lookup answers, which are
rewritten (read whole within the same limit): their binary URLs name the
listener Sluice opens for that broker (the backend's ``listener_urls``,
port-per-broker), so the client's producers and consumers come through
Sluice too. Each client connection is its own task under
``--http-idle-timeout`` (for each request's head) and
``--http-request-timeout`` (for the rest of each exchange), so a slow client
holds only itself.

A WebSocket upgrade is relayed as a request; after the broker's 101 the
connection is a ``Session``'s (``sluice/proxy/websocket.py``).
"""

from __future__ import annotations

import contextlib
import logging
import select
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence

import h11
import trio

from sluice.addresses import Address, AllowList, advertised
from sluice.filters.chain import Filters, covering
from sluice.filters.config import FilterSpec, Loaded
from sluice.logs import LogLimit
from sluice.protocols.faults import FaultAction, Faults
from sluice.protocols.filtering import PRODUCE
from sluice.protocols.haproxy import HeaderError
from sluice.protocols.http import (
    HTTP_FAULTS,
    Headers,
    Hop,
    HttpUrl,
    RedirectError,
    Redirects,
    answer_headers,
    forward_headers,
    forwarded_client,
    forwarded_for,
    framed_twice,
    h11_reason,
    head_size,
    header,
    is_topic_lookup,
    lookup_broker_urls,
    origin_form,
    replayable,
    request_kind,
    rewrite_lookup,
    status_class,
    unlisted,
    with_credentials,
)
from sluice.protocols.http.filtered import message_traffic
from sluice.protocols.http.recorded import redact_target
from sluice.protocols.http.websocket import (
    is_websocket_upgrade,
    switch_problem,
    switched_headers,
    upgrade_headers,
)
from sluice.proxy.backend import Unauthorized
from sluice.proxy.config import ProxyConfig, listening_for
from sluice.proxy.dial import (
    CertificateReloader,
    accepted,
    certificate_cn,
    client_ssl_context,
    close_stream,
    dial,
    open_listeners,
    server_ssl_context,
)
from sluice.proxy.http_recording import HttpWatch
from sluice.proxy.inbound import ProxyProtocolIn, peer_address
from sluice.proxy.metrics import HttpMetrics
from sluice.proxy.shared import PLAIN, TLS, LocalLimits
from sluice.proxy.websocket import Session

log = logging.getLogger("sluice.http")

CHUNK = 65536
# How long a connection that comes at the --http-max-connections cap waits
# for the place of the oldest one waiting for a request head, which it takes
# (that one is closed: at once when idle, after a 503 when a head had begun);
# and how long that 503 is given to go out.
EVICT_WAIT = 1.0
# The socket kinds of the HTTP listeners a worker gets from the supervisor,
# and the names of their addresses: plain, TLS.
HTTP = "http"
HTTPS = "https"
# How a broker connection fails: hung up, reset, or not speaking HTTP.
_BROKEN = (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)


# The backend's ``listener_urls``: a lookup answer's binary URLs -> Sluice's
# URL for that broker by kind of listener (PLAIN, TLS).
Routes = Callable[[Sequence[str]], Awaitable[dict[str, str]]]
# The backend's ``web_credentials``: (Authorization, client certificate's
# role) -> the headers that replace the client's credentials (None: kept).
Credentials = Callable[[str | None, str | None], Awaitable[Headers | None]]


def _hung_up(upstream: Upstream) -> bool:
    """Whether a kept connection, idle, has something to read: the broker's
    hang-up (or bytes no request asked for). Either way it is not to carry
    a request that must not be sent twice."""
    stream = upstream.stream
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return False
    try:
        readable, _, _ = select.select([stream.socket.fileno()], [], [], 0)
    except (OSError, ValueError):  # closed already
        return True
    return bool(readable)


class Refusal(Exception):
    """An answer Sluice gives itself: ``status``, counted as ``reason``,
    ``message`` in the body and the log."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class Upstream:
    """One connection to a web service (a broker's), reused while both
    sides keep it alive."""

    def __init__(self, url: HttpUrl, stream: trio.abc.Stream) -> None:
        self.url = url
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(bytes(await self.stream.receive_some(CHUNK)))
                continue
            assert not isinstance(event, type)  # PAUSED: a client never pipelines here
            return event

    async def response(self) -> h11.Response | h11.InformationalResponse:
        """The answer's head: a final one, or a 101 to an upgrade request."""
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
                return event  # h11 switched: what follows is WebSocket
            if isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the broker closed the connection without answering")
            # InformationalResponse (100 Continue): the body went whole already.

    async def body(self, limit: int) -> bytes:
        """The rest of the answer's body (at most ``limit`` bytes)."""
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise Refusal(
                        502,
                        "upstream_error",
                        f"the broker's answer is larger than --http-max-body ({limit} "
                        "bytes), which a rewritten or replayed answer must fit",
                    )
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise h11.RemoteProtocolError("the broker's answer ended early")

    def idle(self) -> bool:
        """Between exchanges: ready for a request."""
        return self.h11.our_state is h11.IDLE and self.h11.their_state is h11.IDLE

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


class HttpRelay:
    """The HTTP listener of one proxy: accepts, relays, follows redirects."""

    def __init__(
        self,
        config: ProxyConfig,
        metrics: HttpMetrics,
        listener_urls: Routes,
        credentials: Credentials | None = None,
        faults: Faults | None = None,
        injected: Callable[[str, str], None] = lambda rule, action: None,
        limits: LocalLimits | None = None,
        inbound: ProxyProtocolIn | None = None,
        header_refused: Callable[[Address, HeaderError], None] = lambda peer, error: None,
        filters: Callable[[], Filters | None] | None = None,
    ) -> None:
        assert config.http_on and config.broker_http is not None
        self.config = config
        self.broker = config.broker_http
        self.metrics = metrics
        # Web services Sluice follows redirects to: --broker-http, those HTTP
        # lookups named, and what --allow-broker / --trust-broker admit.
        self.allowlist = AllowList(config.allow_broker + config.trust_broker)
        self.allowlist.learn(self.broker.address)
        # Brokers' binary URLs -> the Sluice listener that relays a plain
        # CONNECT to that broker (the backend's, port per broker).
        self.listener_urls = listener_urls
        # Proxy-mode authentication: who the client is, and what stands for
        # its credentials toward the broker.
        self.credentials = credentials
        # Fault rules naming "http", and how a rule's hit is counted.
        self.faults = faults if faults is not None else Faults()
        self.injected = injected
        # --http-max-connections, counted over every worker with --workers.
        cap = config.http_max_connections
        self.limits = limits if limits is not None else LocalLimits(cap, cap)
        # --proxy-protocol-in: whose PROXY headers are read first, and how a
        # bad one is counted.
        self.inbound = inbound
        self.header_refused = header_refused
        # The proxy's filters in force (the binary side's ``Filters``, which
        # a reload replaces): a request that would carry messages past them
        # is refused (``_check_filters``). Without it, the configured specs
        # (``config.filters``) stand in, each counting for every direction
        # it runs in (fail closed: which hooks a filter has is not known).
        self.filters = filters
        # --http-listen-tls: the context each accepted connection is wrapped
        # with (a reload may replace it), and its certificate, re-read when
        # the files change.
        self._server_tls: ssl.SSLContext | None = None
        self.certificates: CertificateReloader | None = None
        # Sluice's own web URLs, plain and TLS, for lookup answers ("": none).
        self.own_url = ""
        self.own_tls_url = ""
        self.active = 0
        # Listening sockets, each with whether it speaks TLS.
        self._listeners: list[tuple[trio.SocketListener, bool]] = []
        self._tls: ssl.SSLContext | None = None
        self._warned: set[str] = set()
        self._logs = LogLimit()
        self._draining = False
        # Connections waiting for a request's head: drain() ends the wait.
        self._waiting: set[trio.CancelScope] = set()
        # Those of them that have sent no whole request yet, oldest first: a
        # connection that comes at the cap takes the place of the oldest
        # (``_evicted``: those whose place went).
        self._unserved: dict[trio.CancelScope, None] = {}
        self._evicted: set[trio.CancelScope] = set()
        # Set when a connection's place is given back (a new Event each time).
        self._released = trio.Event()
        # WebSocket sessions relayed now: drain() ends them (1001).
        self._sessions: set[Session] = set()
        # --record: what the client connections read and write, into the
        # capture (sluice/proxy/http_recording.py, set by the proxy).
        self.watch = HttpWatch()

    def adopt(self, listener: trio.SocketListener, *, tls: bool = False) -> None:
        """A listener bound already (a worker's, the supervisor's socket)."""
        self._listeners.append((listener, tls))

    async def open(self) -> dict[str, Address]:
        """Bind the listeners not adopted (OSError when a port is taken);
        their addresses, by kind (``HTTP``, ``HTTPS``)."""
        if not self._listeners:
            for address, tls in ((self.config.http_listen, False),
                                 (self.config.http_listen_tls, True)):  # fmt: skip
                if address is not None:
                    with listening_for("--http-listen-tls" if tls else "--http-listen", address):
                        self._listeners += [(s, tls) for s in await open_listeners(address)]
        addresses: dict[str, Address] = {}
        for listener, tls in self._listeners:
            address = self.config.http_listen_tls if tls else self.config.http_listen
            assert address is not None
            port = listener.socket.getsockname()[1]
            kind = HTTPS if tls else HTTP
            if kind not in addresses:
                addresses[kind] = Address(address.host, port)
                # As the per-broker listeners a lookup answer names are
                # advertised: --advertise-host where given.
                host = advertised(address.host, port, self.config.advertise_host)
                url = f"{kind}://{host}"
                if tls:
                    self.own_tls_url = url
                else:
                    self.own_url = url
        return addresses

    async def serve(self) -> None:
        if any(tls for _, tls in self._listeners):
            assert self.config.tls is not None  # ProxyConfig: --http-listen-tls needs it
            # A context of its own (the binary listeners' may route by SNI),
            # re-read when the files change as theirs is.
            self._server_tls = server_ssl_context(self.config.tls)
            self.certificates = CertificateReloader(self.config.tls, self._server_tls)
        async with trio.open_nursery() as nursery:
            if self.certificates is not None:
                nursery.start_soon(self.certificates.run)
            for tcp, tls in self._listeners:
                nursery.start_soon(self._accept_loop, tcp, tls, nursery)

    def prepare(self, config: ProxyConfig, tls_changed: bool) -> Callable[[], None]:
        """What a reload to ``config`` changes here, made now (ConfigError:
        TLS files that do not load); calling what it returns puts it in
        force. The TLS listener's context, made anew if the listeners' TLS
        settings changed (``tls_changed``: a new --tls-client-ca), wraps the
        connections accepted from then on, and Sluice's own (--broker-tls-*)
        the broker connections opened from then on; the limits, the brokers
        redirects may go to and --max-redirects apply to what comes next."""
        server = None
        if tls_changed and self._server_tls is not None and config.tls is not None:
            server = server_ssl_context(config.tls)
        # Made now, where one is in use, so that files that do not load
        # refuse the reload; else made at the first TLS dial, as at start.
        client = client_ssl_context(config.broker_tls) if self._tls is not None else None
        rules = AllowList(config.allow_broker + config.trust_broker).rules

        def apply() -> None:
            self.config = config
            self.limits.total = self.limits.per_ip = config.http_max_connections
            self.allowlist.rules = rules  # (the brokers it learned stay)
            self._tls = client
            if server is not None and config.tls is not None:
                self._server_tls = server
                if self.certificates is not None:  # its certificate and key, re-read there
                    self.certificates.config, self.certificates.context = config.tls, server

        return apply

    async def drain(self) -> None:
        """Stop accepting; connections close once their exchange in
        progress is answered (``Connection: close``), idle ones now."""
        self._draining = True
        for listener, _ in self._listeners:
            await listener.aclose()
        for scope in self._waiting:
            scope.cancel()
        for session in self._sessions:
            session.shut_down()

    async def _accept_loop(
        self, listener: trio.SocketListener, tls: bool, nursery: trio.Nursery
    ) -> None:
        async for stream in accepted(listener, "the HTTP listener"):
            if tls:  # with the context in force when it is accepted
                assert self._server_tls is not None
                stream = trio.SSLStream(stream, self._server_tls, server_side=True,
                                        https_compatible=True)  # fmt: skip
            nursery.start_soon(self.handle, stream)

    # --- one client connection --------------------------------------------------

    async def handle(self, stream: trio.abc.Stream) -> None:
        peer = client = peer_address(stream)
        # A client that is the peer is counted before anything is read (not
        # left uncounted while its first bytes are awaited); a listed
        # balancer's connection, as the client its header names.
        early = self.inbound is None or not self.inbound.trusts(peer.host)
        refused = await self._acquire(peer.host) if early else None
        held = peer.host if early and refused is None else None
        try:
            if self.inbound is not None and refused is None:  # before anything else is read
                try:
                    header = await self.inbound.read(stream, peer)
                except HeaderError as exc:
                    self.header_refused(peer, exc)
                    return
                if header is not None and header.source is not None:
                    client = header.source
            if not early:
                refused = await self._acquire(client.host)
                held = client.host if refused is None else None
            # Only a listed source's forwarding headers are believed (the
            # client a balancer's header names is listed only when it is a
            # proxy of the operator's own, in front of the balancer).
            trusted = self.inbound is not None and self.inbound.trusts(client.host)
            await self._connection(stream, client, refused, trusted=trusted)
        finally:
            if held is not None:
                self.limits.release(held)
                self._released.set()
                self._released = trio.Event()
            await close_stream(stream)

    async def _acquire(self, host: str) -> str | None:
        """A place for a connection from ``host`` (None), or why there is
        none. At the cap, the oldest connection that has sent no whole
        request yet (silent, or its head still coming) gives its place up:
        connections that send nothing cannot keep other clients out."""
        refused = self.limits.acquire(host)
        if refused is None or not self._unserved:
            return refused
        oldest = next(iter(self._unserved))
        del self._unserved[oldest]
        self._evicted.add(oldest)
        oldest.cancel()
        with trio.move_on_after(EVICT_WAIT):
            while (refused := self.limits.acquire(host)) is not None:
                await self._released.wait()
        return refused

    async def _connection(
        self, stream: trio.abc.Stream, client: Address, refused: str | None, *, trusted: bool
    ) -> None:
        """One client connection's requests, or its refusal (``refused``:
        why, when over a connection limit); ``trusted``: the client is a
        source --proxy-protocol-from lists, whose forwarding headers stay."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.config.http_max_header)
        upstreams: dict[HttpUrl, Upstream] = {}
        self.watch.opened(conn, str(client))
        self.active += 1
        self.metrics.active.inc()
        try:
            if refused is not None:
                await self._refuse(
                    conn,
                    stream,
                    Refusal(
                        503,
                        "connection_limit",
                        f"{refused}: more than {self.config.http_max_connections} HTTP "
                        "connections open (--http-max-connections)",
                    ),
                )
                return
            await self._serve(conn, stream, upstreams, client.host, trusted)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("HTTP client connection lost: %r", exc)
        except Exception as exc:  # a bug of ours: this connection ends, the listener serves on
            log.error("HTTP connection: internal error: %r (--log-level debug for details)", exc)
            log.debug("HTTP connection: internal error", exc_info=exc)
        finally:
            self.active -= 1
            self.metrics.active.dec()
            self.watch.closed(conn)
            for upstream in upstreams.values():
                await close_stream(upstream.stream)  # (shielded where it must wait)
            await close_stream(stream)

    async def _serve(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        upstreams: dict[HttpUrl, Upstream],
        client: str,
        trusted: bool,
    ) -> None:
        """The connection's requests, one after another; ``client``: its
        address (a PROXY header's, or the peer's); ``trusted``: whether the
        forwarding headers it writes are kept (``forwarded_for``)."""
        first = True  # no request served yet on this connection
        while True:
            try:
                with trio.move_on_after(self.config.http_idle_timeout) as idle:
                    if self._draining:
                        idle.cancel()
                    self._waiting.add(idle)
                    if first:
                        self._unserved[idle] = None
                    try:
                        event = await self._next(conn, stream)
                    finally:
                        self._waiting.discard(idle)
                        self._unserved.pop(idle, None)
                        evicted = idle in self._evicted  # (its head may have come meanwhile)
                        self._evicted.discard(idle)
            except h11.RemoteProtocolError as exc:
                # 501: a transfer coding Sluice does not know, which it
                # cannot frame (RFC 9112 6.1); else 400.
                refusal = (
                    self._header_too_large()
                    if exc.error_status_hint == 431
                    else Refusal(
                        501 if exc.error_status_hint == 501 else 400,
                        "malformed",
                        f"malformed HTTP request: {h11_reason(exc)}",
                    )
                )
                await self._refuse(conn, stream, refusal)
                return
            if idle.cancelled_caught:
                if conn.their_state is h11.IDLE and not conn.trailing_data[0]:
                    return  # an idle keep-alive connection: closed quietly
                if evicted:  # its place went to a newer connection
                    with trio.move_on_after(EVICT_WAIT):
                        await self._refuse(
                            conn,
                            stream,
                            Refusal(
                                503,
                                "connection_limit",
                                f"{self.config.http_max_connections} HTTP connections open "
                                "(--http-max-connections): this one, sending no whole request, "
                                "gave its place to a newer one",
                            ),
                        )
                    return
                await self._refuse(
                    conn,
                    stream,
                    Refusal(
                        408,
                        "timeout",
                        f"no whole request head within {self.config.http_idle_timeout:g}s",
                    ),
                )
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed
            if head_size(event.method, event.target, event.headers) > self.config.http_max_header:
                # h11 bounds a head still arriving; one that came whole in a
                # read is measured here.
                await self._refuse(conn, stream, self._header_too_large())
                return
            # Read before the headers the Connection header names go: one
            # naming Authorization says it is for Sluice's hop.
            authorization = header(event.headers, b"authorization")
            event = h11.Request(
                method=event.method,
                target=origin_form(event.target),
                # The headers the client's Connection header names go
                # before Sluice adds its own, which it must not take away.
                headers=forwarded_for(unlisted(event.headers), client, trusted=trusted),
                http_version=event.http_version,
            )
            first = False
            await self._exchange(conn, stream, event, upstreams, authorization)
            if conn.our_state is h11.SWITCHED_PROTOCOL:
                await self._websocket(conn, stream, event, upstreams)
                return
            if self._draining or framed_twice(event.headers):
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return  # either side asked to close, or the body was not read

    def _header_too_large(self) -> Refusal:
        return Refusal(
            431,
            "header_too_large",
            f"request line and headers larger than "
            f"{self.config.http_max_header} bytes (--http-max-header)",
        )

    async def _next(self, conn: h11.Connection, stream: trio.abc.Stream) -> h11.Event:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    await stream.send_all(
                        conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                    )
                data = await stream.receive_some(CHUNK)
                self.metrics.bytes_in.inc(len(data))
                conn.receive_data(bytes(data))
                continue
            assert not isinstance(event, type)  # PAUSED: each request is served before the next
            self.watch.received(conn, event)
            return event

    async def _send(self, conn: h11.Connection, stream: trio.abc.Stream, event: h11.Event) -> None:
        data = conn.send(event)
        self.watch.sent(conn, event)
        if data:
            self.metrics.bytes_out.inc(len(data))
            await stream.send_all(data)

    async def _exchange(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        upstreams: dict[HttpUrl, Upstream],
        authorization: bytes | None,
    ) -> None:
        kind = request_kind(request.target)
        started = trio.current_time()
        status = 0
        try:
            with trio.fail_after(self.config.http_request_timeout):
                status = await self._relay(conn, stream, request, upstreams, authorization)
        except Refusal as refusal:
            status = refusal.status
            await self._refuse(conn, stream, refusal, request)
        except trio.TooSlowError:
            status = 504
            await self._refuse(
                conn,
                stream,
                Refusal(
                    504,
                    "timeout",
                    f"no whole answer within {self.config.http_request_timeout:g}s "
                    "(--http-request-timeout)",
                ),
                request,
            )
        finally:
            if status:
                self.metrics.requests.labels(kind, status_class(status)).inc()
                self.metrics.duration.labels(kind).observe(trio.current_time() - started)

    async def _read_body(
        self, conn: h11.Connection, stream: trio.abc.Stream, request: h11.Request
    ) -> bytes:
        limit = self.config.http_max_body
        length = header(request.headers, b"content-length")
        too_large = Refusal(
            413, "body_too_large", f"request body larger than {limit} bytes (--http-max-body)"
        )
        if length is not None and int(length) > limit:  # h11 checked it is a number
            raise too_large
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                event = await self._next(conn, stream)
            except h11.RemoteProtocolError as exc:
                raise Refusal(
                    400, "malformed", f"malformed HTTP request body: {h11_reason(exc)}"
                ) from None
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise too_large
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise Refusal(400, "malformed", "the request ended before its body")

    async def _relay(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        upstreams: dict[HttpUrl, Upstream],
        authorization: bytes | None,
    ) -> int:
        """One request to the broker (and on to the brokers its redirects
        name), the answer to the client; the status the client got."""
        if request.method == b"CONNECT":
            # A tunnel (h11 would switch both connections to it on a 2xx):
            # Sluice relays a web service, it opens no tunnels.
            raise Refusal(501, "upgrade", "CONNECT is not relayed (Sluice opens no tunnels)")
        # An Upgrade to another protocol (h2c, which curl --http2 and Java's
        # HttpClient offer on http:// URLs) is declined by answering over
        # HTTP/1.1, as RFC 9110 7.8 lets a server (and as the broker's Jetty
        # does): Upgrade is hop-by-hop, it does not go on.
        request, role = await self._authenticated(request, stream, authorization)
        self._check_filters(request, role)
        body = await self._read_body(conn, stream, request)
        if self.faults.active:
            await self._fault(stream, request)
        framed = (
            bool(body)
            or header(request.headers, b"content-length") is not None
            or header(request.headers, b"transfer-encoding") is not None
        )
        redirects = Redirects(
            Hop(self.broker, request.target),
            self.config.max_redirects,
            lambda url: self.allowlist.allows(url.address),
        )
        hop = redirects.first
        while True:
            upstream, response = await self._ask(upstreams, hop, request, body, framed)
            try:
                following = redirects.follow(response.status_code, response.headers)
            except RedirectError as exc:
                await self._drop(upstreams, upstream)
                raise Refusal(502, "redirects", str(exc)) from None
            if following is None:
                break
            try:
                await upstream.body(self.config.http_max_body)  # the redirect's own text
            except _BROKEN as exc:
                await self._drop(upstreams, upstream)
                raise Refusal(
                    502,
                    "upstream_error",
                    f"the broker's web service at {hop.url} answered badly: {h11_reason(exc)}",
                ) from None
            await self._keep(upstreams, upstream)
            self.metrics.redirects.inc()
            self.watch.redirected(conn, following)
            log.debug(
                "%s %s: redirected to %s",
                request.method.decode("latin-1"),
                redact_target(hop.target),
                following.url,
            )
            hop = following
        if isinstance(response, h11.InformationalResponse):  # 101: WebSocket from here on
            return await self._switch(conn, stream, upstream, upstreams, response)
        if is_topic_lookup(request.method, request.target) and response.status_code == 200:
            return await self._lookup_answer(conn, stream, upstream, upstreams, response)
        await self._send(
            conn,
            stream,
            h11.Response(
                status_code=response.status_code,
                headers=answer_headers(response.headers) + self._closing(),
                reason=response.reason,
            ),
        )
        while True:
            try:
                event = await upstream.next_event()
            except _BROKEN as exc:
                # The answer has begun: all the client can be told is the hang-up.
                await self._drop(upstreams, upstream)
                raise trio.BrokenResourceError(f"broker's answer broke off: {exc}") from None
            if isinstance(event, h11.Data):
                await self._send(conn, stream, event)
            elif isinstance(event, h11.EndOfMessage):
                await self._send(conn, stream, h11.EndOfMessage())
                break
            else:
                await self._drop(upstreams, upstream)
                raise trio.BrokenResourceError("the broker's answer ended early")
        await self._keep(upstreams, upstream)
        return response.status_code

    async def _fault(self, stream: trio.abc.Stream, request: h11.Request) -> None:
        """Fault rules for the web port (``match.protocol`` "http"): the
        request held back (delay), answered by Sluice (error: the rule's
        status), or its connection closed unanswered (drop, disconnect)."""
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        rule = self.faults.check(
            HTTP_FAULTS.name,
            request_kind(request.target).upper(),
            True,
            forwarded_client(request.headers),
            lambda: path,
            named_only=True,
        )
        if rule is None:
            return
        self.injected(rule.id, str(rule.action))
        log.info("HTTP %s %s: fault rule %s", request.method.decode("latin-1"), path, rule.id)
        if rule.action is FaultAction.DELAY:
            await trio.sleep(self.faults.delay(rule))
        elif rule.action is FaultAction.ERROR:
            raise Refusal(int(rule.error), "fault", f"{rule.message} (fault rule {rule.id})")
        else:  # drop, disconnect: no answer
            raise trio.BrokenResourceError(f"closed by fault rule {rule.id}")

    def _check_filters(self, request: h11.Request, role: str | None) -> None:
        """Refuse (403) a request that would produce to or consume from a
        topic a configured filter covers in that direction: the WebSocket
        API, REST produce and the admin calls that hand out messages carry
        them in shapes the filters never see, so they would go by
        unfiltered (garbage into a schema'd topic, plaintext past
        ``encrypt``). ``role``: the client's, where Sluice verified it
        (proxy mode), else None, for which a filter that names roles
        counts. A topic pattern (the v3 consumer's) counts as any topic."""
        candidates: Iterable[Loaded | FilterSpec]
        if self.filters is not None:
            made = self.filters()
            candidates = made.loaded if made is not None else ()
        else:
            candidates = self.config.filters
        candidates = list(candidates)
        if not candidates:  # (first: no filter, no request read for its topics)
            return
        traffic = message_traffic(request.method, request.target)
        if traffic is None:
            return
        topics: list[str | None] = [None] if traffic.any_topic else [*sorted(traffic.topics)]
        for topic in topics:
            names = covering(candidates, topic, traffic.direction, role)
            if names:
                acting = ", ".join(repr(n) for n in names)
                where = topic if topic is not None else "a topic pattern (topicsPattern)"
                verb = "produces to" if traffic.direction == PRODUCE else "consumes from"
                raise Refusal(
                    403,
                    "filtered",
                    f"{traffic.what} {verb} {where}, which filter {acting} covers; "
                    "filters run on the binary protocol only, so this request is refused "
                    "(use a Pulsar client through Sluice's binary listener)",
                )

    async def _authenticated(
        self, request: h11.Request, stream: trio.abc.Stream, authorization: bytes | None
    ) -> tuple[h11.Request, str | None]:
        """The request as it goes on, and the client's role where Sluice
        verified it (None: unknown): in proxy mode, its client checked by
        ``authorization`` (the client's, as it came) or its certificate (401
        otherwise) and its credentials replaced by Sluice's own and the
        client's role. A WebSocket upgrade keeps the client's own credentials
        once checked, so that the broker's WebSocket service grants the
        session no more than the client's role."""
        role = certificate_cn(stream) if isinstance(stream, trio.SSLStream) else None
        if self.credentials is None:
            return request, None
        try:
            own = await self.credentials(
                None if authorization is None else authorization.decode("latin-1"), role
            )
        except Unauthorized as exc:
            raise Refusal(401, "unauthorized", f"authentication failed: {exc}") from None
        if own is None:
            return request, None
        upgrade = is_websocket_upgrade(request.headers)
        if upgrade and (authorization is None or header(request.headers, b"authorization")
                        != authorization):  # fmt: skip
            # The session goes on with the client's own token, checked: with
            # none (a certificate cannot be passed on; a token its Connection
            # header named is gone), the broker would take Sluice's own.
            raise Refusal(401, "unauthorized", "a WebSocket session through Sluice in proxy "
                          "mode needs the client's token in its Authorization header (a "
                          "client certificate alone cannot be passed on)")  # fmt: skip
        verified = header(own, b"x-original-principal")
        return h11.Request(
            method=request.method,
            target=request.target,
            headers=with_credentials(request.headers, own, upgrade=upgrade),
            http_version=request.http_version,
        ), None if verified is None else verified.decode("latin-1")

    async def _ask(
        self,
        upstreams: dict[HttpUrl, Upstream],
        hop: Hop,
        request: h11.Request,
        body: bytes,
        framed: bool,
    ) -> tuple[Upstream, h11.Response | h11.InformationalResponse]:
        """Send the request to ``hop``'s web service and read the answer's
        head, on a kept connection when there is one. A kept connection the
        broker has closed meanwhile (idle brokers close theirs) fails
        without an answer: the request goes again, once, on a new one, if
        its method is idempotent or it failed while being sent. Any other
        (a POST) may have been carried out already, and is not repeated: a
        kept connection with something to read while idle (the broker's
        hang-up) is not used for it."""
        rewritten = is_topic_lookup(request.method, request.target)
        passed: Headers = (
            upgrade_headers(request.headers, hop.url.authority)
            if is_websocket_upgrade(request.headers)
            else forward_headers(request.headers, hop.url.authority, identity=rewritten)
        )
        headers = [(n, v) for n, v in passed if n.lower() != b"content-length"]
        if framed:
            headers.append((b"content-length", str(len(body)).encode()))
        while True:
            upstream = upstreams.pop(hop.url, None)
            if upstream is not None and not upstream.idle():
                # Left mid-exchange by a request that failed (a timeout, a
                # refusal): its state is unknown, it is not reused.
                await close_stream(upstream.stream)
                upstream = None
            if upstream is not None and not replayable(request.method) and _hung_up(upstream):
                await close_stream(upstream.stream)
                upstream = None
            reused = upstream is not None
            if upstream is None:
                upstream = await self._dial(hop.url)
            sent = False
            try:
                await upstream.send(
                    h11.Request(method=request.method, target=hop.target, headers=headers)
                )
                if body:
                    await upstream.send(h11.Data(data=body))
                await upstream.send(h11.EndOfMessage())
                sent = True
                response = await upstream.response()
            except _BROKEN as exc:
                await close_stream(upstream.stream)
                if reused and (not sent or replayable(request.method)):
                    continue  # upstreams holds none for hop.url now: a new one
                raise Refusal(
                    502,
                    "upstream_error",
                    f"the broker's web service at {hop.url} gave no "
                    f"answer: {exc or type(exc).__name__}",
                ) from None
            upstreams[hop.url] = upstream
            return upstream, response

    async def _dial(self, url: HttpUrl) -> Upstream:
        tls = None
        if url.tls:
            if self._tls is None:
                self._tls = client_ssl_context(self.config.broker_tls)
            tls = self._tls
        try:
            stream = await dial(url.address, timeout=self.config.connect_timeout, tls=tls)
        except OSError as exc:
            raise Refusal(
                502,
                "upstream_unreachable",
                f"cannot reach the broker's web service at {url}: {exc}",
            ) from None
        return Upstream(url, stream)

    async def _keep(self, upstreams: dict[HttpUrl, Upstream], upstream: Upstream) -> None:
        """Keep ``upstream`` for the next request, or close it when either
        side said the exchange was its last."""
        if upstream.reusable():
            upstreams[upstream.url] = upstream
        else:
            await self._drop(upstreams, upstream)

    async def _drop(self, upstreams: dict[HttpUrl, Upstream], upstream: Upstream) -> None:
        upstreams.pop(upstream.url, None)
        await close_stream(upstream.stream)

    async def _lookup_answer(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        upstream: Upstream,
        upstreams: dict[HttpUrl, Upstream],
        response: h11.Response,
    ) -> int:
        """An HTTP lookup's answer, rewritten to name Sluice."""
        try:
            body = await upstream.body(self.config.http_max_body)
        except _BROKEN as exc:
            await self._drop(upstreams, upstream)
            raise Refusal(
                502, "upstream_error", f"the broker's lookup answer broke off: {exc}"
            ) from None
        await self._keep(upstreams, upstream)
        ours = await self.listener_urls(lookup_broker_urls(body))
        done = rewrite_lookup(
            body,
            http=self.own_url or None,
            https=self.own_tls_url or None,
            broker=ours.get(PLAIN),
            broker_tls=ours.get(TLS),
        )
        for url in done.named:
            self.allowlist.learn(url.address)
        for why in done.kept:
            if why not in self._warned:
                self._warned.add(why)
                log.warning("HTTP lookup: %s", why)
        out = done.body if done.body is not None else body
        await self._send(
            conn,
            stream,
            h11.Response(
                status_code=response.status_code,
                reason=response.reason,
                headers=answer_headers(response.headers, len(out)) + self._closing(),
            ),
        )
        await self._send(conn, stream, h11.Data(data=out))
        await self._send(conn, stream, h11.EndOfMessage())
        return response.status_code

    async def _switch(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        upstream: Upstream,
        upstreams: dict[HttpUrl, Upstream],
        response: h11.InformationalResponse,
    ) -> int:
        """The broker's 101, passed on: both connections carry WebSocket
        now (``_websocket`` relays it, outside the request's timeout)."""
        problem = switch_problem(response.headers)
        if problem is not None:
            await self._drop(upstreams, upstream)
            raise Refusal(502, "upstream_error", problem)
        await self._send(
            conn,
            stream,
            h11.InformationalResponse(
                status_code=101, headers=switched_headers(response.headers), reason=response.reason
            ),
        )
        return 101

    async def _websocket(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        upstreams: dict[HttpUrl, Upstream],
    ) -> None:
        """The session after a 101 (sluice/proxy/websocket.py), to its end."""
        upstream = next(u for u in upstreams.values() if u.h11.our_state is h11.SWITCHED_PROTOCOL)
        del upstreams[upstream.url]
        session = Session(
            stream,
            upstream.stream,
            self.metrics,
            max_message=self.config.http_max_body,
            idle_timeout=self.config.http_request_timeout,
            what=redact_target(request.target.split(b"?", 1)[0]),  # no query; no ;jsessionid=
            tap=self.watch.session(conn),
        )
        self._sessions.add(session)
        try:
            if self._draining:
                session.shut_down()
            await session.run(conn.trailing_data[0], upstream.h11.trailing_data[0])
        finally:
            self._sessions.discard(session)
            with trio.CancelScope(shield=True):
                await close_stream(upstream.stream)

    def _closing(self) -> list[tuple[bytes, bytes]]:
        """While draining, each answer says it is the connection's last."""
        return [(b"connection", b"close")] if self._draining else []

    async def _refuse(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        refusal: Refusal,
        request: h11.Request | None = None,
    ) -> None:
        """Answer ``refusal`` (when no answer has begun), count it, log it."""
        self.metrics.refused.labels(refusal.reason).inc()
        self.watch.refused(conn, refusal.reason)
        if request is None and refusal.reason != "connection_limit":
            self.metrics.requests.labels("other", status_class(refusal.status)).inc()
        what = ""
        if request is not None:
            what = f"{request.method.decode('latin-1')} {redact_target(request.target)}: "
        level = self._logs.level(refusal.reason, trio.current_time())
        if level > logging.DEBUG:  # the client's bad input is no warning of Sluice's
            level = logging.WARNING if refusal.status >= 500 else logging.INFO
        log.log(level, "HTTP %d: %s%s", refusal.status, what, refusal.message)
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # an answer has begun: the hang-up says it
        text = f"Sluice: {refusal.message}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(text)).encode()),
        ]
        if conn.their_state is not h11.DONE:
            headers.append((b"connection", b"close"))
        with contextlib.suppress(h11.LocalProtocolError):
            await self._send(
                conn, stream, h11.Response(status_code=refusal.status, headers=headers)
            )
            await self._send(conn, stream, h11.Data(data=text))
            await self._send(conn, stream, h11.EndOfMessage())
