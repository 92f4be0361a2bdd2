"""Proxied connections: CONNECT with ``proxy_to_broker_url``.

Sluice checks the target against the allow-list, dials it, connects on the
client's behalf, hands the broker's CONNECTED to the client, and from then
on relays frames both ways through the codec.

Validation policy (``--on-invalid``):
- ``reject``: an invalid frame from the client is answered the way a broker
  would (SEND_ERROR ChecksumError for a corrupt SEND, ERROR for a request)
  and never reaches the broker; one that nothing can answer closes the
  connection. Unknown command types pass: a newer client may know them.
  Frames from the broker are forwarded even when invalid (and counted): the
  client has its own checks, and holding back a MESSAGE would desynchronise
  flow-control permits.
- ``forward``: everything is counted, logged and forwarded.
A frame that cannot be framed at all (over the size limit, stream cut mid
frame) closes the connection either way.

Backpressure: each direction reads one chunk, forwards it, and only then
reads again, so a slow reader slows its sender through TCP and the proxy
holds at most one read plus one partial frame per direction.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import trio
from google.protobuf import text_format

from sluice.protocols.pulsar import (
    Frame,
    Problem,
    ProtocolError,
    RemoteProtocolError,
    Type,
    command,
    encode,
    error_reply,
    pb,
)
from sluice.protocols.pulsar.correlation import CLIENT_TYPES, SERVER_TYPES, Correlator
from sluice.protocols.pulsar.redact import loggable
from sluice.proxy.config import BrokerUrl, ConfigError, parse_broker_url
from sluice.proxy.framing import FrameStream, client_ssl_context, dial
from sluice.proxy.metrics import BROKER_TO_CLIENT, CLIENT_TO_BROKER, TYPE_SLOTS
from sluice.proxy.session import ClientSession
from sluice.proxy.upstream import SLUICE_VERSION, UpstreamError

if TYPE_CHECKING:
    from sluice.proxy.server import Proxy

log = logging.getLogger("sluice.relay")

# Brokers answer a failed CONNECT with request_id -1.
NO_REQUEST = 2**64 - 1
_CONNECT = Type.Value("CONNECT")
_CONNECTED = Type.Value("CONNECTED")
_SEND = Type.Value("SEND")
_MESSAGE = Type.Value("MESSAGE")
_CLOSE_PRODUCER = Type.Value("CLOSE_PRODUCER")
_CLOSE_CONSUMER = Type.Value("CLOSE_CONSUMER")
_TOPIC_MIGRATED = Type.Value("TOPIC_MIGRATED")
_AUTH_CHALLENGE = Type.Value("AUTH_CHALLENGE")
_AUTH_RESPONSE = Type.Value("AUTH_RESPONSE")


def connect_error(error: int, message: str) -> bytes:
    return encode(
        command(
            Type.Value("ERROR"),
            pb.CommandError(request_id=NO_REQUEST, error=error, message=message),  # type: ignore[arg-type]
        )
    )


class RelaySession(ClientSession):
    def __init__(
        self, proxy: Proxy, client: FrameStream, connect: Frame, conn: int, name: str
    ) -> None:
        super().__init__(proxy, client, connect, conn, name)
        self.recorder = proxy.recorder
        self.broker: FrameStream | None = None
        self.correlator = Correlator()
        self._client_pump_scope: trio.CancelScope | None = None
        self._session_scope: trio.CancelScope | None = None
        self.draining = False

    async def run(self) -> None:
        target_text = self.connect.body.proxy_to_broker_url
        try:
            target = parse_broker_url(target_text, what="proxy_to_broker_url")
        except ConfigError as exc:
            await self._refuse(str(exc))
            return
        if not self.proxy.allowlist.allows(target.address):
            await self._refuse(f"broker {target.address} is not in the allow-list")
            return
        metrics = self.proxy.metrics
        started = trio.current_time()
        try:
            broker = await self._connect_broker(target)
        except UpstreamError as exc:
            log.warning("%s: %s", self.name, exc.message)
            metrics.upstream_dial_failures.inc()
            await self.proxy.send_own(self.client, self.conn, connect_error(exc.error, exc.message))
            return
        elapsed = trio.current_time() - started
        metrics.upstream_dial.observe(elapsed)
        metrics.request_done(_CONNECT, elapsed, None)
        self.broker = broker
        try:
            with trio.CancelScope() as self._session_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump_client, nursery.cancel_scope)
                    nursery.start_soon(self._pump_broker, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):
                await broker.aclose()

    async def _refuse(self, reason: str) -> None:
        log.warning("%s: refusing relay: %s", self.name, reason)
        self.proxy.reject("relay_refused")
        await self.proxy.send_own(self.client, self.conn, connect_error(pb.ServiceNotReady, reason))

    async def _connect_broker(self, target: BrokerUrl) -> FrameStream:
        config = self.proxy.config
        route = self.proxy.routes.get(target.address)
        ours: pb.CommandConnect = pb.CommandConnect()
        ours.CopyFrom(self.connect.body)
        ours.proxy_version = SLUICE_VERSION
        if route is not None and route.via_upstream:
            # Chained: the upstream is a proxy too; go through it, naming the
            # broker the same way the client named it to us.
            dial_to, tls = config.broker.address, config.broker.tls
        else:
            # proxy_to_broker_url has no scheme: the lookup answer that named
            # the broker says whether it speaks TLS.
            dial_to = target.address
            tls = route.tls if route is not None else (target.tls or config.broker.tls)
            ours.ClearField("proxy_to_broker_url")
        context = client_ssl_context(config.broker_tls) if tls else None
        try:
            raw = await dial(dial_to, timeout=config.connect_timeout, tls=context)
        except OSError as exc:
            raise UpstreamError(f"cannot reach broker {dial_to}: {exc}") from exc
        broker = FrameStream(raw, config.max_message_size)
        try:
            await self._handshake(broker, ours)
        except BaseException:
            with trio.CancelScope(shield=True):
                await raw.aclose()
            raise
        return broker

    async def _handshake(self, broker: FrameStream, connect: pb.CommandConnect) -> None:
        """CONNECT for the client, relaying any auth challenge, until CONNECTED."""
        await broker.send(encode(command(Type.Value("CONNECT"), connect)))
        with trio.move_on_after(self.proxy.config.handshake_timeout):
            while True:
                try:
                    frame = await broker.receive_frame()
                except (ProtocolError, trio.BrokenResourceError) as exc:
                    raise UpstreamError(f"broker broke off the handshake: {exc}") from exc
                if frame is None:
                    raise UpstreamError("broker closed the connection during the handshake")
                self._record(1, frame)
                if frame.type == _CONNECTED:
                    if frame.body.HasField("max_message_size"):
                        size = frame.body.max_message_size
                        broker.decoder.max_message_size = size
                        self.client.decoder.max_message_size = size
                    await self.client.send(frame.raw)
                    return
                if frame.type == _AUTH_CHALLENGE:
                    await self.client.send(frame.raw)
                    answer = await self.client.receive_frame()
                    if answer is None or answer.type != _AUTH_RESPONSE:
                        raise UpstreamError("client did not answer the broker's auth challenge")
                    self._record(0, answer)
                    await broker.send(answer.raw)
                    continue
                if frame.type == Type.Value("ERROR"):
                    # Pass the broker's own refusal on unchanged.
                    await self.client.send(frame.raw)
                    raise UpstreamError(f"broker refused CONNECT: {frame.body.message}")
                raise UpstreamError(f"broker answered CONNECT with {frame.name}")
        raise UpstreamError(
            f"broker did not complete the handshake within {self.proxy.config.handshake_timeout:g}s"
        )

    # --- relaying ----------------------------------------------------------

    async def _pump_client(self, session: trio.CancelScope) -> None:
        assert self.broker is not None
        with trio.CancelScope() as self._client_pump_scope:
            await self._pump(self.client, self.broker, True, session)

    async def _pump_broker(self, session: trio.CancelScope) -> None:
        assert self.broker is not None
        await self._pump(self.broker, self.client, False, session)

    async def _pump(
        self, src: FrameStream, dst: FrameStream, from_client: bool, session: trio.CancelScope
    ) -> None:
        side = "client" if from_client else "broker"
        direction = CLIENT_TO_BROKER if from_client else BROKER_TO_CLIENT
        decoder = src.decoder
        correlator = self.correlator
        observe = correlator.observe
        observed = CLIENT_TYPES if from_client else SERVER_TYPES
        proxy = self.proxy
        metrics = proxy.metrics
        frame_counts = metrics.traffic.frames[direction]
        byte_counts = metrics.traffic.bytes[direction]
        relay_delay = metrics.relay_delay_by_direction[direction]
        payload_type = _SEND if from_client else _MESSAGE
        recorder = self.recorder
        lossless = recorder is not None and recorder.config.lossless
        conn = self.conn
        record_direction = 0 if from_client else 1
        reject = proxy.config.on_invalid == "reject"
        trace = log.isEnabledFor(logging.DEBUG)
        try:
            while True:
                if lossless:
                    assert recorder is not None
                    await recorder.room()
                data = await src.receive_chunk()
                now = trio.current_time()
                # A chunk that starts on a frame boundary, ends on one, and
                # holds only frames forwarded unchanged is sent as it came.
                whole = decoder.buffered == 0
                decoder.receive_data(data)
                out: list[bytes] = []
                topics: dict[str, list[int]] = {}
                for frame in decoder.frames():
                    t = frame.type
                    slot = t if t < TYPE_SLOTS else 0
                    frame_counts[slot] += 1
                    byte_counts[slot] += len(frame.raw)
                    if recorder is not None:
                        recorder.frame(conn, record_direction, frame)
                    if trace:
                        log.debug("%s: %s -> %s %s", self.name, side, frame.name, _brief(frame))
                    if frame.error is None:
                        out.append(frame.raw)
                        if t == payload_type:
                            self._count_topic(frame, from_client, topics)
                        if t in observed:
                            done = observe(frame, from_client, now)
                            if done is not None:
                                metrics.request_done(done.request_type, done.seconds, done.error)
                            if not from_client and t in _NAMES_BROKERS:
                                self._learn_brokers(frame)
                        continue
                    proxy.note_invalid(frame, side, self.name)
                    if not reject or not from_client or frame.error.problem is Problem.UNKNOWN_TYPE:
                        out.append(frame.raw)
                        observe(frame, from_client, now)
                        continue
                    whole = False
                    reply = error_reply(frame, frame.error.server_error, frame.error.message)
                    if reply is None:
                        log.warning(
                            "%s: closing: invalid %s from client cannot be answered: %s",
                            self.name,
                            frame.name,
                            frame.error.message,
                        )
                        if out:
                            await dst.send(b"".join(out))
                        session.cancel()
                        return
                    await proxy.send_own(src, conn, reply)
                for topic, (messages, size) in topics.items():
                    metrics.topic_traffic(topic, direction, messages, size)
                if out:
                    relay_delay.observe(trio.current_time() - now)
                    if whole and decoder.buffered == 0:
                        await dst.send(data)
                    else:
                        await dst.send(out[0] if len(out) == 1 else b"".join(out))
                if not data:
                    log.info("%s: %s closed the connection", self.name, side)
                    session.cancel()
                    return
        except RemoteProtocolError as exc:
            metrics.validation_failures.labels(exc.problem.value, direction).inc()
            log.warning("%s: closing: %s sent an unframeable stream: %s", self.name, side, exc)
            session.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info("%s: connection to %s lost: %s", self.name, side, exc)
            session.cancel()

    def _count_topic(self, frame: Frame, from_client: bool, topics: dict[str, list[int]]) -> None:
        """Add a SEND's or MESSAGE's messages and bytes to its topic's tally."""
        body: Any = frame.body
        if from_client:
            topic = self.correlator.producers.get(body.producer_id)
            messages = body.num_messages
        else:
            topic = self.correlator.consumers.get(body.consumer_id)
            meta = frame.metadata
            messages = meta.num_messages_in_batch if meta is not None else 1
        if topic is None:
            return
        tally = topics.get(topic)
        if tally is None:
            topics[topic] = [messages, len(frame.raw)]
        else:
            tally[0] += messages
            tally[1] += len(frame.raw)

    def _record(self, direction: int, frame: Frame) -> None:
        self.proxy.saw(self.conn, direction == 0, frame)

    def _learn_brokers(self, frame: Frame) -> None:
        body: Any = frame.body
        if frame.type == _TOPIC_MIGRATED:
            urls = (body.brokerServiceUrl, body.brokerServiceUrlTls)
        else:
            urls = (body.assignedBrokerServiceUrl, body.assignedBrokerServiceUrlTls)
        for url in urls:
            if url:
                try:
                    self.proxy.learn_broker(parse_broker_url(url))
                except ConfigError:
                    log.warning("%s: broker named an unusable URL %r", self.name, url)

    # --- graceful drain ----------------------------------------------------

    async def drain(self, deadline: float) -> None:
        """Hand the client back to its reconnect logic without losing a send.

        Stop reading the client (what it sends meanwhile stays unreceipted,
        so it sends it again after reconnecting), let SENDs already forwarded
        get their receipts, then close its producers and consumers the way a
        broker unloading a topic does, and hang up.
        """
        self.draining = True
        if self._client_pump_scope is not None:
            self._client_pump_scope.cancel()
        while self.correlator.in_flight_sends and trio.current_time() < deadline:
            await trio.sleep(0.02)
        closes = [
            encode(
                command(
                    _CLOSE_PRODUCER, pb.CommandCloseProducer(producer_id=pid, request_id=NO_REQUEST)
                )
            )
            for pid in self.correlator.producers
        ] + [
            encode(
                command(
                    _CLOSE_CONSUMER, pb.CommandCloseConsumer(consumer_id=cid, request_id=NO_REQUEST)
                )
            )
            for cid in self.correlator.consumers
        ]
        if closes:
            with trio.move_on_at(deadline):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.proxy.send_own(self.client, self.conn, b"".join(closes))
        if self._session_scope is not None:
            self._session_scope.cancel()


def _brief(frame: Frame) -> str:
    body = loggable(frame)  # credentials never reach the log
    if body is None:
        return ""
    text: str = text_format.MessageToString(body, as_one_line=True)
    return text


_NAMES_BROKERS = frozenset({_CLOSE_PRODUCER, _CLOSE_CONSUMER, _TOPIC_MIGRATED})
