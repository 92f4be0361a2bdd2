"""Pulsar's ``sluice replay`` and ``sluice serve`` (the registry names them).

Replay. Every recorded client connection becomes a connection to the target
(lookup and proxied connections alike; through a proxy, a proxied CONNECT
names the broker the live lookups named), and its client frames are
sent in recorded order, deterministic by causality rather than the clock:
before a client frame goes out, the answers it could have depended on have
arrived live — every request answer recorded before it on any connection,
and every broker frame recorded before it on its own connection. Waits are
bounded (``--timeout``); what never comes is reported as missing, and
costs one timeout, not one per frame: a connection whose wait ran out is not
waited on again until it speaks or replay sends anything but an ACK (on any
connection), and one the broker closed is not waited on at all.

Values the broker chooses are remapped as they become known: message ids
(receipts, deliveries), generated producer names and schema versions, so
ACK, SEEK, REDELIVER, readers' start positions and SEND metadata carry the
live values.

Every broker frame is compared with its recorded counterpart after
normalisation (message ids, producer names, server version, broker URLs,
lookup flags a proxy sets, broker timestamps). Exit status: 0 equivalent,
1 diverged, 2 usage or connection errors.

Serve. A live client connects to Sluice as if to a broker. Lookups point back at
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
import collections.abc
import hashlib
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from google.protobuf import text_format

from sluice.addresses import Address
from sluice.errors import ConfigError
from sluice.protocols.pulsar import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Frame,
    ProtocolError,
    RemoteProtocolError,
    Type,
    command,
    decode_frame,
    encode,
    encode_payload,
    error_reply,
    pb,
)
from sluice.protocols.pulsar.connection import NO_REQUEST
from sluice.protocols.pulsar.correlation import Correlator, answer_key
from sluice.protocols.pulsar.filtering import last_sequence
from sluice.protocols.pulsar.redact import loggable, scrub
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.dial import (
    TlsClientConfig,
    client_ssl_context,
    dial,
)
from sluice.proxy.pulsar import FrameStream
from sluice.recording.reader import RecordedConnection, RecordedFrame, Recording, load
from sluice.replay.common import (
    Listening,
    Outbound,
    Pace,
    ReplayError,
    Withheld,
    Withholding,
    announce,
    cannot_reach,
    close_due,
    nothing_to_replay,
    parse_speed,
    until_signalled,
)
from sluice.replay.outcome import (
    Outcome,
    Report,
    incomplete_notes,
    is_broker_only,
    not_replayable_transcript,
)

T = Type.Value
Key = tuple[Any, ...]
_PUSH_BY_ID: dict[int, str] = {
    T("CLOSE_PRODUCER"): "producer_id",
    T("CLOSE_CONSUMER"): "consumer_id",
    T("ACTIVE_CONSUMER_CHANGE"): "consumer_id",
    T("REACHED_END_OF_TOPIC"): "consumer_id",
}
_IGNORED = {T("PING"), T("PONG")}


class Keyer:
    """Gives each broker frame of one connection its pairing key."""

    def __init__(self) -> None:
        self._counts: collections.Counter[Key] = collections.Counter()
        # (consumer id, message id) of every MESSAGE so far on this connection.
        self._delivered: set[tuple[int, int, int, int, int]] = set()

    def __call__(self, frame: Frame) -> Key | None:
        t = frame.type
        if t in _IGNORED:
            return None
        body: Any = frame.body
        if body is None:
            return self._nth(("raw", t))
        if t == T("CONNECTED"):
            return ("CONNECTED",)
        if t in _PUSH_BY_ID:
            return self._nth((t, getattr(body, _PUSH_BY_ID[t])))
        answers = answer_key(frame)  # the correlator's own matching rule
        if answers is not None:
            # The chunks of a chunked message share one sequence id: receipts
            # pair with sends by order within it.
            return self._nth(answers) if answers[0] == "send" else answers
        if t == T("MESSAGE"):
            mid = body.message_id
            seen = (body.consumer_id, mid.ledgerId, mid.entryId, mid.partition, mid.batch_index)
            if seen in self._delivered:
                # Sent to this consumer before: a redelivery. Whether and when a
                # broker redelivers depends on timing (pulsar-lite does it under
                # load), so redeliveries are counted apart from the deliveries
                # paired by order, and nothing waits for them.
                return self._nth((AGAIN, body.consumer_id))
            self._delivered.add(seen)
            return self._nth(("msg", body.consumer_id))
        return self._nth((t,))

    def _nth(self, base: Key) -> Key:
        self._counts[base] += 1
        return (*base, self._counts[base])


AGAIN = "again"  # the first element of a redelivered MESSAGE's key
# The kind of a connection the recording proxy refused at the handshake.
REFUSED = "invalid"


def is_answer(key: Key) -> bool:
    return key[0] in ("rid", "send", "CONNECTED")


def _request_key(frame: Frame) -> tuple[Any, ...] | None:
    """What the answer to a client frame is keyed by (``answer_key``'s rule)."""
    body: Any = frame.body
    if body is None:
        return None
    if frame.type == T("SEND"):
        return ("send", body.producer_id, body.sequence_id)
    if "request_id" in body.DESCRIPTOR.fields_by_name and body.HasField("request_id"):
        return ("rid", body.request_id)
    return None


def _answers(request: Frame, reply: Frame) -> bool:
    """Whether ``reply`` answers ``request`` (the correlator's matching
    rule). A SEND_RECEIPT or SEND_ERROR answers the SEND whose sequence ids
    (its own up to a batch's highest) hold its sequence id: Sluice answers a
    Java batch it refused by the highest, as the broker does."""
    want = _request_key(request)
    if want is None:
        return False
    got = answer_key(reply)
    if got is None or got[0] != "send" or want[0] != "send":
        return got == want
    send: Any = request.body
    answer: Any = reply.body
    return bool(answer.producer_id == send.producer_id
                and send.sequence_id <= answer.sequence_id <= last_sequence(send))  # fmt: skip


def _answerable(request: Frame) -> bool:
    return _request_key(request) is not None


@dataclass(frozen=True)
class Answered(Withheld):
    """A Pulsar connection's ``Withheld``, knowing of the held client
    frames those the recording proxy answered itself (``answered``: an
    invalid frame refused, an id already open, a schema it could not learn,
    its own credentials refresh), not a fault rule or filter."""

    answered: frozenset[int] = frozenset()


def answered_itself(withheld: Withheld) -> frozenset[int]:
    """The held client frames the recording proxy answered itself."""
    return withheld.answered if isinstance(withheld, Answered) else frozenset()


def withheld_of(conn: RecordedConnection) -> Withheld:
    """What the recording proxy kept from the broker on ``conn``
    (``Withheld``): what fault rules dropped or answered, what message
    filters refused (answered SEND_ERROR by Sluice), and the SENDs a filter
    changed, as the broker got them."""
    claims = Withholding(conn, _answers, _answerable).faults()
    sent: dict[int, Frame] = {}
    for note in conn.filters:
        # The SEND it acted on was recorded before it, with its read.
        sends = [rf for rf in reversed(conn.frames[: note.position])
                 if rf.from_client and rf.frame.type == T("SEND")]  # fmt: skip
        if note.sent is not None:
            frame = decode_frame(note.sent)
            want = _request_key(frame)
            changed = next((rf for rf in sends if _request_key(rf.frame) == want), None)
            if changed is not None:
                sent[changed.index] = frame
        elif note.action == "rejected" or (note.action, note.reason) == ("error", "closed"):
            # Refused: answered by Sluice (SEND_ERROR), never sent on.
            after = conn.frames[note.position].index if note.position < len(conn.frames) else 0
            for rf in sends:
                if rf.index in claims.held:
                    continue
                answer = claims.answer_after(rf, after)
                if answer is not None and answer.frame.type == T("SEND_ERROR"):
                    claims.held.add(rf.index)
                    claims.injected.add(answer.index)
                    break
    answered = _own_frames(conn, claims)
    done = claims.done(sent)
    return Answered(done.held, done.injected, done.sent, frozenset(answered))


# Frames Sluice writes on its own initiative, answering no request of the
# client's: a drain's closes (a broker unloading the topic sends such, but
# then its own, recorded as the broker's) and a credentials refresh's
# challenge (a broker asks on its own clock, not at the recording's moment).
_UNPROMPTED = frozenset({T("CLOSE_PRODUCER"), T("CLOSE_CONSUMER"), T("AUTH_CHALLENGE")})


def _own_frames(conn: RecordedConnection, claims: Withholding) -> set[int]:
    """Claim the frames Sluice wrote to the client itself (recorded ``own``)
    that no live broker would send to what replay sends it, once fault
    rules and filters claimed theirs; the client frames held for them.

    - CLOSE_PRODUCER, CLOSE_CONSUMER (a drain) and AUTH_CHALLENGE (a
      refresh of credentials): not expected; the client's AUTH_RESPONSE to
      such a challenge (Sluice's to verify, never passed on) is not sent.
    - An ERROR answering no request: Sluice's refusal at the handshake or on
      expired credentials (the broker would have answered CONNECT with
      CONNECTED): not expected.
    - On a proxied connection, an answer to a client request: Sluice
      answered it instead of sending it on (an invalid frame rejected, an id
      already open, a filter that could not learn the schema): the request
      is not sent, its answer not expected.
    - On a lookup connection Sluice answers CONNECT, lookups and what it
      refuses there itself; replay connects straight to the broker, which
      answers them in kind: still expected (and compared).
    - PING and PONG: never compared, whoever sent them.
    """
    proxied = conn.kind != "lookup"
    kept = [rf for rf in conn.frames if rf.from_client and rf.index not in claims.held]
    held: set[int] = set()
    for rf in conn.frames:
        if rf.from_client or not rf.summary.get("own") or rf.index in claims.injected:
            continue
        frame = rf.frame
        if frame.type in _UNPROMPTED:
            claims.injected.add(rf.index)
            if frame.type == T("AUTH_CHALLENGE"):
                response = _auth_response_to(conn, kept, rf)
                if response is not None:
                    kept.remove(response)
                    held.add(response.index)
            continue
        key = answer_key(frame) if frame.body is not None else None
        if frame.type == T("ERROR") and key == ("rid", NO_REQUEST):
            claims.injected.add(rf.index)
        elif proxied and key is not None and key[0] in ("rid", "send"):
            claims.injected.add(rf.index)
            request = _answered_request(conn, kept, rf)
            if request is not None:
                kept.remove(request)
                held.add(request.index)
    claims.held |= held
    return held


def _auth_response_to(
    conn: RecordedConnection, kept: list[RecordedFrame], challenge: RecordedFrame
) -> RecordedFrame | None:
    """The client's AUTH_RESPONSE to Sluice's own ``challenge``, not yet
    claimed: its next one, unless a broker's AUTH_CHALLENGE came first (that
    one it answers). Sluice verifies it and never passes it on."""
    unclaimed = {c.index for c in kept}
    for rf in conn.frames:
        if rf.index <= challenge.index or rf.frame.type not in _AUTH_FRAMES:
            continue
        if rf.from_client:
            return rf if rf.index in unclaimed else None
        if not rf.summary.get("own"):
            return None  # the broker asked: the next answer is the broker's
    return None


_AUTH_FRAMES = frozenset({T("AUTH_CHALLENGE"), T("AUTH_RESPONSE")})


def _answered_request(
    conn: RecordedConnection, kept: list[RecordedFrame], answer: RecordedFrame
) -> RecordedFrame | None:
    """The client request Sluice's own ``answer`` answers, not yet claimed:
    the latest before it; else one recorded right after it, in the rest of
    the read it came in (recordings made before the request was recorded
    ahead of Sluice's answer to an id open elsewhere), up to the broker's
    next frame."""
    frame = answer.frame
    before = next((c for c in reversed(kept)
                   if c.index < answer.index and _answers(c.frame, frame)), None)  # fmt: skip
    if before is not None:
        return before
    unclaimed = {c.index for c in kept}
    for rf in conn.frames:
        if rf.index <= answer.index:
            continue
        if not rf.from_client:
            if rf.summary.get("own"):
                continue  # Sluice's answers to the read's other frames
            return None
        if rf.index in unclaimed and _answers(rf.frame, frame):
            return rf
    return None


# --- normalisation -------------------------------------------------------------


def _clear_ids(message: Any) -> None:
    """Blank every ledger/entry id inside ``message`` (they differ per broker)."""
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        items = value if descriptor.is_repeated else [value]
        for item in items:
            if descriptor.message_type.name == "MessageIdData":
                item.ledgerId = 0
                item.entryId = 0
            _clear_ids(item)


# CONSUMER_STATS_RESPONSE fields that differ from run to run whatever the broker does.
_MEASURED = ("msgRateOut", "msgThroughputOut", "msgRateRedeliver", "msgRateExpired",
             "messageAckRate", "address", "connectedSince")  # fmt: skip


_TXN = ("txnid_most_bits", "txnid_least_bits")  # a transaction's id, chosen by the broker


def _txn_of(message: Any) -> tuple[int, int] | None:
    """The transaction id ``message`` (a command body or metadata) names, if any."""
    fields = message.DESCRIPTOR.fields_by_name
    if "txnid_least_bits" not in fields or not message.HasField("txnid_least_bits"):
        return None
    return message.txnid_most_bits, message.txnid_least_bits  # most bits: 0 when left out


def _clear_txn(message: Any) -> None:
    """Blank the transaction id in ``message`` (the coordinator numbers them)."""
    if message is not None and _txn_of(message) is not None:
        for name in _TXN:
            message.ClearField(name)


def normalise(frame: Frame) -> str:
    """A frame as comparable text: broker-chosen values blanked."""
    if frame.command is None:
        return f"{frame.name} <{len(frame.raw)} bytes>"
    cmd = pb.BaseCommand()
    body_source = loggable(frame)  # never put credentials in a transcript
    cmd.type = frame.command.type
    from sluice.protocols.pulsar.frame import BODY_FIELD

    field_name = BODY_FIELD[frame.type]
    body: Any = getattr(cmd, field_name)
    if body_source is not None:
        body.CopyFrom(body_source)
    t = frame.type
    _clear_ids(cmd)
    if t == T("CONNECTED"):
        body.ClearField("server_version")
        body.ClearField("protocol_version")
        body.ClearField("max_message_size")
        body.ClearField("feature_flags")
    elif t == T("PRODUCER_SUCCESS"):
        body.producer_name = "<producer>"
        body.ClearField("schema_version")
    elif t in (T("LOOKUP_RESPONSE"), T("TOPIC_MIGRATED")):
        # Which URL fields are set is a proxy's choice (Sluice sets both).
        named = body.HasField("brokerServiceUrl") or body.HasField("brokerServiceUrlTls")
        body.ClearField("brokerServiceUrlTls")
        body.ClearField("brokerServiceUrl")
        if named:
            body.brokerServiceUrl = "<broker>"
        if t == T("LOOKUP_RESPONSE"):
            body.ClearField("proxy_through_service_url")
            body.ClearField("authoritative")
    elif t == T("PRODUCER") and not body.user_provided_producer_name:
        body.ClearField("producer_name")
    elif t in (T("GET_SCHEMA_RESPONSE"), T("GET_OR_CREATE_SCHEMA_RESPONSE")):
        body.ClearField("schema_version")  # the registry numbers versions
    elif t == T("CONSUMER_STATS_RESPONSE"):
        # Rates measured over the broker's last interval, the client's
        # address (its port is new each run) and when it connected.
        for name in _MEASURED:
            body.ClearField(name)
    _clear_txn(body)
    text = text_format.MessageToString(cmd, as_one_line=True)
    meta = frame.metadata
    if meta is not None:
        m = pb.MessageMetadata()
        m.CopyFrom(meta)
        m.producer_name = "<producer>"
        m.ClearField("schema_version")
        # As recorded: a live broker's messages carry the credentials the
        # recording left out (and a transcript keeps none).
        scrub(m.properties)
        _clear_txn(m)
        text += " | " + text_format.MessageToString(m, as_one_line=True)
        text += f" | payload sha256:{hashlib.sha256(frame.payload).hexdigest()[:16]}"
    return text


# --- remapping -------------------------------------------------------------------


@dataclass
class Remap:
    message_ids: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    producer_names: dict[str, str] = field(default_factory=dict)
    schema_versions: dict[bytes, bytes] = field(default_factory=dict)
    # Transaction ids (most, least bits) the coordinator gave, recorded -> live.
    txn_ids: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # Recorded broker address -> the live one, from lookup answers that said
    # ``proxy_through_service_url``: --broker is a proxy (Pulsar's or Sluice).
    proxied_brokers: dict[Address, Address] = field(default_factory=dict)

    def learn(self, recorded: Frame, live: Frame) -> None:
        r: Any = recorded.body
        l_: Any = live.body
        if r is None or l_ is None or recorded.type != live.type:
            return
        for name in ("message_id", "last_message_id"):
            if name in r.DESCRIPTOR.fields_by_name and r.HasField(name) and l_.HasField(name):
                a, b = getattr(r, name), getattr(l_, name)
                self.message_ids[(a.ledgerId, a.entryId)] = (b.ledgerId, b.entryId)
        if recorded.type == T("LOOKUP_RESPONSE") and l_.proxy_through_service_url:
            for name in ("brokerServiceUrl", "brokerServiceUrlTls"):
                if r.HasField(name) and l_.HasField(name):
                    self.proxied_brokers[_address(getattr(r, name))] = _address(getattr(l_, name))
        if recorded.type == T("GET_OR_CREATE_SCHEMA_RESPONSE") and r.HasField("schema_version"):
            self.schema_versions[r.schema_version] = l_.schema_version
        if recorded.type == T("NEW_TXN_RESPONSE"):
            was, now = _txn_of(r), _txn_of(l_)
            if was is not None and now is not None:
                self.txn_ids[was] = now
        if recorded.type == T("PRODUCER_SUCCESS"):
            self.producer_names[r.producer_name] = l_.producer_name
            if r.HasField("schema_version"):
                self.schema_versions[r.schema_version] = l_.schema_version

    def _ids(self, message: Any) -> bool:
        changed = False
        for descriptor, value in message.ListFields():
            if descriptor.message_type is None:
                continue
            for item in value if descriptor.is_repeated else [value]:
                if descriptor.message_type.name == "MessageIdData":
                    live = self.message_ids.get((item.ledgerId, item.entryId))
                    if live is not None and live != (item.ledgerId, item.entryId):
                        item.ledgerId, item.entryId = live
                        changed = True
                changed |= self._ids(item)
        return changed

    def _txn(self, message: Any) -> bool:
        """Put the live transaction id in ``message`` for a recorded one."""
        was = _txn_of(message)
        now = self.txn_ids.get(was) if was is not None else None
        if now is None or now == was:
            return False
        message.txnid_most_bits, message.txnid_least_bits = now
        return True

    def client_frame(self, frame: Frame) -> bytes:
        """The bytes to send for a recorded client frame, with live values."""
        if frame.command is None:
            return frame.raw
        cmd = pb.BaseCommand()
        cmd.CopyFrom(frame.command)
        changed = self._ids(cmd)
        body: Any = frame.body and getattr(cmd, cmd.DESCRIPTOR.fields_by_number[frame.type].name)
        if body is not None:
            changed |= self._txn(body)
        if frame.type == T("CONNECT") and body.HasField("proxy_to_broker_url"):
            # Through a proxy: the broker its lookups named live. Straight to
            # a broker: none (a broker would take it for a proxy's CONNECT).
            live = self.proxied_brokers.get(_address(body.proxy_to_broker_url))
            if live is None:
                body.ClearField("proxy_to_broker_url")
            else:
                body.proxy_to_broker_url = str(live)  # host:port, as clients send it
            changed = True
        if frame.type == T("GET_SCHEMA") and body.schema_version in self.schema_versions:
            body.schema_version = self.schema_versions[body.schema_version]
            changed = True
        if frame.type == T("PRODUCER") and body.producer_name in self.producer_names:
            body.producer_name = self.producer_names[body.producer_name]
            changed = True
        meta = frame.metadata
        if meta is not None:
            new_meta = pb.MessageMetadata()
            new_meta.CopyFrom(meta)
            if meta.producer_name in self.producer_names:
                new_meta.producer_name = self.producer_names[meta.producer_name]
            if meta.HasField("schema_version") and meta.schema_version in self.schema_versions:
                new_meta.schema_version = self.schema_versions[meta.schema_version]
            self._txn(new_meta)
            if changed or new_meta != meta:
                return encode_payload(
                    cmd,
                    new_meta,
                    bytes(frame.payload),
                    checksum=frame.checksum is not None,
                    max_message_size=2**31 - 1,
                )
            return frame.raw
        return encode(cmd, max_message_size=2**31 - 1) if changed else frame.raw


def _address(url: str | bytes) -> Address:
    """A broker URL's or a bare ``host:port``'s address (host lowercased).
    Protobuf hands a string field that is not UTF-8 (a damaged recording, a
    broker's bytes) over as bytes: no address either."""
    if not isinstance(url, str):
        return Address(repr(url), 0)  # never equal to a real one
    try:
        parsed = parse_broker_url(url)
    except ConfigError:
        return Address(url, 0)  # never equal to a real one
    return Address(parsed.host.lower(), parsed.port)


# --- the run -----------------------------------------------------------------------


class Live:
    """One live connection standing in for a recorded one."""

    def __init__(
        self, recorded: RecordedConnection, stream: FrameStream, withheld: Withheld
    ) -> None:
        self.recorded = recorded
        self.stream = stream
        self.keyer = Keyer()
        self.arrived: dict[Key, Frame] = {}
        self.events: dict[Key, trio.Event] = collections.defaultdict(trio.Event)
        self.unexpected: list[Frame] = []
        self.redelivered = 0  # live redeliveries, counted, not compared
        self.last_arrival = trio.current_time()
        self.ended = False  # the broker closed it (or it broke): nothing more will come
        # A wait on it ran out, and since then nothing has come on it and
        # nothing has been sent that could make the broker speak (``stir``).
        self.quiet = False
        self._waiting: trio.CancelScope | None = None
        # Sending on it and closing it, bounded by --timeout.
        self.out = Outbound(stream.send, stream.aclose)
        self.expected: dict[Key, RecordedFrame] = {}
        self.withheld = withheld
        keyer = Keyer()
        self.keys: dict[int, Key] = {}  # recorded frame index -> key
        for rf in recorded.frames:
            if not rf.from_client and rf.index not in self.withheld.injected:
                key = keyer(rf.frame)
                if key is not None:
                    self.keys[rf.index] = key
                    if key[0] != AGAIN:
                        self.expected[key] = rf

    async def read(self, remap: Remap) -> None:
        spoke = False  # a frame came: what answers is a Pulsar broker
        try:
            while (frame := await self.stream.receive_frame()) is not None:
                spoke = True
                if frame.type == T("PING"):
                    await self.stream.send(encode(command(T("PONG"))))
                    continue
                self.quiet = False
                key = self.keyer(frame)
                if key is None:
                    continue
                if key[0] == AGAIN:
                    self.redelivered += 1
                elif key in self.expected and key not in self.arrived:
                    self.last_arrival = trio.current_time()
                    self.arrived[key] = frame
                    remap.learn(self.expected[key].frame, frame)
                    self.events[key].set()
                else:
                    self.unexpected.append(frame)
        except ProtocolError as exc:
            if not spoke:  # not a divergence: the address is not a Pulsar broker's
                raise ReplayError(f"the broker does not speak the Pulsar protocol: {exc}") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.ended = True
            if self._waiting is not None:
                self._waiting.cancel()

    async def wait(self, key: Key, timeout: float) -> bool:
        """Wait up to ``timeout`` for the broker frame ``key``, less if the
        connection ends meanwhile; whether it has come."""
        event = self.events[key]
        if not event.is_set() and not self.ended:
            with trio.move_on_after(timeout) as self._waiting:
                await event.wait()
            self._waiting = None
        return event.is_set()


def stir(lives: collections.abc.Iterable[Live], sent: Frame) -> None:
    """A client frame went out. Anything but an acknowledgement (which the
    broker does not answer) may make the broker speak again, on any
    connection (a SEND on one is a MESSAGE on another): waits are worth
    their timeout again everywhere."""
    if sent.type != T("ACK"):
        for live in lives:
            live.quiet = False


async def replay(args: argparse.Namespace, say: Any) -> tuple[Outcome, list[str]]:
    recording = load(args.recording)
    broker = parse_broker_url(args.broker, what="--broker")
    tls = client_ssl_context(TlsClientConfig(ca=args.broker_tls_ca)) if broker.tls else None
    speed = parse_speed(args.speed)
    remap = Remap()
    outcome = Outcome.of(recording)
    # Connections the recording proxy refused at the handshake (their first
    # frame was no valid CONNECT) never reached a broker: what they were
    # answered was the proxy's, so they are not replayed nor compared.
    replayed = [conn for conn in recording.connections if conn.kind != REFUSED]
    outcome.refused = [conn.name for conn in recording.connections if conn.kind == REFUSED]
    withheld = {conn.key: withheld_of(conn) for conn in replayed}
    lives: dict[tuple[str, int], Live] = {}
    client_frames = sorted(
        ((conn, rf) for conn in replayed for rf in conn.frames if rf.from_client),
        key=lambda item: item[1].index,
    )
    # Every broker frame, by capture position, to know what preceded a client frame.
    broker_frames = sorted(
        ((conn, rf) for conn in replayed for rf in conn.frames if not rf.from_client),
        key=lambda item: item[1].index,
    )
    if not client_frames:
        raise nothing_to_replay(args.recording, outcome.refused, recording.http, recording.ws,
                                outcome.not_replayable)  # fmt: skip
    say(f"replaying {len(replayed)} connections, {len(client_frames)} client frames "
        f"against {broker}")  # fmt: skip
    # Connections the recording shows closed, in the order they were: each
    # is closed when the replay gets there (a client that went away, a
    # broker that hung up), not kept open to the end.
    closes = sorted((conn.closed_at, conn.key) for conn in replayed if conn.closed_at is not None)
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        waited = 0
        closed = 0
        pace = Pace(speed)
        for done, (conn, rf) in enumerate(client_frames, start=1):
            closed = await close_due(closes, closed, rf.index, lives,
                                     partial(_close_as_recorded, timeout=args.timeout))  # fmt: skip
            live = lives.get(conn.key)
            if live is None:
                try:
                    raw = await dial(broker.address, timeout=args.timeout, tls=tls)
                except OSError as exc:
                    raise cannot_reach(broker.address, exc) from None
                live = Live(conn, FrameStream(raw, 2**31 - 1), withheld[conn.key])
                lives[conn.key] = live
                nursery.start_soon(live.read, remap)
            # Wait for what this frame could have depended on.
            while waited < len(broker_frames) and broker_frames[waited][1].index < rf.index:
                dep_conn, dep = broker_frames[waited]
                waited += 1
                dep_live = lives.get(dep_conn.key)
                key = dep_live.keys.get(dep.index) if dep_live else None
                if dep_live is None or key is None or key[0] == AGAIN:
                    continue
                if dep_conn.key != conn.key and not is_answer(key):
                    continue
                if dep_live.quiet:
                    continue  # silent since a wait ran out: this will not come either
                if not await dep_live.wait(key, args.timeout) and not dep_live.ended:
                    outcome.waits_timed_out += 1
                    dep_live.quiet = True
            await pace.next(rf.wall_ns)
            if rf.index in live.withheld.held:
                # Kept from the broker when recorded: by a fault rule or
                # filter, or answered by the recording proxy itself.
                outcome.withheld += 1
                if rf.index in answered_itself(live.withheld):
                    outcome.answered_itself += 1
                continue
            data = remap.client_frame(live.withheld.sent.get(rf.index, rf.frame))
            failed = await live.out.send(data, args.timeout)
            if failed:
                say(f"{conn.name}: {failed}")
            stir(lives.values(), rf.frame)
            if failed is None:
                outcome.sent += 1
            if done % 500 == 0:
                say(
                    f"{done}/{len(client_frames)} client frames sent "
                    f"({time.monotonic() - started:.1f} s)"
                )
        await _the_rest(list(lives.values()), args.timeout)
        await trio.sleep(0.2)  # a moment for anything unexpected
        for live in lives.values():
            await live.out.close(args.timeout)
        nursery.cancel_scope.cancel()
    return outcome, compare(recording, lives, outcome, withheld)


async def _close_as_recorded(live: Live, timeout: float) -> None:
    """Close a connection where the recording shows it closed, once what it
    was answered before it (all that was recorded on it) has come, or a wait
    for it ran out."""
    for key in live.expected:
        if live.ended or not await live.wait(key, timeout):
            break
    await live.out.close(timeout)


async def _the_rest(lives: list[Live], timeout: float) -> None:
    """Wait for the broker frames still expected after the last client frame,
    until all have come or none has for ``timeout`` seconds: frames that
    never come cost one timeout in all, not one each."""
    for live in lives:
        for key in live.expected:
            while not await live.wait(key, timeout):
                if live.ended:
                    break  # nothing more comes on this one
                quiet = trio.current_time() - max(other.last_arrival for other in lives)
                if quiet >= timeout:
                    return


def compare(
    recording: Recording,
    lives: dict[tuple[str, int], Live],
    outcome: Outcome,
    withheld: dict[tuple[str, int], Withheld] | None = None,
) -> list[str]:
    transcript: list[str] = []
    for conn in recording.connections:
        if conn.kind == REFUSED:
            transcript.append(f"{conn.name} ~~~ REFUSED BY THE RECORDING PROXY AT THE HANDSHAKE "
                              "(never reached a broker): not replayed")  # fmt: skip
            transcript += [f"{conn.name} {'C→B' if rf.from_client else 'B→C'} NOT REPLAYED "
                           f"{normalise(rf.frame)}" for rf in conn.frames]  # fmt: skip
            continue
        if is_broker_only(conn):
            # Nothing was sent on it, so nothing came: not compared, and said.
            transcript += not_replayable_transcript(recording, conn, normalise)
            outcome.faults += len(conn.faults)
            continue
        live = lives.get(conn.key)
        faults = list(conn.faults)
        notes = incomplete_notes(recording, conn)
        for rf in conn.frames:
            # Injected when recorded: kept in the transcript next to the frames
            # they touched, so their anomalies are not taken for the broker's.
            while faults and faults[0].index <= rf.index + 1:
                transcript.append(f"{conn.name} ~~~ {faults.pop(0).describe()} (when recorded)")
                outcome.faults += 1
            while notes and notes[0][0] <= rf.index:
                transcript.append(notes.pop(0)[1])
            arrow = "C→B" if rf.from_client else "B→C"
            kept = (withheld or {}).get(conn.key) or Withheld()
            if rf.index in kept.held:
                held = (
                    "the recording proxy answered it itself: the broker never got it"
                    if rf.index in answered_itself(kept)
                    else "a fault rule or filter kept it from the broker when recorded"
                )
                transcript.append(f"{conn.name} {arrow} NOT SENT ({held}) {normalise(rf.frame)}")
                continue
            if rf.index in kept.sent:
                transcript.append(f"{conn.name} {arrow} SENT AS FILTERED WHEN RECORDED "
                                  f"{normalise(kept.sent[rf.index])}")  # fmt: skip
                continue
            if rf.from_client:
                transcript.append(f"{conn.name} {arrow} {normalise(rf.frame)}")
                continue
            if rf.index in kept.injected:
                transcript.append(f"{conn.name} {arrow} INJECTED WHEN RECORDED (not expected "
                                  f"from the broker) {normalise(rf.frame)}")  # fmt: skip
                continue
            key = live.keys.get(rf.index) if live else None
            if key is None:
                continue
            if key[0] == AGAIN:
                outcome.redelivered_recorded += 1
                transcript.append(
                    f"{conn.name} {arrow} REDELIVERED WHEN RECORDED {normalise(rf.frame)}"
                )
                continue
            got = live.arrived.get(key) if live else None
            why = recording.incomplete(conn, rf.index)
            if got is None:
                outcome.differs(why, conn.name, normalise(rf.frame), None)
                transcript.append(f"{conn.name} {arrow} MISSING {normalise(rf.frame)}")
                continue
            recorded_text, live_text = normalise(rf.frame), normalise(got)
            transcript.append(f"{conn.name} {arrow} {live_text}")
            if recorded_text == live_text:
                outcome.matched += 1
            else:
                outcome.differs(why, conn.name, recorded_text, live_text, rf.frame.name)
        transcript += [line for _, line in notes]
        outcome.redelivered_live += live.redelivered if live else 0
        why = recording.incomplete(conn)
        for frame in live.unexpected if live else []:
            outcome.differs(why, conn.name, None, normalise(frame))
            transcript.append(f"{conn.name} B→C UNEXPECTED {normalise(frame)}")
    return transcript


_ANSWERED_BY_SUCCESS = {T("CLOSE_PRODUCER"), T("CLOSE_CONSUMER"), T("UNSUBSCRIBE"), T("SEEK")}


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
    # The messages each recorded consumer got, by (topic, subscription), in
    # the order the consumers subscribed: one live consumer each (a shared
    # subscription's consumers do not all get every message).
    messages: dict[tuple[str, str], collections.deque[list[Frame]]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    # Readers' (non-durable subscriptions, named afresh each run), by topic.
    readers: dict[str, collections.deque[list[Frame]]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    # The largest message the recorded broker took (its CONNECTED says), at
    # least a broker's default: the frames a live client may send are
    # bounded by it, as a broker's and the proxy's are.
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE

    @classmethod
    def of(cls, recording: Recording) -> Answers:
        """Pair every recorded answer with its request (the one Correlator does
        the pairing) and file it under what a live client will ask."""
        index = cls()
        # A topic's receipts in the order they were recorded, whatever their
        # connection: a broker numbers a topic's entries as sends arrive, so
        # live sends given them in turn get ids that grow as a broker's do.
        receipts: dict[str, list[tuple[int, Frame]]] = collections.defaultdict(list)
        for conn in recording.connections:
            correlator = Correlator()
            subscriptions: dict[int, list[Frame]] = {}
            for rf in conn.frames:
                frame = rf.frame
                body: Any = frame.body
                if body is None:
                    continue
                if frame.type == T("CONNECTED") and body.HasField("max_message_size"):
                    index.max_message_size = max(index.max_message_size, body.max_message_size)
                if rf.from_client and frame.type == T("SUBSCRIBE"):
                    subscriptions[body.consumer_id] = []
                done = correlator.observe(frame, rf.from_client, 0.0)
                if rf.from_client:
                    continue
                if done is not None and done.request_type == T("SUBSCRIBE") and done.request:
                    # A consumer that was let in: its messages are what a live
                    # one is given (a refused SUBSCRIBE, retried, gets none).
                    asked: Any = done.request.body
                    got = subscriptions.get(asked.consumer_id)
                    if done.error is None and got is not None:
                        if asked.durable:
                            index.messages[(asked.topic, asked.subscription)].append(got)
                        else:
                            index.readers[asked.topic].append(got)
                if frame.type == T("MESSAGE"):
                    if body.consumer_id in subscriptions:
                        subscriptions[body.consumer_id].append(frame)
                    continue
                if done is None:
                    continue
                if done.request_type == T("SEND"):
                    receipts[done.topic or ""].append((rf.index, frame))
                    continue
                if done.request is None:
                    continue
                what = (done.request_type, done.topic or _namespace(done.request))
                index.by_request[what].append(frame)
                index.last[what] = frame
        for topic, answered in receipts.items():
            index.receipts[topic].extend(answer for _, answer in sorted(answered, key=_first))
        return index

    def delivered(self, subscribe: Any) -> list[Frame]:
        """What a live SUBSCRIBE is given: the messages of the next recorded
        consumer of its subscription in turn (a reader: of the next recorded
        reader of its topic, whatever it was named), round and round, so
        that a client run again is served again."""
        if subscribe.durable:
            queue = self.messages.get((subscribe.topic, subscribe.subscription))
        else:
            queue = self.readers.get(subscribe.topic)
        if not queue:
            return []
        got = queue[0]
        queue.rotate(-1)
        return got

    def answer(self, asked: tuple[int, str]) -> Frame | None:
        """The next recorded answer to this kind of request (the last one again when used up)."""
        queue = self.by_request.get(asked)
        if queue:
            return queue.popleft()
        return self.last.get(asked)


def _first(item: tuple[int, Frame]) -> int:
    return item[0]


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
        # Bounded as a broker bounds them (and the proxy): a length prefix
        # past the limit ends the connection, rather than buffering what
        # the client says is coming (up to 2 GiB).
        conn = FrameStream(stream, self.answers.max_message_size)
        producers: dict[int, str] = {}
        consumers: dict[int, Consumer] = {}
        try:
            while (frame := await conn.receive_frame()) is not None:
                reply = self._answer(frame, producers, consumers)
                if reply:
                    await conn.send(reply)
                if frame.type in (T("FLOW"), T("SUBSCRIBE")):
                    await self._push(conn, consumers)
        except RemoteProtocolError as exc:
            print(f"[serve] closing the connection from {_peer(stream)}: client sent an "
                  f"unframeable stream: {exc}", file=sys.stderr, flush=True)  # fmt: skip
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def _answer(
        self, frame: Frame, producers: dict[int, str], consumers: dict[int, Consumer]
    ) -> bytes:
        body: Any = frame.body
        t = frame.type
        if body is None:
            return b""
        if t == T("CONNECT"):
            connected = pb.CommandConnected(
                server_version="sluice-serve",
                protocol_version=min(body.protocol_version, 21),
                max_message_size=self.answers.max_message_size,
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
            consumers[body.consumer_id] = Consumer(body.topic, self.answers.delivered(body))
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


def _peer(stream: trio.abc.Stream) -> str:
    """The client's address, for a log line (``a client`` when unknown)."""
    inner: Any = getattr(stream, "transport_stream", stream)  # under TLS
    try:
        host, port, *_ = inner.socket.getpeername()
    except (AttributeError, OSError, ValueError):
        return "a client"
    return str(Address(host, port))


async def serve(recording: Path, listening: Listening) -> Report:
    """Answer Pulsar clients from ``recording`` until SIGINT or SIGTERM."""
    recorded = load(recording)
    answers = Answers.of(recorded)
    listeners, plain, tls = await listening.open()
    stub = StubBroker(
        answers, f"pulsar://{plain}" if plain else "", f"pulsar+ssl://{tls}" if tls else ""
    )
    urls = " and ".join(url for url in (stub.url, stub.url_tls) if url)
    announce(f"a broker on {urls}", recording, recorded.truncated)
    await until_signalled(stub.handle, listeners)
    return stub.report
