"""Lookup connections: CONNECT without ``proxy_to_broker_url``.

Sluice answers the handshake itself and forwards discovery requests (LOOKUP,
PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA) to the upstream
broker with its own request ids. Redirect answers are followed here, so the
client only ever sees one outcome. A Connect answer is rewritten so that
the client comes back through Sluice: ``proxy_through_service_url=true``,
both broker URLs set, ``authoritative=true``. The broker it names is learned
into the allow-list, since the client will ask for it next.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import trio

from sluice.protocols.pulsar import Frame, Type, command, encode, error_reply, pb
from sluice.protocols.pulsar.correlation import answer_error
from sluice.proxy.config import Address, BrokerUrl, ConfigError, parse_broker_url
from sluice.proxy.framing import FrameStream
from sluice.proxy.session import ClientSession
from sluice.proxy.upstream import PROTOCOL_VERSION, SLUICE_VERSION, UpstreamError

if TYPE_CHECKING:
    from sluice.proxy.server import Proxy

log = logging.getLogger("sluice.lookup")

LookupResponse = pb.CommandLookupTopicResponse
_FORWARDED = {
    Type.Value("LOOKUP"),
    Type.Value("PARTITIONED_METADATA"),
    Type.Value("GET_TOPICS_OF_NAMESPACE"),
    Type.Value("GET_SCHEMA"),
}
# How long one upstream request may take before the client gets an error.
REQUEST_TIMEOUT = 30.0


class LookupSession(ClientSession):
    def __init__(
        self, proxy: Proxy, client: FrameStream, connect: Frame, conn: int, name: str
    ) -> None:
        super().__init__(proxy, client, connect, conn, name)
        self._last_heard = trio.current_time()

    async def run(self) -> None:
        requested = self.connect.body.protocol_version
        connected = pb.CommandConnected(
            server_version=SLUICE_VERSION,
            protocol_version=min(requested, PROTOCOL_VERSION),
            max_message_size=self.proxy.config.max_message_size,
        )
        await self._send(encode(command(Type.Value("CONNECTED"), connected)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keepalive, nursery.cancel_scope)
            while (frame := await self.client.receive_frame()) is not None:
                self.proxy.saw(self.conn, True, frame)
                self._last_heard = trio.current_time()
                await self._dispatch(frame, nursery)
            nursery.cancel_scope.cancel()

    async def _dispatch(self, frame: Frame, nursery: trio.Nursery) -> None:
        t = frame.type
        if t == Type.Value("PING"):
            await self._send(encode(command(Type.Value("PONG"))))
            return
        if t == Type.Value("PONG"):
            return
        if frame.error is not None:
            self.proxy.note_invalid(frame, "client", self.name)
            reply = error_reply(frame, frame.error.server_error, frame.error.message)
            if reply is None:
                raise frame.error
            await self._send(reply)
            return
        if t not in _FORWARDED:
            message = f"{frame.name} is not served on a lookup connection"
            reply = error_reply(frame, pb.NotAllowedError, message)
            if reply is None:
                log.info("%s: ignoring %s on a lookup connection", self.name, frame.name)
                return
            await self._send(reply)
            return
        if not self.proxy.lookup_slots.acquire_nowait_or_false():
            self.proxy.metrics.lookups.labels("rejected").inc()
            reply = error_reply(frame, pb.TooManyRequests, "too many concurrent lookups")
            assert reply is not None
            await self._send(reply)
            return
        nursery.start_soon(self._serve, frame)

    async def _serve(self, frame: Frame) -> None:
        answer: bytes | None
        started = trio.current_time()
        self._upstream_time = 0.0
        error: int | None = None
        try:
            answer, error = await self._answer(frame)
        except UpstreamError as exc:
            log.warning("%s: %s failed: %s", self.name, frame.name, exc.message)
            answer, error = error_reply(frame, exc.error, exc.message), exc.error
            if frame.type == Type.Value("LOOKUP"):
                self.proxy.metrics.lookups.labels("failed").inc()
        finally:
            self.proxy.lookup_slots.release()
        metrics = self.proxy.metrics
        total = trio.current_time() - started
        metrics.request_done(frame.type, total, error)
        if frame.type == Type.Value("LOOKUP"):
            metrics.lookup_duration.labels("total").observe(total)
            metrics.lookup_duration.labels("upstream").observe(self._upstream_time)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if answer is not None:
                await self._send(answer)

    async def _answer(self, frame: Frame) -> tuple[bytes, int | None]:
        """The answer for the client, and the ServerError it reports (None: success)."""
        body: Any = type(frame.body)()
        body.CopyFrom(frame.body)
        client_rid = body.request_id
        if frame.type == Type.Value("LOOKUP"):
            return await self._lookup(body, client_rid)
        answer = await self._ask(self.proxy.config.broker.address, frame.type, body)
        return _with_request_id(answer, client_rid), _failure(answer)

    async def _ask(self, target: Address, type_: int, body: Any) -> Frame:
        started = trio.current_time()
        try:
            upstream = await self.proxy.upstream.get(target)
            return await upstream.request(type_, body, REQUEST_TIMEOUT)
        finally:
            self._upstream_time += trio.current_time() - started

    async def _lookup(
        self, request: pb.CommandLookupTopic, client_rid: int
    ) -> tuple[bytes, int | None]:
        target = self.proxy.config.broker.address
        lookups = self.proxy.metrics.lookups
        hops = 0
        while True:
            answer = await self._ask(target, Type.Value("LOOKUP"), request)
            result: pb.CommandLookupTopicResponse = answer.body
            if answer.type != Type.Value("LOOKUP_RESPONSE") or (
                result.response == LookupResponse.Failed
            ):
                lookups.labels("failed").inc()  # ERROR, or a failed lookup answer
                return _with_request_id(answer, client_rid), _failure(answer)
            url_text = result.brokerServiceUrl or result.brokerServiceUrlTls
            url = _url(url_text)
            if result.response == LookupResponse.Redirect:
                hops += 1
                if hops > self.proxy.config.max_redirects:
                    raise UpstreamError(
                        f"lookup of {request.topic} redirected more than "
                        f"{self.proxy.config.max_redirects} times",
                        pb.ServiceNotReady,
                    )
                lookups.labels("redirected").inc()
                self.proxy.learn_broker(url)
                target = url.address
                request.authoritative = result.authoritative
                continue
            # An upstream that is itself a proxy asks to be kept in the path.
            via = result.proxy_through_service_url
            for named in (result.brokerServiceUrl, result.brokerServiceUrlTls):
                if named:
                    self.proxy.learn_broker(_url(named), via_upstream=via)
            lookups.labels("answered").inc()
            rewritten = LookupResponse(
                request_id=client_rid,
                response=LookupResponse.Connect,
                brokerServiceUrl=result.brokerServiceUrl or url_text,
                brokerServiceUrlTls=result.brokerServiceUrlTls or url_text,
                authoritative=True,
                proxy_through_service_url=True,
            )
            return encode(command(Type.Value("LOOKUP_RESPONSE"), rewritten)), None

    async def _send(self, data: bytes) -> None:
        await self.proxy.send_own(self.client, self.conn, data)

    async def _keepalive(self, scope: trio.CancelScope) -> None:
        """Ping an idle client; hang up on one that stops answering."""
        interval = self.proxy.config.keepalive_interval
        ping = encode(command(Type.Value("PING")))
        while True:
            await trio.sleep(interval)
            idle = trio.current_time() - self._last_heard
            if idle >= 2 * interval:
                log.info("%s: client silent for %.0fs, closing", self.name, idle)
                scope.cancel()
                return
            if idle >= interval:
                await self._send(ping)


def _failure(answer: Frame) -> int | None:
    return answer_error(answer.type, answer.body)


def _url(text: str) -> BrokerUrl:
    try:
        return parse_broker_url(text, what="broker URL in lookup answer")
    except ConfigError as exc:
        raise UpstreamError(str(exc), pb.ServiceNotReady) from None


def _with_request_id(answer: Frame, request_id: int) -> bytes:
    body: Any = type(answer.body)()
    body.CopyFrom(answer.body)
    body.request_id = request_id
    return encode(command(answer.type, body))
