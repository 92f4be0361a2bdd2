"""Hypothesis strategies for Pulsar frames, driven by the schema itself.

``commands()`` draws a valid ``BaseCommand`` of any of the protocol's command
types: every required field set, optional and repeated fields at random.
``payload_frames()`` draws SEND/MESSAGE frames with real metadata, optional
broker entry metadata, and payloads that are really compressed and batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.protocols.pulsar.frame import BODY_FIELD, PAYLOAD_TYPES
from sluice.protocols.pulsar.payload import build_batch, compress

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXT = st.text(max_size=12)
_BYTES = st.binary(max_size=12)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(lo, hi)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return _TEXT
    if t == FieldDescriptor.TYPE_BYTES:
        return _BYTES
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(allow_nan=False, width=32)
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=False)
    if t == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise AssertionError(f"unhandled field type {t}")


@st.composite
def message_of(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    """A random, fully initialized message of ``descriptor``'s type."""
    cls = _CLASSES[descriptor.full_name]
    msg: Message = cls()
    oneofs_set: set[str] = set()
    for field in descriptor.fields:
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneofs_set or not draw(st.booleans()):
                continue
            oneofs_set.add(field.containing_oneof.name)
        required = field.is_required
        if field.is_repeated:
            count = 0 if depth > 1 else draw(st.integers(0, 2))
        elif required:
            count = 1
        else:
            count = 1 if depth <= 1 and draw(st.booleans()) else 0
        for _ in range(count):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                assert field.message_type is not None
                value = draw(message_of(field.message_type, depth + 1))
                target = getattr(msg, field.name)
                if field.is_repeated:
                    target.add().CopyFrom(value)
                else:
                    target.CopyFrom(value)
            else:
                value = draw(_scalar(field))
                if field.is_repeated:
                    getattr(msg, field.name).append(value)
                else:
                    setattr(msg, field.name, value)
    return msg


def _collect_classes() -> dict[str, type[Message]]:
    out: dict[str, type[Message]] = {}

    def visit(cls: type[Message]) -> None:
        out[cls.DESCRIPTOR.full_name] = cls
        for nested in cls.DESCRIPTOR.nested_types:
            visit(getattr(cls, nested.name))

    for name in pb.DESCRIPTOR.message_types_by_name:
        visit(getattr(pb, name))
    return out


_CLASSES = _collect_classes()


def body_of(type_: int) -> Descriptor:
    """The descriptor of command ``type_``'s body message."""
    body = pb.BaseCommand.DESCRIPTOR.fields_by_number[type_].message_type
    assert body is not None
    return body


SIMPLE_TYPES = sorted(t for t in BODY_FIELD if t not in PAYLOAD_TYPES)


@st.composite
def commands(draw: st.DrawFn, types: list[int] | None = None) -> pb.BaseCommand:
    type_ = draw(st.sampled_from(types or SIMPLE_TYPES))
    body_descriptor = body_of(type_)
    return command(type_, draw(message_of(body_descriptor)))


@dataclass
class PayloadFrame:
    raw: bytes
    command: pb.BaseCommand
    metadata: pb.MessageMetadata
    payload: bytes  # as carried (compressed)
    messages: list[bytes]  # application messages inside
    checksum: bool
    broker_entry_metadata: pb.BrokerEntryMetadata | None


@st.composite
def payload_frames(draw: st.DrawFn, checksum: bool | None = None) -> PayloadFrame:
    type_ = draw(st.sampled_from(sorted(PAYLOAD_TYPES)))
    body_descriptor = body_of(type_)
    cmd = command(type_, draw(message_of(body_descriptor)))
    metadata = pb.MessageMetadata(
        producer_name=draw(_TEXT),
        sequence_id=draw(st.integers(0, 2**64 - 1)),
        publish_time=draw(st.integers(0, 2**64 - 1)),
    )
    for key, value in draw(st.lists(st.tuples(_TEXT, _TEXT), max_size=2)):
        metadata.properties.add(key=key, value=value)
    bodies = draw(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
    batched = len(bodies) > 1 or draw(st.booleans())
    if batched:
        metadata.num_messages_in_batch = len(bodies)
        plain = build_batch([(pb.SingleMessageMetadata(payload_size=len(b)), b) for b in bodies])
    else:
        plain = bodies[0]
    codec = draw(st.sampled_from(list(pb.CompressionType.values())))
    carried = compress(codec, plain)
    if codec != pb.NONE:
        metadata.compression = codec
        metadata.uncompressed_size = len(plain)
    with_checksum = draw(st.booleans()) if checksum is None else checksum
    bem = (
        pb.BrokerEntryMetadata(
            broker_timestamp=draw(st.integers(0, 2**63)), index=draw(st.integers(0, 2**63))
        )
        if draw(st.booleans())
        else None
    )
    raw = encode_payload(cmd, metadata, carried, checksum=with_checksum, broker_entry_metadata=bem)
    return PayloadFrame(raw, cmd, metadata, carried, bodies, with_checksum, bem)


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    """Any valid frame, simple or with a payload."""
    if draw(st.booleans()):
        return encode(draw(commands()))
    return draw(payload_frames()).raw


PING = encode(command(Type.Value("PING")))
