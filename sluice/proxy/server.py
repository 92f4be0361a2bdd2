"""The proxy: listeners, connection limits, dispatch, graceful drain."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from sluice.errors import leaves
from sluice.protocols.pulsar import Frame, ProtocolError, Type, decode_stream, pb
from sluice.proxy.admin import bound, open_admin, serve_admin
from sluice.proxy.allowlist import AllowList
from sluice.proxy.config import Address, BrokerUrl, ProxyConfig
from sluice.proxy.framing import FrameStream, client_ssl_context
from sluice.proxy.lookup import LookupSession
from sluice.proxy.metrics import BROKER_TO_CLIENT, CLIENT_TO_BROKER, TYPE_SLOTS, Metrics
from sluice.proxy.relay import RelaySession, connect_error
from sluice.proxy.upstream import UpstreamError, UpstreamPool
from sluice.recording.writer import Recorder

log = logging.getLogger("sluice.proxy")


@dataclass(frozen=True)
class Route:
    """How to reach a broker a lookup answer named."""

    tls: bool  # its URL was pulsar+ssl://
    via_upstream: bool  # the upstream is itself a proxy and asked to be used


class Slots:
    """A counting limit that refuses instead of waiting."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def acquire_nowait_or_false(self) -> bool:
        if self.used >= self.total:
            return False
        self.used += 1
        return True

    def release(self) -> None:
        self.used -= 1


def server_ssl_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.allowlist = AllowList(config.allow_broker)
        self.allowlist.learn(config.broker.address)
        self.routes: dict[Address, Route] = {}
        self.lookup_slots = Slots(config.max_concurrent_lookups)
        self.metrics = Metrics(config.topic_metrics_limit)
        self.upstream_ok = False
        self.listening = False
        self.relays: set[RelaySession] = set()
        self.active = 0
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._listeners: list[trio.abc.Listener[Any]] = []
        self.addresses: dict[str, Address] = {}
        self._handlers: trio.Nursery | None = None
        self._stop = trio.Event()
        self.recorder: Recorder | None = None
        if config.record is not None:
            listen = [str(a) for a in (config.listen, config.listen_tls) if a is not None]
            self.recorder = Recorder(
                config.record, self.metrics, listen=listen, broker=str(config.broker)
            )
        self._upstream_tls = client_ssl_context(config.broker_tls) if config.broker.tls else None
        self.upstream: UpstreamPool

    # --- accounting --------------------------------------------------------

    def reject(self, reason: str) -> None:
        self.metrics.connections_rejected.labels(reason).inc()

    def learn_broker(self, url: BrokerUrl, *, via_upstream: bool = False) -> None:
        """A broker the upstream named: allow it, and remember how to reach it."""
        self.allowlist.learn(url.address)
        self.routes[url.address] = Route(url.tls, via_upstream)

    def note_invalid(self, frame: Frame, side: str, name: str) -> None:
        assert frame.error is not None
        direction = CLIENT_TO_BROKER if side == "client" else BROKER_TO_CLIENT
        self.metrics.validation_failures.labels(frame.error.problem.value, direction).inc()
        log.warning("%s: invalid %s from %s: %s", name, frame.name, side, frame.error.message)

    # --- lifecycle ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``drain()``; ``task_status.started`` once listening."""
        # Listening errors (port in use) surface here, outside any nursery,
        # as a plain OSError the CLI can report in one line.
        # Admin first: once the proxy port accepts connections, the probes
        # endpoint is already there.
        admin = None
        if self.config.admin is not None:
            admin = await open_admin(self.config.admin)
            self.addresses["admin"] = bound(admin)
        await self._open_listeners()
        async with trio.open_nursery() as outer:
            self.upstream = UpstreamPool(
                outer,
                timeout=self.config.connect_timeout,
                tls_for=lambda address: self._upstream_tls,
                metrics=self.metrics,
            )
            outer.start_soon(self._probe_upstream)
            if self.recorder is not None:
                await outer.start(self.recorder.run)
            if admin is not None:
                outer.start_soon(serve_admin, admin, self)
            async with trio.open_nursery() as handlers:
                self._handlers = handlers
                for kind, listener in self._listeners_by_kind():
                    handlers.start_soon(self._accept_loop, listener, kind)
                self.listening = True
                task_status.started(self)
                await self._stop.wait()
            await self.upstream.aclose()
            outer.cancel_scope.cancel()

    def _listeners_by_kind(self) -> list[tuple[str, trio.abc.Listener[Any]]]:
        return list(zip(self._kinds, self._listeners, strict=True))

    async def _open_listeners(self) -> None:
        self._kinds: list[str] = []
        config = self.config
        if config.listen is not None:
            for listener in await trio.open_tcp_listeners(
                config.listen.port, host=config.listen.host
            ):
                self._add_listener("plain", listener, listener)
        if config.listen_tls is not None:
            assert config.tls is not None
            context = server_ssl_context(
                str(config.tls.cert),
                str(config.tls.key),
                str(config.tls.client_ca) if config.tls.client_ca else None,
            )
            for listener in await trio.open_tcp_listeners(
                config.listen_tls.port, host=config.listen_tls.host
            ):
                wrapped = trio.SSLListener(listener, context, https_compatible=False)
                self._add_listener("tls", wrapped, listener)

    def _add_listener(
        self, kind: str, listener: trio.abc.Listener[Any], tcp: trio.SocketListener
    ) -> None:
        host, port = tcp.socket.getsockname()[:2]
        self.addresses.setdefault(kind, Address(host, port))
        self._listeners.append(listener)
        self._kinds.append(kind)

    async def _accept_loop(self, listener: trio.abc.Listener[Any], kind: str) -> None:
        assert self._handlers is not None
        while True:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving
                log.error("accept failed on %s listener: %s", kind, exc)
                await trio.sleep(0.1)
                continue
            self._handlers.start_soon(self._handle, stream, kind)

    async def _probe_upstream(self, interval: float = 5.0) -> None:
        """Keep sluice_upstream_up and /readyz current."""
        while True:
            try:
                await self.upstream.get(self.config.broker.address)
                ok = True
            except UpstreamError as exc:
                if self.upstream_ok:
                    log.warning("upstream broker unreachable: %s", exc.message)
                ok = False
            self.upstream_ok = ok
            self.metrics.upstream_up.set(1 if ok else 0)
            await trio.sleep(interval)

    async def drain(self) -> None:
        """Stop accepting, hand clients back gracefully, stop within the drain timeout."""
        deadline = trio.current_time() + self.config.drain_timeout
        log.info("draining %d connections (timeout %gs)", self.active, self.config.drain_timeout)
        self.listening = False
        for listener in self._listeners:
            await listener.aclose()
        async with trio.open_nursery() as nursery:
            for relay in list(self.relays):
                nursery.start_soon(relay.drain, deadline)
        with trio.move_on_at(deadline):
            while self.active:
                await trio.sleep(0.02)
        self.stop()

    def stop(self) -> None:
        """Stop at once, closing every connection."""
        if self._handlers is not None:
            self._handlers.cancel_scope.cancel()
        self._stop.set()

    # --- one connection ----------------------------------------------------

    async def _handle(self, stream: trio.abc.Stream, kind: str) -> None:
        peer = _peer(stream)
        ip = peer.host
        conn = next(self._ids)
        name = f"conn-{conn} {peer}"
        if self.active >= self.config.max_connections:
            await self._reject(stream, name, "limit", "too many connections")
            return
        if self._per_ip[ip] >= self.config.max_connections_per_ip:
            await self._reject(stream, name, "limit", f"too many connections from {ip}")
            return
        self.active += 1
        self._per_ip[ip] += 1
        metrics = self.metrics
        metrics.connections_opened.labels(kind).inc()
        metrics.connections_active.labels(kind).inc()
        client = FrameStream(stream, self.config.max_message_size)
        reason = "closed"
        try:
            await self._serve(client, conn, name, kind, peer)
        except Exception as exc:  # one connection never takes the proxy down
            reason = self._connection_failed(name, kind, client, exc)
        finally:
            if self.recorder is not None:
                self.recorder.close_connection(conn, reason)
            self.active -= 1
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]
            metrics.connections_closed.labels(kind).inc()
            metrics.connections_active.labels(kind).dec()
            with trio.CancelScope(shield=True):
                await _close(stream)

    async def _serve(
        self, client: FrameStream, conn: int, name: str, kind: str, peer: Address
    ) -> None:
        first: Frame | None = None
        with trio.move_on_after(self.config.handshake_timeout):
            first = await client.receive_frame()
            if first is None:
                return
        if first is None:
            self.reject("handshake_timeout")
            log.info("%s: no CONNECT within %gs, closing", name, self.config.handshake_timeout)
            return
        relayed = first.type == Type.Value("CONNECT") and first.body.HasField("proxy_to_broker_url")
        if self.recorder is not None:
            self.recorder.open_connection(
                conn,
                client=str(peer),
                kind="proxied" if relayed else "lookup",
                listener=kind,
                broker=first.body.proxy_to_broker_url if relayed else str(self.config.broker),
            )
        self.saw(conn, True, first)
        if first.type != Type.Value("CONNECT") or first.error is not None:
            why = first.error.message if first.error else f"expected CONNECT, got {first.name}"
            log.warning("%s: bad handshake: %s", name, why)
            self.reject("handshake")
            await self.send_own(client, conn, connect_error(pb.NotAllowedError, why))
            return
        if relayed:
            self.metrics.sessions.labels("proxied").inc()
            relay = RelaySession(self, client, first, conn, name)
            self.relays.add(relay)
            try:
                await relay.run()
            finally:
                self.relays.discard(relay)
        else:
            self.metrics.sessions.labels("lookup").inc()
            await LookupSession(self, client, first, conn, name).run()

    def saw(self, conn: int, from_client: bool, frame: Frame) -> None:
        """Count and record one frame of a client connection.

        The relay's pumps do the same inline, for speed; everything else (the
        handshake, lookup connections, frames the proxy writes) comes here.
        """
        direction = CLIENT_TO_BROKER if from_client else BROKER_TO_CLIENT
        slot = frame.type if frame.type < TYPE_SLOTS else 0
        self.metrics.traffic.frames[direction][slot] += 1
        self.metrics.traffic.bytes[direction][slot] += len(frame.raw)
        if self.recorder is not None:
            self.recorder.frame(conn, 0 if from_client else 1, frame)

    async def send_own(self, client: FrameStream, conn: int, data: bytes) -> None:
        """Send frames the proxy itself wrote, counting and recording them."""
        for frame in decode_stream(data):
            self.saw(conn, False, frame)
        await client.send(data)

    def _connection_failed(
        self, name: str, kind: str, client: FrameStream, exc: BaseException
    ) -> str:
        """Say, in one line, why a connection ended badly; the reason, for the recording."""
        reason = "error"
        for leaf in leaves(exc):
            reason = type(leaf).__name__
            cause = leaf.__cause__
            if isinstance(leaf, (trio.BrokenResourceError, trio.ClosedResourceError)):
                if kind == "tls" and isinstance(cause, ssl.SSLError) and not client.bytes_in:
                    self.reject("tls")
                    log.warning("%s: TLS handshake failed: %s", name, cause)
                else:
                    log.info("%s: connection lost: %s", name, cause or leaf)
            elif isinstance(leaf, ProtocolError):
                log.warning("%s: closing: %s", name, leaf)
            else:
                log.error("%s: internal error, connection closed: %r", name, leaf, exc_info=leaf)
        return reason

    async def _reject(self, stream: trio.abc.Stream, name: str, reason: str, why: str) -> None:
        self.reject(reason)
        log.warning("%s: rejected: %s", name, why)
        await _close(stream)


def _peer(stream: trio.abc.Stream) -> Address:
    inner: Any = stream
    while isinstance(inner, trio.SSLStream):
        inner = inner.transport_stream
    try:
        host, port = inner.socket.getpeername()[:2]
    except (AttributeError, OSError):
        return Address("?", 0)
    return Address(host, port)


async def _close(stream: trio.abc.Stream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await trio.aclose_forcefully(stream)
