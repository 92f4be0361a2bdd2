"""Who asked what on a connection, and what answered it.

One ``Correlator`` per connection watches frames both ways and keeps:
requests waiting for an answer (by request_id), SENDs waiting for a receipt
(by producer_id + sequence_id), and the producers and consumers that exist,
with their topics. Each answer it matches comes back as a ``Completion``.
The proxy uses it to drain (which producers and consumers to close, which
sends are in flight), metrics use completions for latency, recording and
replay use it to name topics and to pair frames.

Pure state: time is passed in, nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.decoder import COMPILED
from sluice.protocols.pulsar.frame import Frame, text

if TYPE_CHECKING:
    from sluice._frames import Batch

T = pb.BaseCommand

# Commands answered by a frame carrying the same request_id. The answer type
# is not fixed (ERROR can answer any of them), so only the id is matched.
_ANSWERS_WITH_REQUEST_ID = frozenset(
    {
        T.LOOKUP_RESPONSE,
        T.PARTITIONED_METADATA_RESPONSE,
        T.PRODUCER_SUCCESS,
        T.SUCCESS,
        T.ERROR,
        T.GET_LAST_MESSAGE_ID_RESPONSE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
        T.GET_SCHEMA_RESPONSE,
        T.GET_OR_CREATE_SCHEMA_RESPONSE,
        T.CONSUMER_STATS_RESPONSE,
        T.ACK_RESPONSE,
        T.WATCH_TOPIC_LIST_SUCCESS,
        T.NEW_TXN_RESPONSE,
        T.ADD_PARTITION_TO_TXN_RESPONSE,
        T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
        T.END_TXN_RESPONSE,
        T.TC_CLIENT_CONNECT_RESPONSE,
    }
)
# ACK asks for an answer only when it carries a request_id.
_REQUESTS = frozenset(
    {
        T.LOOKUP,
        T.PARTITIONED_METADATA,
        T.PRODUCER,
        T.SUBSCRIBE,
        T.UNSUBSCRIBE,
        T.CLOSE_PRODUCER,
        T.CLOSE_CONSUMER,
        T.SEEK,
        T.GET_LAST_MESSAGE_ID,
        T.GET_TOPICS_OF_NAMESPACE,
        T.GET_SCHEMA,
        T.GET_OR_CREATE_SCHEMA,
        T.CONSUMER_STATS,
        T.ACK,
        T.WATCH_TOPIC_LIST,
        T.WATCH_TOPIC_LIST_CLOSE,
        T.NEW_TXN,
        T.ADD_PARTITION_TO_TXN,
        T.ADD_SUBSCRIPTION_TO_TXN,
        T.END_TXN,
        T.TC_CLIENT_CONNECT_REQUEST,
    }
)


_SEND, _SEND_RECEIPT, _SEND_ERROR = T.SEND, T.SEND_RECEIPT, T.SEND_ERROR
_MESSAGE, _ACK = T.MESSAGE, T.ACK

# What observe() looks at, per direction: callers on a hot path can skip the
# call for every other type (MESSAGE, FLOW, PING...).
CLIENT_TYPES = _REQUESTS | {T.SEND}
SERVER_TYPES = _ANSWERS_WITH_REQUEST_ID | {
    T.SEND_RECEIPT,
    T.SEND_ERROR,
    T.CLOSE_PRODUCER,
    T.CLOSE_CONSUMER,
}


# One frame of a read the compiled scanner took: (stop, type, metadata
# offset, payload offset, checksum, a, b, c, properties); for a SEND a, b, c
# are its producer id, sequence id and messages, for a SEND_RECEIPT its
# producer and sequence ids, for a MESSAGE its consumer id and messages.
Scanned = tuple[int, int, int, int, int, int, int, int, int]
# A read's tallies: messages and bytes by topic, and receipt times (seconds)
# by the topic of the SEND they answer.
Traffic = dict[str, list[int]]
Times = dict[str | None, list[float]]


class Sends(Protocol):
    """SENDs in flight, and the bulk accounting of a scanned read: the
    Python ``SendTable`` below (the reference) or the compiled one,
    ``sluice._frames.SendTable`` (rust/src/account.rs)."""

    @property
    def in_flight(self) -> int: ...
    def __len__(self) -> int: ...
    def sending(
        self, producer_id: int, sequence_id: int, now: float, topic: str | None
    ) -> None: ...
    def sent(self, producer_id: int, sequence_id: int) -> tuple[float, str | None] | None: ...
    def peek(self, producer_id: int, sequence_id: int) -> tuple[float, str | None, int] | None: ...
    def waiting(self) -> list[tuple[int, int, float, str | None, int]]: ...
    def account_client(
        self, found: Batch | Sequence[Scanned], start: int, now: float, producers: dict[int, str]
    ) -> tuple[Traffic | None, list[int]]: ...
    def account_broker(
        self, found: Batch | Sequence[Scanned], start: int, now: float, consumers: dict[int, str]
    ) -> tuple[Times | None, Traffic | None]: ...


class SendTable:
    """SENDs in flight by (producer_id, sequence_id), and what the relay
    does with each hot frame of a read the compiled scanner took whole, in
    one call per read. The reference for the compiled ``SendTable``: the
    two are tested against each other on the same reads."""

    __slots__ = ("_waiting", "in_flight")

    def __init__(self) -> None:
        # [started, topic, repeats]: repeats counts SENDs beyond the first
        # with the same ids (the chunks of a chunked message share them, and
        # each gets its own receipt). Not the frame itself: up to a client's
        # whole pending queue is in flight, and each would keep its payload
        # alive (and in the garbage collector's way) until its receipt.
        self._waiting: dict[tuple[int, int], list[Any]] = {}
        self.in_flight = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def sending(self, producer_id: int, sequence_id: int, now: float, topic: str | None) -> None:
        """A SEND, in flight from ``now``, of a producer on ``topic``."""
        key = (producer_id, sequence_id)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = [now, topic, 0]
        else:
            waiting[2] += 1
        self.in_flight += 1

    def sent(self, producer_id: int, sequence_id: int) -> tuple[float, str | None] | None:
        """(started, topic) of the SEND an answer ends, now no longer in
        flight; None if it was never seen."""
        key = (producer_id, sequence_id)
        waiting = self._waiting.get(key)
        if waiting is None:
            return None
        if waiting[2]:
            waiting[2] -= 1
        else:
            del self._waiting[key]
        self.in_flight -= 1
        return waiting[0], waiting[1]

    def forget(self, producer_id: int) -> int:
        """A closed producer's SENDs, no longer in flight; how many were."""
        keys = [key for key in self._waiting if key[0] == producer_id]
        forgotten = 0
        for key in keys:
            forgotten += self._waiting.pop(key)[2] + 1
        self.in_flight -= forgotten
        return forgotten

    def peek(self, producer_id: int, sequence_id: int) -> tuple[float, str | None, int] | None:
        """(started, topic, repeats) of a SEND in flight, left in flight."""
        waiting = self._waiting.get((producer_id, sequence_id))
        return None if waiting is None else (waiting[0], waiting[1], waiting[2])

    def waiting(self) -> list[tuple[int, int, float, str | None, int]]:
        """Every SEND in flight, by ids: for comparing tables."""
        return sorted((k[0], k[1], w[0], w[1], w[2]) for k, w in self._waiting.items())

    def account_client(
        self, found: Batch | Sequence[Scanned], start: int, now: float, producers: dict[int, str]
    ) -> tuple[Traffic | None, list[int]]:
        """A client's scanned read: each SEND in flight under its producer's
        topic and tallied there; the indices of the ACKs, for the correlator
        to look at (one that asks for a receipt is a request)."""
        traffic: Traffic | None = None
        acks: list[int] = []
        before = start
        for i, (stop, kind, _, _, _, a, b, c, _) in enumerate(found):
            size = stop - before
            before = stop
            if kind == _SEND:
                topic = producers.get(a)
                self.sending(a, b, now, topic)
                if topic is not None:
                    traffic = add_traffic(traffic, topic, c, size)
            elif kind == _ACK:
                acks.append(i)
        return traffic, acks

    def account_broker(
        self, found: Batch | Sequence[Scanned], start: int, now: float, consumers: dict[int, str]
    ) -> tuple[Times | None, Traffic | None]:
        """A broker's scanned read: each SEND_RECEIPT ends its SEND, timed
        under the SEND's topic; each MESSAGE tallied under its consumer's."""
        times: Times | None = None
        traffic: Traffic | None = None
        before = start
        for stop, kind, _, _, _, a, b, c, _ in found:
            size = stop - before
            before = stop
            if kind == _MESSAGE:
                topic = consumers.get(a)
                if topic is not None:
                    traffic = add_traffic(traffic, topic, c, size)
            elif kind == _SEND_RECEIPT:
                sent = self.sent(a, b)
                if sent is not None:
                    times = add_time(times, sent[1], now - sent[0])
        return times, traffic


def add_time(times: Times | None, topic: str | None, seconds: float) -> Times:
    """``times`` (made when None) with a SEND's time to its receipt added
    under its topic: one AnsweredMany event per topic per read."""
    if times is None:
        times = {}
    seen = times.get(topic)
    if seen is None:
        times[topic] = [seconds]
    else:
        seen.append(seconds)
    return times


def add_traffic(traffic: Traffic | None, topic: str, messages: int, size: int) -> Traffic:
    """``traffic`` (made when None) with a payload frame's messages and
    bytes added to its topic's tally: one TopicTraffic event per topic per
    read."""
    if traffic is None:
        traffic = {}
    tally = traffic.get(topic)
    if tally is None:
        traffic[topic] = [messages, size]
    else:
        tally[0] += messages
        tally[1] += size
    return traffic


# The compiled one where the compiled frame path is in use (the same switch:
# SLUICE_FRAMES=python, or nobody built it, means the Python code alone).
SEND_TABLE: type[Sends] = SendTable if COMPILED is None else COMPILED.send_table
"""The send table correlators use."""


# Requests waiting for an answer, at most, per connection (and their frames'
# bytes): a broker that never answers one kind (pulsar-lite and GET_SCHEMA)
# or at all, and a client that goes on asking, must not grow memory without
# end. Past either, the oldest is forgotten (its answer, if it ever comes,
# is then not timed): clients have given up on such a request long since.
MAX_PENDING_REQUESTS = 10_000
MAX_PENDING_REQUEST_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class Pending:
    type: int
    started: float
    topic: str | None = None
    # For PRODUCER / SUBSCRIBE: the id the request creates.
    resource_id: int | None = None
    request: Frame | None = None
    # For a close (UNSUBSCRIBE): the client asked for the id again before
    # the answer, so the answer must not make it forgotten.
    again: bool = False


@dataclass(slots=True)
class Completion:
    """A request (or SEND) and the frame that answered it."""

    request_type: int  # T.SEND for a send receipt / send error
    answer_type: int
    started: float
    finished: float
    topic: str | None
    error: int | None  # ServerError when the answer was a failure
    request: Frame | None = None  # the request frame itself (None for a SEND)

    @property
    def seconds(self) -> float:
        return self.finished - self.started


@dataclass
class Correlator:
    """Per-connection request/response state. ``observe`` every frame in order."""

    requests: dict[int, Pending] = field(default_factory=dict)
    sends: Sends = field(default_factory=lambda: SEND_TABLE())
    # producer_id -> topic, consumer_id -> topic: from the client's PRODUCER
    # or SUBSCRIBE on, not from the broker's answer. What a client's SENDs
    # (and its deliveries) are filtered and counted under must not hang on
    # pairing an answer with its request, which a client can defeat: a
    # request id used again, a PRODUCER pushed past MAX_PENDING_REQUESTS.
    # The broker created it either way; a client that then sent SENDs
    # unfiltered (in plaintext, on a topic that encrypts) would have got
    # round the filters.
    producers: dict[int, str] = field(default_factory=dict)
    consumers: dict[int, str] = field(default_factory=dict)
    # The bytes of the request frames in ``requests``.
    request_bytes: int = 0
    # Ids the broker said it created (until closed): an error answering
    # another request for one of them (a client's repeated PRODUCER) does
    # not make it forgotten.
    made: set[tuple[int, int]] = field(default_factory=set)
    # Closes (UNSUBSCRIBEs) waiting for their answer, by the id they release
    # ((PRODUCER or SUBSCRIBE, id)): a PRODUCER (SUBSCRIBE) asking for the
    # id meanwhile marks them ``again``.
    closing: dict[tuple[int, int], Pending] = field(default_factory=dict)

    def observe(self, frame: Frame, from_client: bool, now: float) -> Completion | None:
        t = frame.type
        # SENDs and their receipts, one pair per message, are handled here
        # from their ids (no parsed command needed); everything else (per
        # request at most) in the methods below.
        ids = frame.ids
        if ids is not None:
            if t == _SEND:
                self.sending(ids[0], ids[1], now)
                return None
            if t == _SEND_RECEIPT:
                sent = self.sent(ids[0], ids[1])
                if sent is None:
                    return None
                return Completion(_SEND, t, sent.started, now, sent.topic, None)
        body: Any = frame.body
        if body is None:
            return None
        if from_client:
            if t == _SEND:
                self.sending(body.producer_id, body.sequence_id, now)
            else:
                self._client_frame(frame, t, body, now)
            return None
        if t in (_SEND_RECEIPT, _SEND_ERROR):
            sent = self.sent(body.producer_id, body.sequence_id)
            if sent is None:
                return None
            error = body.error if t == _SEND_ERROR else None
            return Completion(_SEND, t, sent.started, now, sent.topic, error)
        return self._server_frame(t, body, now)

    def sending(self, producer_id: int, sequence_id: int, now: float) -> str | None:
        """A SEND, in flight from ``now``; the topic of its producer.
        ``observe`` does this for SENDs; the proxy's relay calls it itself
        (with the frame's ``ids``), and counts the topic's traffic with the
        answer."""
        topic = self.producers.get(producer_id)
        self.sends.sending(producer_id, sequence_id, now, topic)
        return topic

    def sent(self, producer_id: int, sequence_id: int) -> Pending | None:
        """The SEND a SEND_RECEIPT or SEND_ERROR answers, now no longer in
        flight (None if it was never seen). ``observe`` does this for those
        frames; the proxy's relay calls it for receipts itself, to time them
        without making a ``Completion`` for each."""
        sent = self.sends.sent(producer_id, sequence_id)
        return None if sent is None else Pending(_SEND, sent[0], sent[1])

    def forget_sends(self, producer_id: int) -> int:
        """A closed producer's SENDs in flight, no longer in flight: none
        will be answered on this connection. How many were. A table with a
        ``forget`` of its own (the Python one) does it; the compiled one is
        scanned (``waiting``, ``sent``): rare, and only when SENDs are in
        flight at all."""
        sends = self.sends
        forget = getattr(sends, "forget", None)
        if forget is not None:
            forgotten: int = forget(producer_id)
            return forgotten
        if not sends.in_flight:
            return 0
        forgotten = 0
        for pid, seq, _, _, repeats in sends.waiting():
            if pid == producer_id:
                for _ in range(repeats + 1):
                    sends.sent(pid, seq)
                forgotten += repeats + 1
        return forgotten

    def topic_of_producer(self, producer_id: int) -> str | None:
        return self.producers.get(producer_id)

    def topic_of_consumer(self, consumer_id: int) -> str | None:
        return self.consumers.get(consumer_id)

    def topic_of(self, frame: Frame) -> str | None:
        """The topic ``frame`` is about, from its own fields or this
        connection's state (producer, consumer, pending request); call it
        before ``observe``ing the frame."""
        body: Any = frame.body
        if body is None:
            return None
        fields = body.DESCRIPTOR.fields_by_name
        if "topic" in fields and body.topic:
            return text(body.topic)
        if "producer_id" in fields and body.producer_id in self.producers:
            return self.producers[body.producer_id]
        if "consumer_id" in fields and body.consumer_id in self.consumers:
            return self.consumers[body.consumer_id]
        if "request_id" in fields:
            pending = self.requests.get(body.request_id)
            if pending is not None:
                return pending.topic
        if "producer_id" in fields and "sequence_id" in fields:
            sent = self.sends.peek(body.producer_id, body.sequence_id)
            if sent is not None:
                return sent[1]
        return None

    @property
    def in_flight_sends(self) -> int:
        return self.sends.in_flight

    # --- client to broker ---------------------------------------------------

    def _client_frame(self, frame: Frame, t: int, body: Any, now: float) -> None:
        if t not in _REQUESTS:
            return
        if t == T.ACK and not body.HasField("request_id"):
            return
        rid: int = body.request_id
        pending = Pending(t, now, request=frame)
        if t == T.PRODUCER:
            pending.topic, pending.resource_id = text(body.topic), body.producer_id
            self.producers.setdefault(body.producer_id, pending.topic)
            self._again((T.PRODUCER, body.producer_id))
        elif t == T.SUBSCRIBE:
            pending.topic, pending.resource_id = text(body.topic), body.consumer_id
            self.consumers.setdefault(body.consumer_id, pending.topic)
            self._again((T.SUBSCRIBE, body.consumer_id))
        elif t in (T.LOOKUP, T.PARTITIONED_METADATA, T.GET_SCHEMA, T.GET_OR_CREATE_SCHEMA):
            pending.topic = text(body.topic)
        # A closing producer (consumer) keeps its topic until the broker
        # answers the close: until then the broker still takes its SENDs
        # (still delivers to it), and they go through its topic's filters.
        # Its SENDs in flight are forgotten once the close is answered.
        elif t == T.CLOSE_PRODUCER:
            pending.topic = self.producers.get(body.producer_id)
            self.made.discard((T.PRODUCER, body.producer_id))
            pending.resource_id = body.producer_id
            self.closing[(T.PRODUCER, body.producer_id)] = pending
        elif t == T.CLOSE_CONSUMER:
            pending.topic = self.consumers.get(body.consumer_id)
            self.made.discard((T.SUBSCRIBE, body.consumer_id))
            pending.resource_id = body.consumer_id
            self.closing[(T.SUBSCRIBE, body.consumer_id)] = pending
        elif t in (T.SEEK, T.UNSUBSCRIBE, T.GET_LAST_MESSAGE_ID, T.ACK, T.CONSUMER_STATS):
            pending.topic = self.consumers.get(body.consumer_id)
            if t == T.UNSUBSCRIBE:  # gone once the broker agrees
                pending.resource_id = body.consumer_id
                self.closing[(T.SUBSCRIBE, body.consumer_id)] = pending
        self._remember(rid, pending)

    def _again(self, made: tuple[int, int]) -> None:
        """A PRODUCER (SUBSCRIBE) for an id: a close of it waiting for its
        answer no longer makes it forgotten. The Java client, when creating
        a producer (consumer) times out, closes its id "in case it was
        created" and asks again after its backoff, on the same connection,
        without waiting for the close's answer: a slow broker answers the
        close after the new request went by."""
        close = self.closing.pop(made, None)
        if close is not None:
            close.again = True

    def _released(self, pending: Pending) -> None:
        """A close (UNSUBSCRIBE) answered or given up on: no longer waiting."""
        if pending.resource_id is None:
            return
        kind = T.PRODUCER if pending.type == T.CLOSE_PRODUCER else T.SUBSCRIBE
        made = (kind, pending.resource_id)
        if self.closing.get(made) is pending:
            del self.closing[made]

    def _remember(self, rid: int, pending: Pending) -> None:
        """Keep a request until its answer, within the bounds (oldest out)."""
        requests = self.requests
        # A request id used again: the answer that comes is the new one's,
        # and it is the newest (dicts keep a replaced key where it was).
        replaced = requests.pop(rid, None)
        if replaced is not None:
            self.request_bytes -= _size(replaced)
            self._unpaired(replaced)
            # Nor can an answer for the id be told to be the new one's (the
            # broker may answer the old request after this one was sent).
            self._unpaired(pending)
        requests[rid] = pending
        self.request_bytes += _size(pending)
        while len(requests) > 1 and (
            len(requests) > MAX_PENDING_REQUESTS or self.request_bytes > MAX_PENDING_REQUEST_BYTES
        ):
            old = requests.pop(next(iter(requests)))
            self.request_bytes -= _size(old)
            self._unpaired(old)

    def _unpaired(self, pending: Pending) -> None:
        """A request whose answer cannot be told for sure (pairs with
        nothing, or with what may be another request's). A PRODUCER or
        SUBSCRIBE the broker may make unseen: a refusal of another request
        for its id does not make it forgotten. A close or an UNSUBSCRIBE the
        broker may refuse: no answer makes its producer (consumer)
        forgotten; it stays filtered until the broker closes it itself or
        the connection ends."""
        if pending.resource_id is None:
            return
        if pending.type in _CREATES:
            self.made.add((pending.type, pending.resource_id))
        elif pending.type in _RELEASES:
            self._released(pending)
            pending.resource_id = None

    # --- broker to client ---------------------------------------------------

    def _server_frame(self, t: int, body: Any, now: float) -> Completion | None:
        if t == T.CLOSE_PRODUCER:  # the broker closed it: the client will re-create it
            self.producers.pop(body.producer_id, None)
            self.made.discard((T.PRODUCER, body.producer_id))
            # Its SENDs in flight get no answer (the client sends them again).
            self.forget_sends(body.producer_id)
            return None
        if t == T.CLOSE_CONSUMER:
            self.consumers.pop(body.consumer_id, None)
            self.made.discard((T.SUBSCRIBE, body.consumer_id))
            return None
        if t not in _ANSWERS_WITH_REQUEST_ID or not _has_request_id(body):
            return None
        pending = self.requests.pop(body.request_id, None)
        if pending is None:
            return None
        self.request_bytes -= _size(pending)
        error = answer_error(t, body)
        if pending.type in _RELEASES:
            self._released(pending)
        if pending.type == T.CLOSE_PRODUCER and pending.resource_id is not None:
            # A broker answers the close once the producer's SENDs in flight
            # are answered; any left now (failed meanwhile) never will be.
            # (Unless the id was asked for again: those may be the new one's.)
            if not pending.again:
                self.forget_sends(pending.resource_id)
            if error is None:
                self._closed(self.producers, pending)
        elif error is None and pending.type == T.CLOSE_CONSUMER:
            self._closed(self.consumers, pending)
        elif (
            error is None
            and pending.type == T.UNSUBSCRIBE
            and pending.resource_id is not None
            and not pending.again
        ):
            # The consumer is closed with its subscription; its client sends
            # no CLOSE_CONSUMER for it.
            self.consumers.pop(pending.resource_id, None)
            self.made.discard((T.SUBSCRIBE, pending.resource_id))
        elif pending.type in _CREATES and pending.resource_id is not None:
            made = (pending.type, pending.resource_id)
            if error is None:
                # producer_ready=false means "queued for exclusive access";
                # the producer exists either way for closing purposes.
                self.made.add(made)
            elif made not in self.made and not self._asked(made):
                # Refused, and nothing else made it: forgotten (a client
                # that goes on asking in vain leaves nothing behind).
                table = self.producers if pending.type == T.PRODUCER else self.consumers
                if table.get(pending.resource_id) == pending.topic:
                    del table[pending.resource_id]
        return Completion(
            pending.type, t, pending.started, now, pending.topic, error, pending.request
        )

    @staticmethod
    def _closed(table: dict[int, str], pending: Pending) -> None:
        """A close the broker agreed to: the id forgotten, unless a newer
        PRODUCER (SUBSCRIBE) asked for it meanwhile (``_again``), or made
        it another topic's."""
        rid = pending.resource_id
        if pending.again:
            return
        if rid is not None and rid in table and table[rid] == pending.topic:
            del table[rid]

    def _asked(self, made: tuple[int, int]) -> bool:
        """Whether another PRODUCER (SUBSCRIBE) for this id waits for its
        answer (rare: a client asking again; looked for only on a refusal)."""
        kind, resource = made
        return any(p.type == kind and p.resource_id == resource for p in self.requests.values())

    def open_elsewhere(self, frame: Frame) -> str | None:
        """For a PRODUCER or SUBSCRIBE from the client, before it is
        observed: the other topic its id is open on, on this connection (or
        None). Official clients never do this. Such a request is not
        relayed: a broker that has the producer keeps it on its own topic,
        but one that does not (its creation failed unseen) would make it on
        the new one, where its messages would go filtered as the old one's."""
        body: Any = frame.body
        if body is None or frame.type not in _CREATES:
            return None
        if frame.type == T.PRODUCER:
            known = self.producers.get(body.producer_id)
        else:
            known = self.consumers.get(body.consumer_id)
        return known if known is not None and known != text(body.topic) else None


_CREATES = frozenset({T.PRODUCER, T.SUBSCRIBE})
# Requests whose success makes a producer (consumer) forgotten.
_RELEASES = frozenset({T.CLOSE_PRODUCER, T.CLOSE_CONSUMER, T.UNSUBSCRIBE})


def _size(pending: Pending) -> int:
    request = pending.request
    return 0 if request is None else len(request.raw)


def answer_key(frame: Frame) -> tuple[str, int] | tuple[str, int, int] | None:
    """What a broker frame answers: ``("rid", request_id)`` or ``("send",
    producer_id, sequence_id)``; None for frames that answer nothing (pushes,
    pings). The rule ``Correlator`` matches answers by."""
    body: Any = frame.body
    t = frame.type
    if body is None:
        return None
    if t in (T.SEND_RECEIPT, T.SEND_ERROR):
        return ("send", body.producer_id, body.sequence_id)
    if t in _ANSWERS_WITH_REQUEST_ID and _has_request_id(body):
        return ("rid", body.request_id)
    return None


def _has_request_id(body: object) -> bool:
    try:
        return bool(body.HasField("request_id"))  # type: ignore[attr-defined]
    except ValueError:
        return False


def answer_error(t: int, body: object) -> int | None:
    """The ServerError an answer of type ``t`` reports, or None for success."""
    if t == T.ERROR:
        return int(body.error)  # type: ignore[attr-defined]
    for name in ("error", "error_code"):
        try:
            if body.HasField(name):  # type: ignore[attr-defined]
                return int(getattr(body, name))
        except ValueError:
            continue
    if t == T.LOOKUP_RESPONSE and body.response == pb.CommandLookupTopicResponse.Failed:  # type: ignore[attr-defined]
        return pb.UnknownError
    return None
