"""``sluice serve``: act as the broker, answering from a recording.

A live client connects to Sluice as if to a broker. Lookups point back at
Sluice itself; every other request is answered with what the broker answered
in the recording, matched by command type, topic and order, with the live
client's request, producer, consumer and sequence ids put in. Recorded
MESSAGE frames are pushed to consumers of the same topic and subscription
as FLOW permits allow. A request the recording has no answer for gets an
ERROR saying so and is listed in the report printed on exit.

It only listens: no outbound connection is ever opened.
"""

from __future__ import annotations

import argparse
import collections
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address, advertised, parse_address, parse_host
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.protocols.pulsar import (
    Frame,
    ProtocolError,
    Type,
    command,
    encode,
    encode_payload,
    error_reply,
    pb,
)
from sluice.protocols.pulsar.correlation import Correlator
from sluice.proxy.dial import TlsServerConfig, open_listeners, server_ssl_context
from sluice.proxy.pulsar import FrameStream
from sluice.recording.format import RecordingError, protocol_of
from sluice.recording.reader import Recording, load
from sluice.replay.outcome import Report

T = Type.Value
_ANSWERED_BY_SUCCESS = {T("CLOSE_PRODUCER"), T("CLOSE_CONSUMER"), T("UNSUBSCRIBE"), T("SEEK")}


DEFAULT_LISTEN = "127.0.0.1:6650"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=Path, help="a recording file or directory")
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"plain listener, where clients connect (default: {DEFAULT_LISTEN}, "
        "but none with --listen-tls)",
    )
    parser.add_argument(
        "--listen-tls",
        metavar="HOST:PORT",
        help="TLS listener, with --tls-cert and --tls-key (default: none); a Pulsar recording "
        "may be served on both, a Cursus one on one of them",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="certificate chain (PEM) for --listen-tls (default: none)",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="private key (PEM) (default: none)"
    )
    parser.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host put in lookup and metadata answers for clients to dial (default: the "
        "listen host as written, or this host's name when that is a wildcard)",
    )


@dataclass(frozen=True)
class Listening:
    """Where serve listens: plain, TLS (with its context), or both."""

    plain: Address | None
    tls: Address | None = None
    context: ssl.SSLContext | None = None
    advertise_host: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Listening:
        tls = None
        if args.listen_tls is not None:
            tls = parse_address(args.listen_tls, what="--listen-tls")
        if args.listen is not None:
            plain: Address | None = parse_address(args.listen, what="--listen")
        else:
            plain = None if tls is not None else parse_address(DEFAULT_LISTEN)
        host = None
        if args.advertise_host is not None:
            host = parse_host(args.advertise_host, what="--advertise-host")
        if tls is None:
            if args.tls_cert or args.tls_key:
                raise ConfigError("--tls-cert and --tls-key are for --listen-tls")
            return cls(plain, advertise_host=host)
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("--listen-tls needs --tls-cert and --tls-key")
        context = server_ssl_context(TlsServerConfig(args.tls_cert, args.tls_key))
        return cls(plain, tls, context, host)

    async def open(self) -> tuple[list[trio.abc.Listener[Any]], Address | None, Address | None]:
        """The listeners, and the plain and TLS addresses clients are told to dial:
        the host as written (or --advertise-host), the port as bound."""
        listeners: list[trio.abc.Listener[Any]] = []
        bound: list[Address | None] = []
        for address in (self.plain, self.tls):
            if address is None:
                bound.append(None)
                continue
            tcp = await open_listeners(address)
            port = tcp[0].socket.getsockname()[1]
            bound.append(advertised(address.host, port, self.advertise_host))
            if address is self.tls:
                assert self.context is not None
                listeners += [
                    trio.SSLListener(t, self.context, https_compatible=False) for t in tcp
                ]
            else:
                listeners += tcp
        return listeners, bound[0], bound[1]


@dataclass
class Answers:
    """The recording, indexed by what a live client will ask."""

    by_request: dict[tuple[int, str], collections.deque[Frame]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    last: dict[tuple[int, str], Frame] = field(default_factory=dict)
    receipts: dict[str, collections.deque[Frame]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    messages: dict[tuple[str, str], list[Frame]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )

    @classmethod
    def of(cls, recording: Recording) -> Answers:
        """Pair every recorded answer with its request (the one Correlator does
        the pairing) and file it under what a live client will ask."""
        index = cls()
        for conn in recording.connections:
            correlator = Correlator()
            subscriptions: dict[int, tuple[str, str]] = {}
            for rf in conn.frames:
                frame = rf.frame
                body: Any = frame.body
                if body is None:
                    continue
                if rf.from_client and frame.type == T("SUBSCRIBE"):
                    subscriptions[body.consumer_id] = (body.topic, body.subscription)
                done = correlator.observe(frame, rf.from_client, 0.0)
                if rf.from_client:
                    continue
                if frame.type == T("MESSAGE"):
                    if body.consumer_id in subscriptions:
                        index.messages[subscriptions[body.consumer_id]].append(frame)
                    continue
                if done is None:
                    continue
                if done.request_type == T("SEND"):
                    index.receipts[done.topic or ""].append(frame)
                    continue
                if done.request is None:
                    continue
                asked = (done.request_type, done.topic or _namespace(done.request))
                index.by_request[asked].append(frame)
                index.last[asked] = frame
        return index

    def answer(self, asked: tuple[int, str]) -> Frame | None:
        """The next recorded answer to this kind of request (the last one again when used up)."""
        queue = self.by_request.get(asked)
        if queue:
            return queue.popleft()
        return self.last.get(asked)


def _topic_of(
    t: int, body: Any, producers: dict[int, str], consumers: dict[int, tuple[str, str]]
) -> str:
    fields = body.DESCRIPTOR.fields_by_name
    if "topic" in fields:
        return str(body.topic)
    if "namespace" in fields:
        return str(body.namespace)
    if "producer_id" in fields:
        return producers.get(body.producer_id, "")
    if "consumer_id" in fields:
        return consumers.get(body.consumer_id, ("", ""))[0]
    return ""


def _namespace(request: Frame) -> str:
    body: Any = request.body
    return str(body.namespace) if "namespace" in body.DESCRIPTOR.fields_by_name else ""


def _with(frame: Frame, **changes: Any) -> bytes:
    """A recorded frame re-encoded with some body fields replaced."""
    assert frame.command is not None
    cmd = pb.BaseCommand()
    cmd.CopyFrom(frame.command)
    body: Any = getattr(cmd, cmd.DESCRIPTOR.fields_by_number[frame.type].name)
    for name, value in changes.items():
        setattr(body, name, value)
    if frame.metadata is None:
        return encode(cmd, max_message_size=2**31 - 1)
    meta = frame.raw[frame.metadata_offset + 4 : frame.payload_offset]
    return encode_payload(
        cmd,
        meta,
        bytes(frame.payload),
        checksum=frame.checksum is not None,
        max_message_size=2**31 - 1,
    )


class Consumer:
    def __init__(self, topic: str, messages: list[Frame]) -> None:
        self.topic = topic
        self.queue = collections.deque(messages)
        self.permits = 0


class StubBroker:
    """Lookups point at ``url`` and ``url_tls`` (either may be empty)."""

    def __init__(self, answers: Answers, url: str, url_tls: str = "") -> None:
        self.answers = answers
        self.url = url
        self.url_tls = url_tls
        self.report = Report()

    async def handle(self, stream: trio.abc.Stream) -> None:
        conn = FrameStream(stream, 2**31 - 1)
        producers: dict[int, str] = {}
        consumers: dict[int, Consumer] = {}
        try:
            while (frame := await conn.receive_frame()) is not None:
                reply = self._answer(frame, producers, consumers)
                if reply:
                    await conn.send(reply)
                if frame.type in (T("FLOW"), T("SUBSCRIBE")):
                    await self._push(conn, consumers)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError):
            pass

    def _answer(
        self, frame: Frame, producers: dict[int, str], consumers: dict[int, Consumer]
    ) -> bytes:
        body: Any = frame.body
        t = frame.type
        if body is None:
            return b""
        if t == T("CONNECT"):
            connected = pb.CommandConnected(
                server_version="sluice-serve", protocol_version=min(body.protocol_version, 21)
            )
            return encode(command(T("CONNECTED"), connected))
        if t == T("PING"):
            return encode(command(T("PONG")))
        if t in (T("PONG"), T("ACK")) and not (t == T("ACK") and body.HasField("request_id")):
            return b""
        if t == T("FLOW"):
            if body.consumer_id in consumers:
                consumers[body.consumer_id].permits += body.messagePermits
            return b""
        if t == T("REDELIVER_UNACKNOWLEDGED_MESSAGES"):
            return b""
        self.report.requests += 1
        if t == T("SEND"):
            return self._send(frame, producers)
        consumer_topics = {cid: (c.topic, "") for cid, c in consumers.items()}
        topic = _topic_of(t, body, producers, consumer_topics)
        if t == T("LOOKUP"):
            recorded = self.answers.answer((t, body.topic))
            if (
                recorded is not None
                and recorded.body.response == pb.CommandLookupTopicResponse.Failed
            ):
                return _with(recorded, request_id=body.request_id)
            answer = pb.CommandLookupTopicResponse(request_id=body.request_id, authoritative=True)
            if self.url:
                answer.brokerServiceUrl = self.url
            if self.url_tls:
                answer.brokerServiceUrlTls = self.url_tls
            answer.response = answer.Connect
            return encode(command(T("LOOKUP_RESPONSE"), answer))
        recorded = self.answers.answer((t, topic))
        if recorded is None and t in _ANSWERED_BY_SUCCESS:
            return encode(command(T("SUCCESS"), pb.CommandSuccess(request_id=body.request_id)))
        if recorded is None:
            return self._unmatched(frame, f"{frame.name} {topic}".strip())
        if t == T("PRODUCER"):
            producers[body.producer_id] = body.topic
        elif t == T("SUBSCRIBE") and recorded.type == T("SUCCESS"):
            recorded_messages = self.answers.messages.get((body.topic, body.subscription), [])
            consumers[body.consumer_id] = Consumer(body.topic, recorded_messages)
        changes: dict[str, Any] = {"request_id": body.request_id}
        if t == T("ACK"):
            changes["consumer_id"] = body.consumer_id
        return _with(recorded, **changes)

    def _send(self, frame: Frame, producers: dict[int, str]) -> bytes:
        body: Any = frame.body
        topic = producers.get(body.producer_id, "")
        queue = self.answers.receipts.get(topic)
        if not queue:
            return self._unmatched(frame, f"SEND {topic} (no more recorded receipts)")
        recorded = queue.popleft()
        changes = {"producer_id": body.producer_id, "sequence_id": body.sequence_id}
        if recorded.type == T("SEND_RECEIPT") and body.HasField("highest_sequence_id"):
            changes["highest_sequence_id"] = body.highest_sequence_id
        return _with(recorded, **changes)

    def _unmatched(self, frame: Frame, what: str) -> bytes:
        self.report.unmatched.append(what)
        message = f"sluice serve: the recording has no answer for {what}"
        reply = error_reply(frame, pb.UnknownError, message)
        return reply.raw if reply is not None else b""

    async def _push(self, conn: FrameStream, consumers: dict[int, Consumer]) -> None:
        for consumer_id, consumer in consumers.items():
            out = []
            while consumer.queue and consumer.permits > 0:
                message = consumer.queue.popleft()
                meta = message.metadata
                consumer.permits -= meta.num_messages_in_batch if meta is not None else 1
                out.append(_with(message, consumer_id=consumer_id))
            if out:
                self.report.pushed += len(out)
                await conn.send(b"".join(out))


async def serve(recording: Path, listening: Listening) -> Report:
    """Answer Pulsar clients from ``recording`` until SIGINT or SIGTERM."""
    answers = Answers.of(load(recording))
    listeners, plain, tls = await listening.open()
    stub = StubBroker(
        answers, f"pulsar://{plain}" if plain else "", f"pulsar+ssl://{tls}" if tls else ""
    )
    urls = " and ".join(url for url in (stub.url, stub.url_tls) if url)
    announce(f"a broker on {urls}", recording)
    await until_signalled(stub.handle, listeners)
    return stub.report


def announce(what: str, recording: Path) -> None:
    print(f"[serve] answering as {what} from {recording}; Ctrl-C to stop",
          file=sys.stderr, flush=True)  # fmt: skip


async def until_signalled(
    handler: Callable[[Any], Awaitable[None]], listeners: list[trio.abc.Listener[Any]]
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


def run(args: argparse.Namespace) -> int:
    try:
        listening = Listening.from_args(args)
    except ConfigError as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    try:
        spec = registry.get(protocol_of(args.recording))
        if spec.serve is None:
            raise ConfigError(f"{spec.title} recordings cannot be served")
        report: Report = trio.run(spec.load(spec.serve), args.recording, listening)
    except (RecordingError, ConfigError) as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = " and ".join(str(a) for a in (listening.plain, listening.tls) if a is not None)
        print(f"sluice serve: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(
        f"served {report.requests} requests, pushed {report.pushed} messages, "
        f"{len(report.unmatched)} without a recorded answer"
    )
    for what in report.unmatched:
        print(f"  no recorded answer: {what}")
    return 0 if not report.unmatched else 1
