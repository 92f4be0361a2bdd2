"""Pulsar's frame records: laid out on the proxy's hot path, summarized when read.

``FrameRecorder`` is the recorder's summarizer for Pulsar
(``ProtocolSpec.summarizer``): it writes lean ``frame`` records, the bytes
without a summary, laid out in bulk (compiled where built). ``FrameSummaries``
(``ProtocolSpec.summaries``) works out each frame's summary ``s`` when a
recording is read (``read_records``), following the conversation with a
``Correlator``. See docs/recording-format.md.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sluice.protocols.pulsar import Frame, decode_frame, pb
from sluice.protocols.pulsar.correlation import CLIENT_TYPES, SERVER_TYPES, Correlator
from sluice.protocols.pulsar.decoder import COMPILED, COMPILED_PACK, ScannedBatch
from sluice.protocols.pulsar.frame import (
    BODY_FIELD,
    COMMAND_NAMES,
    SEND,
    SEND_RECEIPT,
    command_name,
    standalone,
    text,
)
from sluice.protocols.pulsar.redact import redacted, sensitive, withheld
from sluice.recording.format import (
    BROKER_TO_CLIENT,
    CLIENT_TO_BROKER,
    PayloadPolicy,
    Record,
    packer,
)

# The frame record as ``FrameRecorder.packed`` lays it out: a msgpack map of
# k, c, d, t, w, n, raw (and p when the payload is left out), in that order,
# "c" a uint32, "t" and "w" uint64s, "n" and the length of "raw" each a
# uint8 (bin8) below 256 and a uint32 (bin32) from there. Everything up to
# "n" is the same for every frame of one read.
_DIRECTIONS = frozenset({CLIENT_TO_BROKER, BROKER_TO_CLIENT})  # positive fixints
_MAP_7, _MAP_8 = 0x87, 0x88  # without "p", with it
_PREFIX = struct.Struct(">B11sI2sB3sQ3sQ")  # the map's first byte, then k, c, d, t, w
_K = b"\xa1k\xa5frame\xa1c\xce"  # "k": "frame", "c": <uint32>
_D, _T, _W = b"\xa1d", b"\xa1t\xcf", b"\xa1w\xcf"
_N = (b"\xa1n\xce", b"\xa1n\xcc")  # by n < 256
_RAW = (b"\xa3raw\xc6", b"\xa3raw\xc4")  # by len(raw) < 256
# "n" and raw's length, by (n < 256) * 2 + (len(raw) < 256); a short n has a short raw.
_SIZES = tuple(
    struct.Struct(">3s" + "BI"[not n_small] + "5s" + "BI"[not raw_small])
    for n_small in (False, True)
    for raw_small in (False, True)
)
_HASHED = struct.Struct(">4sI2s")  # "p": [size, <bin8 of 32>] (the digest follows)
_HASHED_KEYS = (b"\xa1p\x92\xce", b"\xc4\x20")
_SIZED = struct.Struct(">4sI")  # "p": [size]
_SIZED_KEY = b"\xa1p\x91\xce"


_PACK_CODES = {PayloadPolicy.FULL: 0, PayloadPolicy.HASH: 1, PayloadPolicy.NONE: 2}


class FrameRecorder:
    """Builds Pulsar ``frame`` records on the proxy's hot path: the bytes per
    the payload policy and credentials redacted, nothing more. The summary
    (``s``) is worked out when the recording is read (``FrameSummaries``):
    that took two thirds of the recorder's time per frame, for a result
    that follows from the recorded bytes. Only what cannot be had from them
    later is recorded: the payload's size and digest when the payload is
    left out, and the validation problem (the checksum covers the payload).
    """

    def __init__(self, payloads: PayloadPolicy = PayloadPolicy.HASH) -> None:
        self.payloads = PayloadPolicy(payloads)
        self._hash = self.payloads is PayloadPolicy.HASH
        self._keep = self.payloads is PayloadPolicy.FULL
        self._pack = packer()
        # The compiled packer (rust/src/record.rs) lays out what this class's
        # Python code would, byte for byte, for the frames the compiled
        # scanner vouched for; None: the Python code for every frame.
        self._compiled = COMPILED_PACK
        self._code = _PACK_CODES[self.payloads]
        # What a compiled relay step lays frames out with (rust/src/step.rs).
        self.compiled_code = self._code if COMPILED_PACK is not None else None

    def forget(self, conn: int) -> None:
        """Nothing is kept per connection."""

    def packed(
        self, conn: int, direction: int, mono_ns: int, wall_ns: int, frames: Sequence[Frame]
    ) -> list[bytes]:
        """``record()`` of each of ``frames`` (one read's, all with these
        times), packed: what the recorder queues.

        A valid frame without credentials (nearly every frame) is laid out
        here directly, as msgpack's encoding of the same map with the same
        keys in the same order, integers at a fixed width: a fraction of the
        cost of building the dict and packing it. Anything else (credentials,
        an invalid frame, a value too wide for its field) takes that way.
        """
        try:
            prefix = _PREFIX.pack(_MAP_7, _K, conn, _D, direction, _T, mono_ns, _W, wall_ns)
        except struct.error:  # a value outside its field's width (a clock before 1970)
            prefix = b""
        if not prefix or direction not in _DIRECTIONS:
            return [self._pack(self.record(conn, direction, mono_ns, wall_ns, f)) for f in frames]
        compiled = self._compiled
        if compiled is None:
            return self._laid_out(conn, direction, mono_ns, wall_ns, prefix, frames)
        if type(frames) is ScannedBatch:  # laid out from the read's bytes
            done = frames.packed(prefix, self._code)
            # Nearly always none is left: looked for at C speed first.
            left = [i for i, record in enumerate(done) if record is None] if None in done else []
            if left:
                rest = self._laid_out(conn, direction, mono_ns, wall_ns, prefix,
                                      [frames.frame(i) for i in left])  # fmt: skip
                for i, record in zip(left, rest, strict=True):
                    done[i] = record
            return done  # type: ignore[return-value]  # no None is left
        # The compiled packer leaves to ``_laid_out`` every frame whose
        # properties were not counted (-1): a frame Sluice wrote itself
        # (``own``) among them, so its record keeps the mark.
        done = compiled(prefix, frames if type(frames) is list else list(frames), self._code)
        left = [i for i, record in enumerate(done) if record is None]
        if left:
            rest = self._laid_out(conn, direction, mono_ns, wall_ns, prefix,
                                  [frames[i] for i in left])  # fmt: skip
            for i, record in zip(left, rest, strict=True):
                done[i] = record
        return done  # type: ignore[return-value]  # no None is left

    def _laid_out(
        self,
        conn: int,
        direction: int,
        mono_ns: int,
        wall_ns: int,
        prefix: bytes,
        frames: Sequence[Frame],
    ) -> list[bytes]:
        """``packed`` in Python: the reference for the compiled packer."""
        with_p = bytes((_MAP_8,)) + prefix[1:]
        keep, hashing, sha256 = self._keep, self._hash, hashlib.sha256
        out: list[bytes] = []
        # The frames of a read mostly have one size (and receipts another):
        # the record's head and the payload's size are laid out once per size.
        head_of: tuple[int, int] = (-1, -1)  # (n, offset) that head and tail are for
        head = tail = b""
        for frame in frames:
            if frame.error is not None or frame.own or sensitive(frame):
                out.append(self._pack(self.record(conn, direction, mono_ns, wall_ns, frame)))
                continue
            wire = frame.raw
            n = len(wire)
            offset = -1 if keep else frame.payload_offset
            if (n, offset) != head_of:
                head_of = (n, offset)
                n_small = n < 256
                if offset < 0:
                    sizes = _SIZES[3 if n_small else 0].pack(_N[n_small], n, _RAW[n_small], n)
                    head = prefix + sizes
                else:
                    raw_small = offset < 256
                    sizes = _SIZES[n_small * 2 + raw_small].pack(
                        _N[n_small], n, _RAW[raw_small], offset
                    )
                    head = with_p + sizes
                    tail = (
                        _HASHED.pack(_HASHED_KEYS[0], n - offset, _HASHED_KEYS[1])
                        if hashing
                        else _SIZED.pack(_SIZED_KEY, n - offset)
                    )
            if offset < 0:
                out.append(head + wire)
            elif hashing:
                # A small payload's copy hashes sooner than a memoryview of it.
                payload = wire[offset:] if n - offset < 4096 else memoryview(wire)[offset:]
                out.append(b"".join((head, wire[:offset], tail, sha256(payload).digest())))
            else:
                out.append(b"".join((head, wire[:offset], tail)))
        return out

    def record(self, conn: int, direction: int, mono_ns: int, wall_ns: int, frame: Frame) -> Record:
        wire = frame.raw
        record: Record = {"k": "frame", "c": conn, "d": direction, "t": mono_ns, "w": wall_ns,
                          "n": len(wire), "raw": wire}  # fmt: skip
        if frame.own:  # Sluice wrote it to the client: no broker sent it
            record["own"] = True
        error = frame.error
        if error is not None and (why_not := withheld(frame)) is not None:
            # None of its bytes, so its summary now: what parsed of it, and why.
            summary = summarize(frame)
            summary.update(invalid=error.problem.value, why=error.message, withheld=why_not)
            if record.pop("own", False):
                summary["own"] = True
            record["raw"] = b""
            record["s"] = summary
            return record
        offset = frame.payload_offset
        if sensitive(frame):
            clean = redacted(frame)
            record["raw"] = clean
            record["redacted"] = True
            if offset >= 0:  # re-encoded metadata moved the payload
                offset = len(clean) - (len(wire) - offset)
        if offset >= 0 and not self._keep:
            payload = memoryview(wire)[frame.payload_offset :]
            if self._hash:
                record["p"] = [len(payload), hashlib.sha256(payload).digest()]
            else:
                record["p"] = [len(payload)]
            record["raw"] = record["raw"][:offset]
        if error is not None:
            record["invalid"] = error.problem.value
            record["why"] = error.message
        return record


# The metadata's num_messages_in_batch, num_chunks_from_msg, chunk_id, uuid
# and total_chunk_msg_size.
Counted = tuple[int, int, int, str, int]
# What the compiled summary reader gives for a recorded hot frame (see
# rust/src/summary.rs): (type, a, b, message_id, counted or None without
# metadata); None: summarize it in Python.
HotSummary = tuple[int, int, int, list[int] | None, Counted | None]
Summary = Callable[[bytes], HotSummary | None]


COMPILED_SUMMARY: Final[Summary | None] = COMPILED.summary if COMPILED is not None else None
"""The compiled summary reader FrameSummaries uses by default, or None."""


class FrameSummaries:
    """Fills in the summary ``s`` of Pulsar ``frame`` records as they are read.

    Keeps a Correlator per connection, as the proxy does, so that frames
    that carry only a producer or consumer id (and answers, through their
    request) are given their topic. A segment re-states its open
    connections with the producers and consumers they had: a reader that
    starts at a later segment learns those topics from there.

    SEND, SEND_RECEIPT, MESSAGE, FLOW and ACK frames (nearly all) are read
    by compiled code where it is built (``COMPILED_SUMMARY``): one call
    gives the numbers their summary is made of, instead of parsing the
    command and metadata into protobuf objects. It leaves anything unusual
    to the Python path (``decode_frame`` and ``summarize``), the reference;
    tests/test_compiled_summaries.py checks that both give the same records.
    """

    def __init__(self, *, compiled: bool | None = None) -> None:
        """``compiled``: the compiled summary reader (True: it must be
        there), Python alone (False), or the compiled one when built (None)."""
        if compiled and COMPILED_SUMMARY is None:
            raise RuntimeError("the compiled summary reader (sluice._frames) is not built")
        self._compiled = COMPILED_SUMMARY if compiled is not False else None
        self._correlators: dict[int, Correlator] = {}

    def opened(self, record: Record) -> None:
        producers = record.pop("producers", None)
        consumers = record.pop("consumers", None)
        conn = record["c"]
        if conn in self._correlators:  # read from its start: what we know is as good
            return
        correlator = self._correlators[conn] = Correlator()
        if isinstance(producers, dict):
            correlator.producers.update(producers)
        if isinstance(consumers, dict):
            correlator.consumers.update(consumers)

    def closed(self, record: Record) -> None:
        self._correlators.pop(record["c"], None)

    def fill(self, record: Record) -> None:
        conn = record["c"]
        correlator = self._correlators.get(conn)
        if correlator is None:
            correlator = self._correlators[conn] = Correlator()
        raw = record["raw"]
        compiled = self._compiled
        hot = compiled(raw) if compiled is not None else None
        from_client = record["d"] == CLIENT_TO_BROKER
        # Summarize against the state before this frame (a CLOSE_PRODUCER
        # still has its topic), then let answers borrow their request's topic.
        topic: str | None = None
        if hot is None:
            frame = decode_frame(standalone(raw))
            summary = summarize(frame, correlator)
            if frame.type in (CLIENT_TYPES if from_client else SERVER_TYPES):  # the rest: no-ops
                done = correlator.observe(frame, from_client, record["t"] / 1e9)
                topic = done.topic if done is not None else None
        else:
            summary = _hot_summary(hot, correlator)
            if hot[0] in (CLIENT_TYPES if from_client else SERVER_TYPES):
                topic = _observe_hot(hot, correlator, record["t"] / 1e9)
        if topic and "topic" not in summary:
            summary["topic"] = topic
        if "invalid" in record:
            summary["invalid"] = record.pop("invalid")
            summary["why"] = record.pop("why", "")
        if record.pop("redacted", False):
            summary["redacted"] = True
        if record.pop("own", False):  # optional: absent from broker frames and older recordings
            summary["own"] = True
        payload = record.pop("p", None)
        if isinstance(payload, list) and payload:
            summary["payload"] = (
                {"size": payload[0], "sha256": payload[1].hex()}
                if len(payload) > 1
                else {"size": payload[0]}
            )
        record["s"] = summary


def _hot_summary(hot: HotSummary, correlator: Correlator) -> dict[str, Any]:
    """What ``summarize`` makes of a hot frame, from the numbers the
    compiled reader read."""
    kind, a, b, mid, counted = hot
    if kind in (SEND, SEND_RECEIPT):
        out: dict[str, Any] = {"cmd": COMMAND_NAMES[kind], "pid": a, "seq": b}
    else:  # MESSAGE, FLOW, ACK (without a request_id: a request stays in Python)
        out = {"cmd": COMMAND_NAMES[kind], "cid": a}
    _resolve_topic(out, None, correlator)
    if mid is not None:
        out["mid"] = mid
    if counted is not None:
        _count_messages(out, *counted)
    return out


def _observe_hot(hot: HotSummary, correlator: Correlator, now: float) -> str | None:
    """What ``Correlator.observe`` does with a hot frame it is given (a
    client's SEND or ACK, a broker's SEND_RECEIPT), from its ids as the
    relay does: the topic of the request it answers, if any."""
    kind, a, b = hot[0], hot[1], hot[2]
    if kind == SEND:
        correlator.sending(a, b, now)
    elif kind == SEND_RECEIPT:
        sent = correlator.sends.sent(a, b)
        return sent[1] if sent is not None else None
    # An ACK without a request_id (with one it is not the compiled reader's):
    # nothing to keep.
    return None


_ID_FIELDS = (
    ("request_id", "rid"),
    ("producer_id", "pid"),
    ("sequence_id", "seq"),
    ("consumer_id", "cid"),
)


@dataclass(frozen=True, slots=True)
class _Shape:
    """Which of the summarized fields a command type's body has."""

    ids: tuple[tuple[str, str], ...]  # (field, short name), in _ID_FIELDS order
    topic: bool
    message_id: bool  # a single message_id (ACK's is a list, and not summarized)
    error: bool


def _shape(type_: int, field: str) -> _Shape:
    body = pb.BaseCommand.DESCRIPTOR.fields_by_name[field].message_type
    assert body is not None
    fields = body.fields_by_name
    return _Shape(
        tuple((name, short) for name, short in _ID_FIELDS if name in fields),
        "topic" in fields,
        "message_id" in fields and type_ != pb.BaseCommand.ACK,
        "error" in fields,
    )


# Worked out once per command type instead of asking each frame's descriptor.
_SHAPES: dict[int, _Shape] = {t: _shape(t, field) for t, field in BODY_FIELD.items()}
_ERROR_NAMES: dict[int, str] = {value: name for name, value in pb.ServerError.items()}


def summarize(frame: Frame, correlator: Correlator | None = None) -> dict[str, Any]:
    """Command, ids and topic of a frame, as plain values (the validation
    problem is the recorder's: ``FrameRecorder``)."""
    t = frame.type
    name = COMMAND_NAMES.get(t)
    out: dict[str, Any] = {"cmd": name if name is not None else command_name(t)}
    body: Any = frame.body
    if body is not None:
        shape = _SHAPES[t]
        for field_name, short in shape.ids:
            if body.HasField(field_name):
                out[short] = getattr(body, field_name)
        topic = text(body.topic) if shape.topic and body.HasField("topic") else None
        _resolve_topic(out, topic, correlator)
        if shape.message_id and body.HasField("message_id"):
            mid = body.message_id
            out["mid"] = [mid.ledgerId, mid.entryId, mid.partition, mid.batch_index]
        if shape.error and body.HasField("error"):
            error = body.error
            known = _ERROR_NAMES.get(error)
            out["error"] = known if known is not None else pb.ServerError.Name(error)
    meta = frame.metadata
    if meta is not None:
        _count_messages(out, meta.num_messages_in_batch, meta.num_chunks_from_msg,
                        meta.chunk_id, text(meta.uuid), meta.total_chunk_msg_size)  # fmt: skip
    return out


def _resolve_topic(out: dict[str, Any], topic: str | None, correlator: Correlator | None) -> None:
    """The summary's topic: the frame's own, else its producer's or consumer's."""
    if topic is None and correlator is not None:
        if "pid" in out:
            topic = correlator.producers.get(out["pid"])
        elif "cid" in out:
            topic = correlator.consumers.get(out["cid"])
    if topic:
        out["topic"] = topic


def _count_messages(
    out: dict[str, Any], in_batch: int, chunks: int, chunk_id: int, uuid: str, total: int
) -> None:
    """The summary's ``msgs`` (and ``chunk``) from the message metadata."""
    out["msgs"] = in_batch
    if chunks > 1:
        # One logical message in several frames: counted once, on its
        # last chunk, so that message counts match what the client sent.
        out["chunk"] = [uuid, chunk_id, chunks, total]
        out["msgs"] = 1 if chunk_id == chunks - 1 else 0
