"""Building frames: the inverse of the decoder.

The proxy forwards unchanged frames as their original bytes; these functions
are for frames Sluice writes itself (rewritten lookups, error replies, the
replay and serve tools, tests).
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c as _crc32c
from google.protobuf.message import Message

from sluice.protocols.faults import flip_last_byte
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.errors import LocalProtocolError, Problem
from sluice.protocols.pulsar.frame import (
    BODY_FIELD,
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_PADDING,
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CHECKSUM,
    PAYLOAD_TYPES,
    Frame,
    OwnFrame,
    command_name,
    missing_fields,
)

_U32 = struct.Struct(">I")


def command(type_: int, body: Message | None = None) -> pb.BaseCommand:
    """A ``BaseCommand`` of ``type_`` with ``body`` in the matching field.

    ``command(Type.PING)`` sets an empty ``ping`` body.
    """
    field = BODY_FIELD.get(type_)
    if field is None:
        raise LocalProtocolError(Problem.UNKNOWN_TYPE, f"unknown command type {type_}")
    cmd = pb.BaseCommand(type=type_)  # type: ignore[arg-type]
    target = getattr(cmd, field)
    if body is None:
        target.SetInParent()
    else:
        target.CopyFrom(body)
    return cmd


def own_frame(type_: int, body: Message | None = None) -> OwnFrame:
    """A frame Sluice writes itself, as a ``Frame`` (for taps) without
    decoding it again: an ``OwnFrame``, recorded as Sluice's own."""
    cmd = command(type_, body)
    return OwnFrame(encode(cmd), type_, cmd)


def _checked(cmd: pb.BaseCommand) -> bytes:
    if not cmd.IsInitialized():
        missing = missing_fields(cmd)
        raise LocalProtocolError(
            Problem.MISSING_FIELD, f"{command_name(cmd.type)} lacks required {missing}"
        )
    return cmd.SerializeToString()


def encode(cmd: pb.BaseCommand, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> bytes:
    """A simple (payload-free) command frame."""
    if cmd.type in PAYLOAD_TYPES:
        raise LocalProtocolError(
            Problem.MISSING_FIELD, f"{command_name(cmd.type)} needs metadata: use encode_payload()"
        )
    body = _checked(cmd)
    return _framed(_U32.pack(len(body)) + body, max_message_size)


def encode_payload(
    cmd: pb.BaseCommand,
    metadata: pb.MessageMetadata | bytes,
    payload: bytes | memoryview,
    *,
    checksum: bool = True,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """A SEND or MESSAGE frame.

    ``metadata`` may be a message or its already serialized bytes (replay
    passes recorded bytes through untouched).
    """
    if cmd.type not in PAYLOAD_TYPES:
        raise LocalProtocolError(
            Problem.TRAILING, f"{command_name(cmd.type)} cannot carry a payload"
        )
    body = _checked(cmd)
    if isinstance(metadata, pb.MessageMetadata):
        if not metadata.IsInitialized():
            missing = missing_fields(metadata)
            raise LocalProtocolError(Problem.MISSING_FIELD, f"message metadata lacks {missing}")
        meta = metadata.SerializeToString()
    else:
        meta = bytes(metadata)
    section = b"".join((_U32.pack(len(meta)), meta, payload))
    parts = [_U32.pack(len(body)), body]
    if broker_entry_metadata is not None:
        bem = broker_entry_metadata.SerializeToString()
        parts += [MAGIC_BROKER_ENTRY_METADATA, _U32.pack(len(bem)), bem]
    if checksum:
        parts += [MAGIC_CHECKSUM, _U32.pack(_crc32c.crc32c(section))]
    parts.append(section)
    return _framed(b"".join(parts), max_message_size)


def with_payload(
    frame: Frame, more_metadata: bytes, payload: bytes, max_message_size: int
) -> bytes:
    """``frame`` (a SEND or MESSAGE) with ``more_metadata`` (serialized
    MessageMetadata fields) after its metadata's own bytes and ``payload``
    in place of its payload; the checksum made anew. Fields a protobuf
    message holds may come in any order, so nothing is parsed."""
    raw = frame.raw
    start = frame.metadata_offset
    assert start >= 0 and frame.payload_offset >= 0
    head = raw[4 : 8 + _U32.unpack_from(raw, 4)[0]]  # the command, with its size
    if frame.broker_entry_metadata is not None:
        bem = frame.broker_entry_metadata.SerializeToString()
        head += MAGIC_BROKER_ENTRY_METADATA + _U32.pack(len(bem)) + bem
    meta = raw[start + 4 : frame.payload_offset] + more_metadata
    section = b"".join((_U32.pack(len(meta)), meta, payload))
    return _framed(
        b"".join((head, MAGIC_CHECKSUM, _U32.pack(_crc32c.crc32c(section)), section)),
        max_message_size,
    )


def _framed(content: bytes, max_message_size: int) -> bytes:
    limit = max_message_size + FRAME_PADDING - 4
    if len(content) > limit:
        raise LocalProtocolError(
            Problem.TOO_LARGE, f"frame of {len(content) + 4} bytes exceeds the limit of {limit + 4}"
        )
    return _U32.pack(len(content)) + content


def error_reply(frame: Frame, code: int, message: str) -> Frame | None:
    """The frame a broker would answer ``frame`` with to report ``code``.

    SEND gets SEND_ERROR for its sequence id; lookups and partition metadata
    get their own failed responses; schema, consumer-stats, transaction and
    acknowledgement (with a request id) requests their own responses with
    the error (``_OWN_ANSWER``); other requests get ERROR for their request
    id. Frames that no answer can be addressed to give None (the
    caller closes the connection instead).
    """
    body = frame.body
    if body is None:
        return None
    t = frame.type
    if t == pb.BaseCommand.SEND:
        return own_frame(
            pb.BaseCommand.SEND_ERROR,
            pb.CommandSendError(
                producer_id=body.producer_id,
                sequence_id=body.sequence_id,
                error=code,  # type: ignore[arg-type]
                message=message,
            ),
        )
    if not _has(body, "request_id"):
        return None
    rid = body.request_id
    failed = _FAILED_ANSWER.get(t)
    if failed is not None:
        answer_type, answer_class = failed
        answer = answer_class(request_id=rid, error=code, message=message)
        answer.response = answer_class.Failed
        return own_frame(answer_type, answer)
    own = _OWN_ANSWER.get(t)
    if own is not None:
        answer_type, answer_class, code_field, message_field, repeated = own
        answer = answer_class(request_id=rid, **{code_field: code, message_field: message})
        for name in repeated:
            if _has(body, name):
                setattr(answer, name, getattr(body, name))
        return own_frame(answer_type, answer)
    return own_frame(
        pb.BaseCommand.ERROR,
        pb.CommandError(request_id=rid, error=code, message=message),  # type: ignore[arg-type]
    )


# Requests whose answer type has its own "Failed" outcome, which clients
# expect instead of a generic ERROR.
_FAILED_ANSWER: dict[int, tuple[int, Any]] = {
    pb.BaseCommand.LOOKUP: (pb.BaseCommand.LOOKUP_RESPONSE, pb.CommandLookupTopicResponse),
    pb.BaseCommand.PARTITIONED_METADATA: (
        pb.BaseCommand.PARTITIONED_METADATA_RESPONSE,
        pb.CommandPartitionedTopicMetadataResponse,
    ),
}


# Requests a broker fails with their own answer type, not ERROR: the
# clients wait for that type (a Java client's ERROR handler knows only its
# connection's own pending requests, not its acknowledgements or the
# transaction coordinator's, which then wait out their timeout). Each: the
# answer's type and class, its error code and message fields, and the
# request's fields the answer repeats.
_OWN_ANSWER: dict[int, tuple[int, Any, str, str, tuple[str, ...]]] = {
    pb.BaseCommand.GET_SCHEMA: (
        pb.BaseCommand.GET_SCHEMA_RESPONSE,
        pb.CommandGetSchemaResponse, "error_code", "error_message", (),
    ),
    pb.BaseCommand.GET_OR_CREATE_SCHEMA: (
        pb.BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE,
        pb.CommandGetOrCreateSchemaResponse, "error_code", "error_message", (),
    ),
    pb.BaseCommand.ACK: (
        pb.BaseCommand.ACK_RESPONSE,
        pb.CommandAckResponse, "error", "message",
        ("consumer_id", "txnid_least_bits", "txnid_most_bits"),
    ),
    pb.BaseCommand.CONSUMER_STATS: (
        pb.BaseCommand.CONSUMER_STATS_RESPONSE,
        pb.CommandConsumerStatsResponse, "error_code", "error_message", (),
    ),
    pb.BaseCommand.TC_CLIENT_CONNECT_REQUEST: (
        pb.BaseCommand.TC_CLIENT_CONNECT_RESPONSE,
        pb.CommandTcClientConnectResponse, "error", "message", (),
    ),
    pb.BaseCommand.NEW_TXN: (
        pb.BaseCommand.NEW_TXN_RESPONSE, pb.CommandNewTxnResponse, "error", "message", (),
    ),
    **{
        request: (answer, answer_class, "error", "message", ("txnid_least_bits", "txnid_most_bits"))
        for request, answer, answer_class in (
            (pb.BaseCommand.ADD_PARTITION_TO_TXN, pb.BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE,
             pb.CommandAddPartitionToTxnResponse),
            (pb.BaseCommand.ADD_SUBSCRIPTION_TO_TXN,
             pb.BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
             pb.CommandAddSubscriptionToTxnResponse),
            (pb.BaseCommand.END_TXN, pb.BaseCommand.END_TXN_RESPONSE, pb.CommandEndTxnResponse),
            (pb.BaseCommand.END_TXN_ON_PARTITION, pb.BaseCommand.END_TXN_ON_PARTITION_RESPONSE,
             pb.CommandEndTxnOnPartitionResponse),
            (pb.BaseCommand.END_TXN_ON_SUBSCRIPTION,
             pb.BaseCommand.END_TXN_ON_SUBSCRIPTION_RESPONSE,
             pb.CommandEndTxnOnSubscriptionResponse),
        )
    },
}  # fmt: skip


def _has(body: Message, field: str) -> bool:
    try:
        return body.HasField(field)
    except ValueError:  # the message has no such field
        return False


def corrupted(frame: Frame) -> bytes:
    """``frame``'s bytes with the last one inverted, so that its checksum no
    longer matches (fault injection's ``corrupt``).

    A SEND or MESSAGE that carries no checksum gets one first, computed over
    the original section, so that the receiver can tell; a frame without a
    payload just has its last byte inverted.
    """
    raw = frame.raw
    if frame.metadata_offset >= 0 and frame.checksum is None:
        section = raw[frame.metadata_offset :]
        content = b"".join((raw[4 : frame.metadata_offset], MAGIC_CHECKSUM,
                            _U32.pack(_crc32c.crc32c(section)), section))  # fmt: skip
        raw = _U32.pack(len(content)) + content
    return flip_last_byte(raw)
