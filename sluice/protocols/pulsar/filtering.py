"""Message filters on a Pulsar connection: SENDs and MESSAGEs taken apart,
put through their topic's filter chain, and put back together.

``FilterGate`` is one proxied connection's part of the work; the core
(``connection.py``) hands it each SEND of a producer and each MESSAGE of a
consumer whose topic has a chain (``sluice.protocols.filtering``), and
carries out what it answers:

- A SEND goes on unchanged, goes on rebuilt (the batch re-serialized,
  compressed again with the producer's codec, sizes and the checksum made
  anew), or is refused: nothing goes to the broker and the client gets a
  SEND_ERROR, after the receipts of its earlier SENDs (clients fail the
  oldest send they wait for, so an error that overtook a receipt would be
  taken for the wrong one). A batch is one send to the client: one refused
  message refuses its batch.
- A refused delivery is skipped: the consumer never sees it, Sluice
  acknowledges it to the broker in the consumer's name and gives the
  consumer's permits back (FLOW), so that it is neither redelivered forever
  nor lost from the consumer's flow control. Skipped entries of a batch are
  left out of the batch delivered.
- A SEND whose chain wants schemas waits for the topic's schema (a
  GET_SCHEMA the core sends on Sluice's upstream connection), and the
  client's frames after it wait with it.
- Chunked messages are not reassembled: on a filtered topic a chunked SEND
  is refused (``chunked``) and a chunked delivery skipped.

Which SEND_ERROR code: each client library fails just the one send on a
different code, and on the others drops the connection and sends the same
messages again (a loop). Java's client fails a send on ``NotAllowedError``;
the C++ client (and the Python, Node.js and other clients built on it)
only on ``ChecksumError``. A ``Reject`` without an ``error`` gets the one
its client's CONNECT names (``client_version``); see docs/filters.md.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sluice.logs import clipped
from sluice.protocols.core import Conn, Filtered, Tap
from sluice.protocols.filtering import (
    DELIVER,
    PASS,
    PRODUCE,
    UNKNOWN,
    Chain,
    Direction,
    Filtering,
    Message,
    Outcome,
    Reject,
    Replace,
    Schema,
    Sealed,
    Sealer,
    Unknown,
    WrappedKey,
)
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.correlation import Sends
from sluice.protocols.pulsar.decoder import COMPILED, decode_frame
from sluice.protocols.pulsar.encoder import (
    command,
    encode,
    encode_payload,
    own_frame,
    with_payload,
)
from sluice.protocols.pulsar.errors import LocalProtocolError, RemoteProtocolError
from sluice.protocols.pulsar.frame import Frame, text
from sluice.protocols.pulsar.payload import (
    MAX_BATCH_MESSAGES,
    build_batch,
    compress,
    is_batch,
    payload_bytes,
    split_batch,
)

T = pb.BaseCommand
log = logging.getLogger("sluice.filters")
# Each sealer's key as the compiled path holds it (one per filter, shared
# by the connections of a process).
_SEALS: weakref.WeakKeyDictionary[Sealer, Any] = weakref.WeakKeyDictionary()

# Pulsar's Schema.Type names, as the filter API spells them (Java's SchemaType).
SCHEMA_TYPES = {
    pb.Schema.Type.Value(name): upper
    for name, upper in {
        "None": "NONE", "String": "STRING", "Json": "JSON", "Protobuf": "PROTOBUF",
        "Avro": "AVRO", "Bool": "BOOLEAN", "Int8": "INT8", "Int16": "INT16",
        "Int32": "INT32", "Int64": "INT64", "Float": "FLOAT", "Double": "DOUBLE",
        "Date": "DATE", "Time": "TIME", "Timestamp": "TIMESTAMP", "KeyValue": "KEY_VALUE",
        "Instant": "INSTANT", "LocalDate": "LOCAL_DATE", "LocalTime": "LOCAL_TIME",
        "LocalDateTime": "LOCAL_DATE_TIME", "ProtobufNative": "PROTOBUF_NATIVE",
        "AutoConsume": "AUTO_CONSUME", "External": "EXTERNAL",
    }.items()
}  # fmt: skip


def schema_of(answer: Frame) -> Schema | None:
    """The schema a GET_SCHEMA_RESPONSE carries (None: the topic has none)."""
    body: Any = answer.body
    if body is None or body.HasField("error_code") or not body.HasField("schema"):
        return None
    return _schema(
        body.schema, bytes(body.schema_version) if body.HasField("schema_version") else None
    )


def _schema(schema: Any, version: bytes | None) -> Schema:
    return Schema(
        SCHEMA_TYPES.get(schema.type, str(schema.type)),
        bytes(schema.schema_data),
        {kv.key: kv.value for kv in schema.properties},
        version,
    )


def _schema_version(meta: pb.MessageMetadata) -> bytes | None:
    """The schema version a message names; None for none. An empty one is
    none: Apache Pulsar gives a producer without a schema the empty version
    in PRODUCER_SUCCESS, and the Java client puts it on each message (asked
    for, the broker answers "Empty schema version", and the valid message
    of a schemaless producer was refused)."""
    return (bytes(meta.schema_version) or None) if meta.HasField("schema_version") else None


def _java(client_version: str) -> bool:
    return client_version.startswith("Pulsar-Java")


def default_error(client_version: str) -> int:
    """The SEND_ERROR code this client fails one send on (module docstring)."""
    return pb.NotAllowedError if _java(client_version) else pb.ChecksumError


# Reject.error names that are no ServerError, said once each (a typo in a
# filter's code, which would otherwise go unseen), at most this many.
_UNKNOWN_ERRORS: set[str] = set()
_SAY_UNKNOWN = 100
# The most thinned batches a consumer keeps for renumbering ACKs; the
# broker bounds a consumer's unacknowledged messages (50,000 by default).
_THINNED_MAX = 65_536
# Schemas a client's PRODUCER or GET_OR_CREATE_SCHEMA asks to register,
# waiting for the broker's answer (ERRORs leave theirs: bounded).
_REGISTERING_MAX = 1024


def _error_code(reject: Reject, client_version: str, by: str | None = None) -> int:
    if reject.error:
        try:
            return pb.ServerError.Value(reject.error)
        except ValueError:  # not a ServerError name: the client's own, as with none
            if reject.error not in _UNKNOWN_ERRORS and len(_UNKNOWN_ERRORS) < _SAY_UNKNOWN:
                _UNKNOWN_ERRORS.add(reject.error)
                log.warning("filter %s: Reject(error=%r) names no Pulsar ServerError; the "
                            "client is sent the default for its version", by,
                            clipped(reject.error))  # fmt: skip
    return default_error(client_version)


@dataclass(slots=True)
class Wait:
    """A SEND that needs ``topic``'s schema ``version`` first."""

    topic: str
    version: bytes | None


@dataclass(slots=True)
class _Producer:
    forwarded: int = -1  # the highest sequence id sent on
    answered: int = -1  # the highest one the broker answered
    # SEND_ERRORs waiting for the receipt of the send before them.
    errors: deque[tuple[int, Frame]] | None = None


class FilterGate:
    """One proxied connection's filtering (module docstring)."""

    def __init__(
        self, filtering: Filtering, conn: Conn, tap: Tap, max_message_size: int, sends: Sends
    ) -> None:
        self.filtering = filtering
        # A rebuilt frame's limit: the broker's, once its CONNECTED says it.
        self.max_message_size = max_message_size
        self.conn = conn
        self.tap = tap
        self.client_version = ""
        self.role: str | None = None
        self._producers: dict[int, _Producer] = {}
        # The connection's SENDs in flight (the compiled step's too), and
        # the producers with SEND_ERRORs waiting for receipts: while there
        # are any, the broker's reads come the Python way (``answered``).
        self._sends = sends
        self._holding: set[int] = set()
        self._names: dict[int, str] = {}  # producer and consumer names by id
        # The wrapped keys last sealed with, and their metadata field's bytes.
        self._sealed_keys: tuple[WrappedKey, ...] = ()
        self._keys_field = b""
        # Producers whose SENDs the compiled step seals (when there is one),
        # with the sealer and its compiled key.
        self.sealing = COMPILED.sealing() if COMPILED is not None else None
        self.compiled: dict[int, tuple[Sealer, Any]] = {}
        self.waiting: Wait | None = None
        # Batches a deliver filter thinned, by consumer, then (ledger,
        # entry): the batch's size as the broker sent it and the indices
        # kept. The consumer numbers what it got 0, 1, ...; its ACKs are
        # renumbered for the broker (``acked``) until it acknowledges the
        # whole entry. While there are any, the client's reads come the
        # Python way.
        self._thinned: dict[int, dict[tuple[int, int], tuple[int, tuple[int, ...]]]] = {}
        # By request id: the topic and schema a PRODUCER or GET_OR_CREATE_SCHEMA
        # would register (``registered``).
        self._registering: dict[int, tuple[str, Schema]] = {}

    def chain(self, topic: str | None, direction: Direction) -> Chain | None:
        if topic is None:
            return None
        return self.filtering.chain(topic, direction, self.role)

    def wants(
        self,
        from_client: bool,
        producers: dict[int, str],
        consumers: dict[int, str],
        compiled: bool = False,
    ) -> bool:
        """Whether reads from the client (or from the broker) need filtering;
        ``compiled``: on the compiled step, which seals the SENDs of the
        producers in ``self.sealing`` itself (and gives back what it cannot)."""
        chain, role = self.filtering.chain, self.role
        if self.waiting is not None or (self._holding and not from_client):
            return True
        sealed = self.compiled if compiled else ()
        for producer, topic in producers.items():
            if producer not in sealed and chain(topic, PRODUCE, role) is not None:
                # Its receipts are read too: a refusal waits for them.
                return True
        if from_client:
            thinned = self._thinned
            if thinned:  # a consumer closed (as the broker agreed): its ACKs are over
                for gone in [c for c in thinned if c not in consumers]:
                    del thinned[gone]
            return bool(thinned)
        return any(chain(topic, DELIVER, role) is not None for topic in consumers.values())

    def _thin(self, body: Any, size: int, kept: list[int] | None) -> None:
        """A batch delivered with only the entries ``kept`` of ``size``
        (None: delivered whole, or not at all: nothing to renumber)."""
        mid = body.message_id
        consumer = body.consumer_id
        entries = self._thinned.get(consumer)
        if kept is None:
            key = (mid.ledgerId, mid.entryId)
            if entries is not None and key in entries:
                del entries[key]
                self._forget_if_empty(consumer)
            return
        if entries is None:
            entries = self._thinned[consumer] = {}
        elif len(entries) >= _THINNED_MAX:  # the oldest is forgotten (logged)
            ledger, entry = next(iter(entries))
            del entries[ledger, entry]
            log.warning(
                "%s: consumer %d: more than %d thinned batches unacknowledged; an "
                "acknowledgement of entry %d:%d by batch index now goes on as it came",
                self.conn.name, consumer, _THINNED_MAX, ledger, entry,
            )  # fmt: skip
        entries[mid.ledgerId, mid.entryId] = (size, tuple(kept))

    def _forget_if_empty(self, consumer: int) -> None:
        if consumer in self._thinned and not self._thinned[consumer]:
            del self._thinned[consumer]

    def acked(self, frame: Frame) -> bytes | None:
        """A client's ACK of messages in batches a deliver filter thinned,
        renumbered as the broker numbers them (an entry left out counts as
        acknowledged, as a whole entry left out is; an index the consumer
        never got is left out of the ACK); None: as it came. Keyed by
        consumer, ledger and entry: a consumer reads one topic (partition),
        and clients leave the partition out of their ACKs."""
        body: Any = frame.body
        if body is None:
            return None
        consumer = body.consumer_id
        entries = self._thinned.get(consumer)
        if not entries:
            return None
        if body.ack_type == pb.CommandAck.Cumulative:
            for mid in body.message_id:
                here = (mid.ledgerId, mid.entryId)
                for key in [k for k in entries if k < here]:
                    del entries[key]
        changed = False
        ids = list(body.message_id)
        kept_ids = []
        for mid in ids:
            key = (mid.ledgerId, mid.entryId)
            entry = entries.get(key)
            if entry is None:
                kept_ids.append(mid)
                continue
            size, kept = entry
            if mid.ack_set:
                words = _renumbered(list(mid.ack_set), size, kept)
                del mid.ack_set[:]
                mid.ack_set.extend(words)
                changed = True
                if not any(words):
                    del entries[key]
            elif mid.HasField("batch_index") and mid.batch_index >= 0:
                changed = True
                if mid.batch_index >= len(kept):  # not one it got: acknowledges nothing
                    continue
                mid.batch_index = kept[mid.batch_index]
                if mid.HasField("batch_size"):
                    mid.batch_size = size
            else:  # the whole entry
                del entries[key]
            kept_ids.append(mid)
        self._forget_if_empty(consumer)
        if not changed:
            return None
        if not kept_ids:
            return b""
        if len(kept_ids) < len(ids):
            del body.message_id[:]
            body.message_id.extend(kept_ids)
        return encode(command(T.ACK, body))

    def named(self, frame: Frame, now: float) -> None:
        """A PRODUCER or SUBSCRIBE the client sent: the name its messages
        carry, and (a producer may register a schema version) the topic's
        latest schema asked for again."""
        body: Any = frame.body
        if body is None:
            return
        if frame.type == T.PRODUCER:
            if body.HasField("producer_name"):
                self._names[body.producer_id] = body.producer_name
            # The topic as the correlator keeps it: a name that is not
            # UTF-8 (protobuf's bytes) read as the broker reads it.
            topic = text(body.topic)
            self.filtering.forget_schemas(topic, now)
            if body.HasField("schema"):
                self._registers(body.request_id, topic, body.schema)
            # An id the compiled step seals for (asked before and refused,
            # or asked again behind a create timeout) is sealed for this
            # topic, if its chain only seals, or not at all: never kept for
            # the topic it was first asked for (open on another topic, the
            # correlator refuses it before it comes here).
            if self.compiled.pop(body.producer_id, None) is not None:
                assert self.sealing is not None
                self.sealing.discard(body.producer_id)
            self._seal_compiled(body.producer_id, topic)
        elif frame.type == T.SUBSCRIBE:
            self._names[-1 - body.consumer_id] = body.subscription
        elif frame.type == T.GET_OR_CREATE_SCHEMA:
            self._registers(body.request_id, text(body.topic), body.schema)

    def _registers(self, request_id: int, topic: str, schema: Any) -> None:
        registering = self._registering
        if len(registering) >= _REGISTERING_MAX:
            del registering[next(iter(registering))]
        registering[request_id] = (topic, _schema(schema, None))

    def registered(self, frame: Frame, now: float) -> None:
        """The broker's PRODUCER_SUCCESS or GET_OR_CREATE_SCHEMA_RESPONSE:
        a schema version newer than the topic's cached latest was made from
        the schema asked for, which is now the latest (messages that name
        no version were checked against the one before for up to
        LATEST_FOR). An older version is an existing schema the broker
        found again: the latest stays. Not cached: asked for when needed."""
        body: Any = frame.body
        if body is None:
            return
        asked = self._registering.pop(body.request_id, None)
        if asked is None or (
            frame.type == T.GET_OR_CREATE_SCHEMA_RESPONSE and body.HasField("error_code")
        ):
            return
        version = bytes(body.schema_version) if body.HasField("schema_version") else b""
        if not version:  # a producer without a schema
            return
        topic, schema = asked
        latest = self.filtering.schema(topic, None, now)
        if latest is UNKNOWN:
            return
        # Pulsar's versions: 8-byte big-endian numbers. Others: not known newer.
        known = latest.version if isinstance(latest, Schema) else None
        if known is not None and (len(known) != len(version) or version <= known):
            return
        registered = Schema(schema.type, schema.data, schema.properties, version)
        self.filtering.learn_schema(topic, None, registered, now)

    def marked_encrypted(self, frame: Frame) -> bytes | None:
        """A client's PRODUCER for a topic whose SENDs Sluice encrypts,
        with ``encrypted`` set (None: it goes on as it came): what a
        namespace with ``set-encryption-required`` asks of a producer. Only
        there does the broker refuse a message without encryption keys
        ("Messages must be encrypted"), the backstop behind the gate."""
        body: Any = frame.body
        if body is None or body.encrypted:
            return None
        chain = self.filtering.chain(text(body.topic), PRODUCE, self.role)
        if chain is None or chain.sealer is None:
            return None
        marked = pb.CommandProducer()
        marked.CopyFrom(body)
        marked.encrypted = True
        return encode(command(T.PRODUCER, marked))

    def closed(self, producer_id: int) -> None:
        """A producer closed (by the client or the broker): nothing of it
        is kept, so that its id given to a producer on another topic gets
        that topic's filters, not its old topic's sealing on the compiled
        path (which would skip the new topic's other filters)."""
        self.compiled.pop(producer_id, None)
        if self.sealing is not None:
            self.sealing.discard(producer_id)
        self._names.pop(producer_id, None)
        # Its sends' order (and errors held for it: a closing client has
        # failed its pending sends itself) begins again with a new producer.
        self._producers.pop(producer_id, None)
        self._holding.discard(producer_id)

    def _seal_compiled(self, producer_id: int, topic: str) -> None:
        """A producer whose topic's chain only seals: its SENDs sealed on the
        compiled path (``rust/src/seal.rs``), when there is one."""
        if self.sealing is None:
            return
        chain = self.filtering.chain(topic, PRODUCE, self.role)
        if chain is None or chain.hooked or chain.wants_schema or chain.sealer is None:
            return
        name, sealer = chain.sealer
        seal = _SEALS.get(sealer)
        if seal is None:
            assert COMPILED is not None
            seal = _SEALS[sealer] = COMPILED.seal(name)
        if self.sealing.add(producer_id, seal):
            self.compiled[producer_id] = (sealer, seal)

    def _arm(self, producer_id: int, now: float) -> None:
        """The compiled path's key for this producer made good from ``now``
        (the Python path just sealed one of its SENDs: the key was due)."""
        sealer, seal = self.compiled[producer_id]
        if seal.until > now:
            return
        data_key, keys, seconds = sealer.lease()
        seal.arm(data_key, self._keys_of(keys), now + seconds)

    # --- produce -------------------------------------------------------------------

    def send(
        self, frame: Frame, topic: str, chain: Chain, now: float
    ) -> bytes | Frame | Wait | None:
        """What goes on for a SEND: its bytes (maybe rebuilt), a SEND_ERROR
        frame for the client now, None when that error waits for the
        receipts of earlier sends (``answered`` lets it go), or a Wait."""
        body: Any = frame.body
        meta = frame.metadata
        assert meta is not None and body is not None
        schema: Schema | Unknown | None = None
        version = _schema_version(meta)
        if chain.wants_schema:
            schema = self.filtering.schema(topic, version, now)
            if schema is UNKNOWN:
                return Wait(topic, version)
        assert not isinstance(schema, Unknown)
        name = self._names.get(body.producer_id) or meta.producer_name
        if chain.hooked:
            outcome, parts, results = self._run(frame, topic, chain, PRODUCE, name, schema)
        else:
            outcome, parts, results = Outcome(PASS), None, []
        state = self._producers.setdefault(body.producer_id, _Producer())
        last = last_sequence(body)
        count = message_count(meta)
        sealer = chain.sealer
        sealed: Sealed | None = None
        if sealer is not None and not meta.encryption_keys and not _refused(outcome):
            # After every message filter; a message the client encrypted goes on as it is.
            try:
                sealed = sealer[1].seal(topic, parts[2] if parts else bytes(frame.payload))
            except Exception as exc:  # never plaintext instead: refused, whatever on-error says
                _log_sealer(sealer[0], topic, exc)
                self.tap.event(self.conn, Filtered(sealer[0], "error", True, topic, "closed"))
                failed = Reject("filter_error", f"filter {sealer[0]} failed")
                outcome = Outcome(failed, sealer[0], (sealer[0],))
        encoded: bytes | None = None
        if (parts is not None or sealed is not None) and not _refused(outcome):
            limit = self.max_message_size
            try:
                if parts is None:
                    assert sealed is not None
                    encoded = with_payload(frame, self._envelope(sealed), sealed.data, limit)
                else:
                    cmd, changed, data = parts
                    if sealed is not None:
                        changed.MergeFromString(self._envelope(sealed))
                        data = sealed.data
                    encoded = _encoded(frame, cmd, changed, data, limit)
            except LocalProtocolError as exc:  # changed past the frame limit
                why = Reject("too_large", f"the changed message cannot be sent: {exc}")
                by = sealer[0] if sealed is not None and sealer else _last_changed(results)
                outcome = Outcome(why, by)
        if isinstance(outcome.verdict, Reject):
            return self._refuse(frame, topic, outcome, state, last, count)
        state.forwarded = max(state.forwarded, last)
        if encoded is None:
            return frame.raw
        if any(isinstance(r.verdict, Replace) for r in results):
            self._changes(results, True, topic, None if sealed else encoded)
        if sealed is not None:
            assert sealer is not None
            self._report(Outcome(PASS, sealer[0]), "encrypted", True, topic, encoded, "", count)
            if body.producer_id in self.compiled:
                self._arm(body.producer_id, now)
        return encoded

    def _envelope(self, sealed: Sealed) -> bytes:
        """The metadata fields that say how ``sealed`` was encrypted: the
        wrapped keys and the IV."""
        param = pb.MessageMetadata(encryption_param=sealed.param).SerializePartialToString()
        return self._keys_of(sealed.keys) + param

    def _keys_of(self, keys: tuple[WrappedKey, ...]) -> bytes:
        """The wrapped keys as metadata field 13 (serialized once per data key)."""
        if keys is not self._sealed_keys:
            fields = pb.MessageMetadata()
            for wrapped in keys:
                entry = fields.encryption_keys.add(key=wrapped.name, value=wrapped.value)
                for k, v in wrapped.metadata.items():
                    entry.metadata.add(key=k, value=v)
            self._sealed_keys, self._keys_field = keys, fields.SerializePartialToString()
        return self._keys_field

    def _refuse(
        self, frame: Frame, topic: str, outcome: Outcome, state: _Producer, last: int,
        count: int = 1,
    ) -> Frame | None:  # fmt: skip
        reject = outcome.verdict
        assert isinstance(reject, Reject)
        body: Any = frame.body
        java = _java(self.client_version)
        error = pb.CommandSendError(
            producer_id=body.producer_id,
            # Java matches an error to its send by the batch's highest id, C++ by the first.
            sequence_id=last if java else body.sequence_id,
            error=_error_code(reject, self.client_version, outcome.filter),  # type: ignore[arg-type]
            message=reject.message or f"refused by filter {outcome.filter}: {reject.reason}",
        )
        reply = own_frame(T.SEND_ERROR, error)
        # A batch is refused whole: every message of it counts.
        self._report(outcome, "rejected", True, topic, None, reject.reason, count)
        after = self._in_flight(body.producer_id, state)
        if after > state.answered:  # earlier sends still wait for receipts
            if state.errors is None:
                state.errors = deque()
            state.errors.append((after, reply))
            self._holding.add(body.producer_id)
            return None
        return reply

    def _in_flight(self, producer_id: int, state: _Producer) -> int:
        """The highest sequence id of a producer's sends on the way (-1:
        none). A producer sealed on the compiled path has its SENDs
        forwarded there too: the send table knows them all."""
        if producer_id not in self.compiled:
            return state.forwarded
        waiting = self._sends.waiting()
        return max((s[1] for s in waiting if s[0] == producer_id), default=-1)

    def unavailable(self, frame: Frame, topic: str, why: str) -> Frame | None:
        """Refuse a SEND whose schema could not be had, with an error on
        which clients reconnect and send it again (ServiceNotReady)."""
        body: Any = frame.body
        state = self._producers.setdefault(body.producer_id, _Producer())
        last = last_sequence(body)
        reject = Reject("schema_unavailable", f"Sluice cannot learn the schema of {topic}: {why}",
                        "ServiceNotReady")  # fmt: skip
        return self._refuse(frame, topic, Outcome(reject, "schema"), state, last)

    def answered(self, frame: Frame) -> list[Frame]:
        """A SEND_RECEIPT or SEND_ERROR from the broker, after which SEND_ERRORs
        of Sluice's own may now go to the client: those."""
        body: Any = frame.body
        if body is None:
            return []
        state = self._producers.get(body.producer_id)
        if state is None:
            return []
        seq = last_sequence(body) if frame.type == T.SEND_RECEIPT else body.sequence_id
        state.answered = max(state.answered, seq)
        errors = state.errors
        out: list[Frame] = []
        while errors and errors[0][0] <= state.answered:
            out.append(errors.popleft()[1])
        if not errors:
            self._holding.discard(body.producer_id)
        return out

    # --- deliver -------------------------------------------------------------------

    def deliver(self, frame: Frame, topic: str, chain: Chain) -> tuple[bytes, bytes]:
        """What goes to the client for a MESSAGE (b"": nothing) and what
        Sluice sends the broker in the consumer's name (acks and permits)."""
        body: Any = frame.body
        meta = frame.metadata
        assert body is not None and meta is not None
        name = self._names.get(-1 - body.consumer_id)
        count = message_count(meta)
        results: list[Outcome] = []
        if self._thinned:  # delivered again: numbered as it is this time
            self._thin(body, count, None)
        refusal: Outcome | None = None
        sealer = chain.sealer
        if sealer is not None and meta.encryption_keys:
            # A chunk too: clients encrypt each chunk on its own.
            opened = self._open(frame, topic, sealer[1])
            if opened is not None:
                frame, meta = opened, opened.metadata
                assert meta is not None
                self._report(Outcome(PASS, sealer[0]), "decrypted", False, topic, frame.raw, "",
                             count)  # fmt: skip
            elif sealer[1].undecryptable == "skip":
                text = "no key Sluice holds decrypts it"
                refusal = Outcome(Reject("undecryptable", text), sealer[0])
        if refusal is None and not chain.hooked:
            return frame.raw, b""
        if refusal is not None:
            pass
        elif _chunked(meta):
            refusal = Outcome(
                Reject("chunked", "chunked messages are not filtered"), chain.names[0]
            )
        elif (too_large := self._unpacks_too_large(meta)) is not None:
            refusal = Outcome(too_large, chain.names[0])
        else:
            try:
                messages = self._messages(frame, topic, DELIVER, name, None)
            except RemoteProtocolError as exc:
                refusal = Outcome(Reject("unreadable", str(exc)), chain.names[0])
            else:
                results = [chain.run(m) for m in messages]
                if not meta.encryption_keys:  # (an encrypted batch is one message to filters)
                    count = len(messages)
                for r in results:
                    self._errors(r, False, topic)
                refused = [r for r in results if isinstance(r.verdict, Reject)]
                refusal = refused[0] if refused else None
                replacing = [r for r in results if isinstance(r.verdict, Replace)]
                if refusal is None and (unchangeable := _unchangeable(meta, replacing)):
                    refusal, results = unchangeable, [unchangeable]
        kept = [i for i, r in enumerate(results) if not isinstance(r.verdict, Reject)]
        replaced = [r for r in results if isinstance(r.verdict, Replace)]
        rebuilt: bytes | None = None
        if kept and (len(kept) < len(results) or replaced):
            try:
                kept_outcomes = [(i, results[i]) for i in kept]
                parts = _rebuild(frame, kept_outcomes, body)
                rebuilt = _encoded(frame, *parts, self.max_message_size)
            except LocalProtocolError as exc:  # changed past the frame limit: not delivered
                why = Reject("too_large", f"the changed message cannot be delivered: {exc}")
                refusal, kept, replaced = Outcome(why, (replaced or results)[-1].filter), [], []
        skipped = count - len(kept)
        to_broker = b""
        if refusal is not None and skipped:
            reject = refusal.verdict
            assert isinstance(reject, Reject)
            self._report(refusal, "rejected", False, topic, None, reject.reason, skipped)
            if not kept:  # the whole entry: acknowledged in the consumer's name
                ack = pb.CommandAck(
                    consumer_id=body.consumer_id,
                    ack_type=pb.CommandAck.Individual,
                    message_id=[_entry_id(body.message_id)],
                )
                to_broker = encode(command(T.ACK, ack))
            # The broker counted them against the consumer's permits, which
            # the consumer, never seeing them, would not give back.
            flow = pb.CommandFlow(consumer_id=body.consumer_id, messagePermits=skipped)
            to_broker += encode(command(T.FLOW, flow))
        if not kept:
            return b"", to_broker
        if rebuilt is None:
            return frame.raw, to_broker
        if len(kept) < len(results) and is_batch(meta) and not meta.encryption_keys:
            self._thin(body, len(results), kept)
        if replaced:
            self._changes(replaced, False, topic, rebuilt)
        return rebuilt, to_broker

    def _open(self, frame: Frame, topic: str, sealer: Sealer) -> Frame | None:
        """A delivery Sluice decrypted, as the frame the consumer gets (the
        metadata's encryption fields gone), or None when it cannot."""
        meta = frame.metadata
        assert meta is not None and frame.command is not None
        keys = [
            WrappedKey(k.key, k.value, {kv.key: kv.value for kv in k.metadata})
            for k in meta.encryption_keys
        ]
        try:
            plaintext = sealer.open(topic, keys, bytes(meta.encryption_param), bytes(frame.payload))
        except Exception as exc:  # a sealer's bug: the delivery is undecryptable
            _log_sealer("encrypt", topic, exc)
            return None
        if plaintext is None:
            return None
        clear = pb.MessageMetadata()
        clear.CopyFrom(meta)
        for field in ("encryption_keys", "encryption_param", "encryption_algo"):
            clear.ClearField(field)
        try:
            raw = _encoded(frame, frame.command, clear, plaintext, self.max_message_size)
        except LocalProtocolError:
            return None
        return decode_frame(raw)

    # --- both ----------------------------------------------------------------------

    def _run(
        self,
        frame: Frame,
        topic: str,
        chain: Chain,
        direction: Direction,
        name: str | None,
        schema: Schema | None,
    ) -> tuple[Outcome, Parts | None, list[Outcome]]:
        """The chain over a frame's messages: the first refusal, or what
        changed (the frame's parts rebuilt) or not (None); and each
        message's outcome."""
        meta = frame.metadata
        assert meta is not None
        if _chunked(meta):
            why = "chunked messages are not filtered: send them unchunked to this topic"
            return Outcome(Reject("chunked", why), chain.names[0]), None, []
        too_large = self._unpacks_too_large(meta)
        if too_large is not None:
            return Outcome(too_large, chain.names[0]), None, []
        try:
            messages = self._messages(frame, topic, direction, name, schema)
        except RemoteProtocolError as exc:
            unreadable = Reject("unreadable", f"unreadable message: {exc}")
            return Outcome(unreadable, chain.names[0]), None, []
        results: list[Outcome] = []
        for message in messages:
            outcome = chain.run(message)
            self._errors(outcome, direction == PRODUCE, topic)
            if isinstance(outcome.verdict, Reject):
                if len(messages) > 1:
                    reject = outcome.verdict
                    text = reject.message or reject.reason
                    outcome = Outcome(
                        Reject(reject.reason, f"message {message.index} of the batch: {text}",
                               reject.error),
                        outcome.filter, outcome.errors,
                    )  # fmt: skip
                return outcome, None, results
            results.append(outcome)
        replaced = [r for r in results if isinstance(r.verdict, Replace)]
        if not replaced:
            return Outcome(PASS), None, results
        unchangeable = _unchangeable(meta, replaced)
        if unchangeable is not None:
            return unchangeable, None, results
        return replaced[-1], _rebuild(frame, list(enumerate(results)), frame.body), results

    def _unpacks_too_large(self, meta: Any) -> Reject | None:
        """A compressed message (or batch) that says it unpacks past the
        broker's message size: refused unread. The broker bounds a frame, not
        what it unpacks to; a few KB of zstd can unpack to 256 MiB, which the
        filters would take minutes of the proxy's one thread to read. (A size
        that lies is refused when unpacked. Encrypted: never unpacked, the
        ciphertext goes to filters whole.)"""
        if meta.compression == pb.NONE or meta.uncompressed_size <= self.max_message_size:
            return None
        if meta.encryption_keys:
            return None
        return Reject(
            "too_large",
            f"the message unpacks to {meta.uncompressed_size} bytes: filters read at most "
            f"the broker's message size, {self.max_message_size}",
        )

    def _messages(
        self,
        frame: Frame,
        topic: str,
        direction: Direction,
        name: str | None,
        schema: Schema | None,
    ) -> list[Message]:
        meta = frame.metadata
        assert meta is not None
        version = _schema_version(meta)
        role, client = self.role, self.conn.client
        if meta.encryption_keys:
            ciphertext = bytes(frame.payload)
            return [_message(meta, ciphertext, direction, topic, role, client, name, 0, 1,
                             version, schema, True)]  # fmt: skip
        data = payload_bytes(frame)
        if not is_batch(meta):
            return [_message(meta, data, direction, topic, role, client, name, 0, 1, version,
                             schema)]  # fmt: skip
        entries = split_batch(data, meta.num_messages_in_batch, MAX_BATCH_MESSAGES)
        count = len(entries)
        facts = (direction, topic, role, client, name)
        return [
            _message(entry.metadata, entry.payload, *facts, i, count, version, schema)
            for i, entry in enumerate(entries)
        ]

    def _errors(self, outcome: Outcome, from_client: bool, topic: str) -> None:
        for name in outcome.errors:
            failed_closed = isinstance(outcome.verdict, Reject) and outcome.filter == name
            reason = "closed" if failed_closed else "open"
            self.tap.event(self.conn, Filtered(name, "error", from_client, topic, reason))

    def _changes(
        self, outcomes: list[Outcome], from_client: bool, topic: str, sent: bytes | None
    ) -> None:
        """One ``replaced`` event per filter that changed messages of a frame
        (how many), the frame as it went on with the last."""
        counted: dict[str, int] = {}
        for outcome in outcomes:
            for name in outcome.changed:
                counted[name] = counted.get(name, 0) + 1
        last = len(counted) - 1
        for i, (name, messages) in enumerate(counted.items()):
            frame = sent if i == last else None
            event = Filtered(name, "replaced", from_client, topic, "", messages, frame)
            self.tap.event(self.conn, event)

    def _report(
        self,
        outcome: Outcome,
        action: str,
        from_client: bool,
        topic: str,
        sent: bytes | None,
        reason: str = "",
        messages: int = 1,
    ) -> None:
        event = Filtered(outcome.filter or "?", action, from_client, topic, reason, messages, sent)
        self.tap.event(self.conn, event)


def message_count(meta: pb.MessageMetadata) -> int:
    """The messages a SEND or MESSAGE holds, as the filter metrics count
    them: a batch's num_messages_in_batch, else 1. A count below zero (an
    int32 as sent) counts none: a metric's counter only goes up. The
    compiled step counts a sealed SEND the same way (rust/src/step.rs)."""
    return max(meta.num_messages_in_batch, 0) if is_batch(meta) else 1


def last_sequence(body: Any) -> int:
    """The last sequence id a SEND or SEND_RECEIPT covers: a batch's
    highest, else its own. Apache Pulsar answers a SEND that is no batch
    with a highest_sequence_id of -1 (2**64 - 1 as the field's unsigned
    type): none, not past every sequence id."""
    seq: int = body.sequence_id
    if body.HasField("highest_sequence_id") and seq < body.highest_sequence_id < 1 << 63:
        return int(body.highest_sequence_id)
    return seq


def _unchangeable(meta: pb.MessageMetadata, replaced: list[Outcome]) -> Outcome | None:
    """The refusal of changes a message the client encrypted cannot take:
    a new payload (it would reach consumers as ciphertext that is not), or
    anything in a batch (its messages' properties are in the ciphertext).
    An unbatched one's properties and key travel in the clear: they may
    change. None when the changes can be made."""
    if not meta.encryption_keys or not replaced:
        return None
    if is_batch(meta) or any(
        isinstance(r.verdict, Replace) and r.verdict.payload is not None for r in replaced
    ):
        why = "an encrypted message's payload, or an encrypted batch, cannot be changed"
        return Outcome(Reject("encrypted", why), replaced[0].filter)
    return None


def _chunked(meta: pb.MessageMetadata) -> bool:
    return meta.HasField("chunk_id") or meta.num_chunks_from_msg > 1


def _message(
    meta: Any,
    payload: bytes,
    direction: Direction,
    topic: str,
    role: str | None,
    client: str,
    name: str | None,
    index: int,
    count: int,
    version: bytes | None,
    schema: Schema | None,
    encrypted: bool = False,
) -> Message:
    """A ``Message`` with the facts its metadata (whole, or one entry of a
    batch) gives; made per message, so by position."""
    return Message(
        direction, topic, payload,
        {kv.key: kv.value for kv in meta.properties} if meta.properties else {},
        meta.partition_key if meta.HasField("partition_key") else None,
        meta.partition_key_b64_encoded, meta.event_time or None, role, client, name, index,
        count, version, schema, encrypted, meta.null_value, meta,
    )  # fmt: skip


def _entry_id(message_id: pb.MessageIdData) -> pb.MessageIdData:
    """The whole entry a delivery was: no batch index."""
    return pb.MessageIdData(
        ledgerId=message_id.ledgerId, entryId=message_id.entryId, partition=message_id.partition
    )


def _apply(meta: Any, replace: Replace) -> None:
    """A Replace's properties and key, into a message's metadata."""
    if replace.properties is not None:
        del meta.properties[:]
        for key, value in replace.properties.items():
            meta.properties.add(key=key, value=value)
    if replace.key is not None:
        meta.partition_key = replace.key
        meta.partition_key_b64_encoded = False


Parts = tuple[pb.BaseCommand, pb.MessageMetadata, bytes]
"""A payload frame taken apart to be encoded again: its command, its
metadata and its payload as it goes on the wire (compressed, maybe encrypted)."""


def _rebuild(frame: Frame, kept: list[tuple[int, Outcome]], body: Any) -> Parts:
    """``frame`` with the messages ``kept`` (by index), each as its outcome
    says: compressed again with its codec, sizes and counts made anew; the
    command as it was (but a redelivered batch's ack set)."""
    old = frame.metadata
    assert old is not None and frame.command is not None
    meta = pb.MessageMetadata()
    meta.CopyFrom(old)
    cmd = frame.command
    if old.encryption_keys:  # its properties and key only (_unchangeable): the payload as it came
        ((index, outcome),) = kept
        if isinstance(outcome.verdict, Replace):
            _apply(meta, outcome.verdict)
        return cmd, meta, bytes(frame.payload)
    if not is_batch(old):
        ((index, outcome),) = kept
        data = payload_bytes(frame)
        if isinstance(outcome.verdict, Replace):
            _apply(meta, outcome.verdict)
            if outcome.verdict.payload is not None:
                data = outcome.verdict.payload
                meta.ClearField("null_value")  # a tombstone given a value is one no more
    else:
        entries = split_batch(payload_bytes(frame), old.num_messages_in_batch, MAX_BATCH_MESSAGES)
        parts: list[tuple[pb.SingleMessageMetadata, bytes]] = []
        for index, outcome in kept:
            entry = entries[index]
            assert entry.metadata is not None
            single = pb.SingleMessageMetadata()
            single.CopyFrom(entry.metadata)
            payload = entry.payload
            if isinstance(outcome.verdict, Replace):
                _apply(single, outcome.verdict)
                if outcome.verdict.payload is not None:
                    payload = outcome.verdict.payload
                    single.ClearField("null_value")
            single.payload_size = len(payload)
            parts.append((single, payload))
        data = build_batch(parts)
        meta.num_messages_in_batch = len(parts)
        if frame.type == T.MESSAGE and len(kept) != len(entries) and body.ack_set:
            cmd = pb.BaseCommand()
            cmd.CopyFrom(frame.command)
            _keep_ack_set(cmd.message, [i for i, _ in kept])
    meta.uncompressed_size = len(data)
    return cmd, meta, compress(meta.compression, data)


def _encoded(
    frame: Frame, cmd: pb.BaseCommand, meta: pb.MessageMetadata, data: bytes, limit: int
) -> bytes:
    """Parts encoded as a frame, the checksum made anew and any broker entry
    metadata as it came."""
    return encode_payload(
        cmd, meta, data, checksum=True,
        broker_entry_metadata=frame.broker_entry_metadata, max_message_size=limit,
    )  # fmt: skip


def _log_sealer(name: str, topic: str, exc: Exception) -> None:
    log.warning("filter %s could not seal or open an entry of %s: %s: %s",
                name, topic, type(exc).__name__, exc)  # fmt: skip


def _refused(outcome: Outcome) -> bool:
    return isinstance(outcome.verdict, Reject)


def _last_changed(results: list[Outcome]) -> str | None:
    changed = [r.filter for r in results if isinstance(r.verdict, Replace)]
    return changed[-1] if changed else None


def _unacked(words: list[int], i: int) -> bool:
    """Bit ``i`` of an ack set (set: entry ``i`` still unacknowledged); an
    ack set too short to hold it says acknowledged."""
    return i // 64 < len(words) and bool((words[i // 64] >> (i % 64)) & 1)


def _ack_words(unacked: Iterable[int], size: int) -> list[int]:
    """An ack set of ``size`` entries with the bits ``unacked`` set, in
    protobuf's signed 64-bit words."""
    packed = [0] * ((size + 63) // 64)
    for i in unacked:
        packed[i // 64] |= 1 << (i % 64)
    return [w - (1 << 64) if w >= 1 << 63 else w for w in packed]


def _renumbered(words: list[int], size: int, kept: tuple[int, ...]) -> list[int]:
    """A consumer's ack set (bit j: its entry j still unacknowledged) of a
    thinned batch, in the batch's own numbering: entry ``kept[j]`` keeps bit
    j, an entry left out is acknowledged."""
    return _ack_words((i for j, i in enumerate(kept) if _unacked(words, j)), size)


def _keep_ack_set(message: Any, kept: list[int]) -> None:
    """A redelivered batch's ack set (bit i: entry i still unacknowledged),
    for the entries kept, renumbered as the batch now is."""
    words = list(message.ack_set)
    packed = _ack_words((j for j, i in enumerate(kept) if _unacked(words, i)), len(kept))
    del message.ack_set[:]
    message.ack_set.extend(packed)
