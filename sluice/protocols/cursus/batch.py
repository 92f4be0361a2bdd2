"""Binary batches: what producers send and what CONSUME and STREAM deliver.

Layout, all integers big-endian, as the real client writes and reads it::

    u16 magic 0xBA7C
    u16 topic length, topic
    i32 partition
    u8  acks length, acks ("0", "1", "-1")
    u8  idempotent (0 or 1)
    u64 seq_start, u64 seq_end
    i32 message count, then per message:
        u64 offset, u64 seq_num
        u16 length, producer_id
        u16 length, key
        i64 epoch
        u32 length, payload
        u16 length, event_type
        u32 schema_version
        u64 aggregate_version
        u16 length, metadata

(The written spec gives the partition and acks as u16-length strings; the
client and the broker it talks to use the layout above.) Strings are UTF-8;
they are decoded with ``surrogateescape`` so that any bytes round-trip.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sluice.protocols.cursus.errors import LocalProtocolError, Problem, RemoteProtocolError
from sluice.protocols.cursus.text import decode_text, encode_text

MAGIC = 0xBA7C
MAGIC_BYTES = b"\xba\x7c"

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_HEAD_TAIL = struct.Struct(">BQQi")  # idempotent, seq_start, seq_end, count
_IDS = struct.Struct(">QQ")  # offset, seq_num
_I64 = struct.Struct(">q")
_VERSIONS = struct.Struct(">IQ")  # schema_version, aggregate_version
# The smallest message: every length zero.
MIN_MESSAGE_SIZE = 8 + 8 + 2 + 2 + 8 + 4 + 2 + 4 + 8 + 2

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a batch."""

    offset: int = 0
    seq_num: int = 0
    producer_id: str = ""
    key: str = ""
    epoch: int = 0
    payload: bytes = b""
    event_type: str = ""
    schema_version: int = 0
    aggregate_version: int = 0
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch of messages for one partition of one topic."""

    topic: str
    partition: int
    acks: str = "1"
    idempotent: bool = False
    seq_start: int = 0
    seq_end: int = 0
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchHead:
    """What the proxy's core and its recorder need of a batch: its topic and
    partition, how many messages it holds and the last one's offset (None:
    it holds none)."""

    topic: str
    partition: int
    count: int
    last_offset: int | None

    @classmethod
    def of(cls, batch: Batch) -> BatchHead:
        last = batch.messages[-1].offset if batch.messages else None
        return cls(batch.topic, batch.partition, len(batch.messages), last)


def is_batch(body: bytes) -> bool:
    """The broker's test: the magic, then a topic length that is not zero and fits."""
    if len(body) < 4 or body[0] != 0xBA or body[1] != 0x7C:
        return False
    topic_len: int = _U16.unpack_from(body, 2)[0]
    return 0 < topic_len <= len(body) - 4


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _bad(f"batch ends inside {what} (needs {n} bytes at {self.pos})")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        if self.pos + st.size > len(self.data):
            raise _bad(f"batch ends inside {what} (needs {st.size} bytes at {self.pos})")
        values = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return values

    def string(self, length: struct.Struct, what: str) -> str:
        (n,) = self.unpack(length, f"{what} length")
        return decode_text(self.take(n, what))


_U8 = struct.Struct(">B")


def decode_batch(body: bytes) -> Batch:
    """Decode a batch body (after any decompression). Raises ``RemoteProtocolError``."""
    if len(body) < 2 or body[:2] != MAGIC_BYTES:
        raise _bad("batch does not start with the 0xBA7C magic")
    r = _Reader(body, 2)
    topic = r.string(_U16, "topic")
    if not topic:
        raise _bad("batch has an empty topic")
    (partition,) = r.unpack(_I32, "partition")
    acks = r.string(_U8, "acks")
    idempotent, seq_start, seq_end, count = r.unpack(_HEAD_TAIL, "batch header")
    if count < 0:
        raise _bad(f"negative message count {count}")
    if count * MIN_MESSAGE_SIZE > len(body) - r.pos:
        raise _bad(f"{count} messages cannot fit in the {len(body) - r.pos} bytes left")
    messages = []
    for _ in range(count):
        offset, seq_num = r.unpack(_IDS, "message offset")
        producer_id = r.string(_U16, "producer id")
        key = r.string(_U16, "key")
        (epoch,) = r.unpack(_I64, "epoch")
        (payload_len,) = r.unpack(_U32, "payload length")
        payload = r.take(payload_len, "payload")
        event_type = r.string(_U16, "event type")
        schema_version, aggregate_version = r.unpack(_VERSIONS, "versions")
        metadata = r.string(_U16, "metadata")
        messages.append(
            Message(
                offset,
                seq_num,
                producer_id,
                key,
                epoch,
                payload,
                event_type,
                schema_version,
                aggregate_version,
                metadata,
            )
        )
    if r.pos != len(body):
        raise RemoteProtocolError(
            Problem.TRAILING, f"{len(body) - r.pos} bytes after the last message of the batch"
        )
    return Batch(topic, partition, acks, bool(idempotent), seq_start, seq_end, tuple(messages))


def encode_batch(batch: Batch) -> bytes:
    """The body of ``batch`` (no length prefix, no compression)."""
    out = bytearray(MAGIC_BYTES)
    topic = encode_text(batch.topic)
    if not topic:
        raise _local("a batch needs a topic")
    _put_str(out, topic, 0xFFFF, "topic")
    _check(batch.partition, -(2**31), 2**31 - 1, "partition")
    out += _I32.pack(batch.partition)
    _put_str(out, encode_text(batch.acks), 0xFF, "acks")
    _check(batch.seq_start, 0, U64_MAX, "seq_start")
    _check(batch.seq_end, 0, U64_MAX, "seq_end")
    _check(len(batch.messages), 0, 2**31 - 1, "message count")
    out += _HEAD_TAIL.pack(
        1 if batch.idempotent else 0, batch.seq_start, batch.seq_end, len(batch.messages)
    )
    for m in batch.messages:
        _check(m.offset, 0, U64_MAX, "offset")
        _check(m.seq_num, 0, U64_MAX, "seq_num")
        out += _IDS.pack(m.offset, m.seq_num)
        _put_str(out, encode_text(m.producer_id), 0xFFFF, "producer_id")
        _put_str(out, encode_text(m.key), 0xFFFF, "key")
        _check(m.epoch, -(2**63), 2**63 - 1, "epoch")
        out += _I64.pack(m.epoch)
        _check(len(m.payload), 0, U32_MAX, "payload length")
        out += _U32.pack(len(m.payload))
        out += m.payload
        _put_str(out, encode_text(m.event_type), 0xFFFF, "event_type")
        _check(m.schema_version, 0, U32_MAX, "schema_version")
        _check(m.aggregate_version, 0, U64_MAX, "aggregate_version")
        out += _VERSIONS.pack(m.schema_version, m.aggregate_version)
        _put_str(out, encode_text(m.metadata), 0xFFFF, "metadata")
    return bytes(out)


def _put_str(out: bytearray, data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise _local(f"{what} of {len(data)} bytes is longer than {limit}")
    out += (_U8 if limit == 0xFF else _U16).pack(len(data))
    out += data


def _check(value: int, low: int, high: int, what: str) -> None:
    if not low <= value <= high:
        raise _local(f"{what} {value} is outside {low}..{high}")


def _bad(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(Problem.PARSE, message)


def _local(message: str) -> LocalProtocolError:
    return LocalProtocolError(Problem.PARSE, message)
