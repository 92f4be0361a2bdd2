"""The decoded frame and the wire constants it is built from.

Layout of a frame on the wire (all sizes 4-byte big-endian)::

    [total][cmdSize][BaseCommand]                                   simple command
    [total][cmdSize][BaseCommand]
        ([0x0e02][bemSize][BrokerEntryMetadata])?                   payload command
        ([0x0e01][crc32c])?
        [metaSize][MessageMetadata][payload]

``total`` counts every byte after itself; the CRC32-C covers everything from
``metaSize`` to the end of the frame.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.errors import RemoteProtocolError

# Broker default for the largest message; CONNECTED.max_message_size replaces it.
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
# Room a frame may take beyond the message itself (command, metadata, framing),
# the same allowance brokers grant.
FRAME_PADDING = 10 * 1024

MAGIC_CHECKSUM = b"\x0e\x01"
MAGIC_BROKER_ENTRY_METADATA = b"\x0e\x02"

Type = pb.BaseCommand.Type
PAYLOAD_TYPES = frozenset({Type.Value("SEND"), Type.Value("MESSAGE")})

# In BaseCommand every command type's number is also the field number of its
# body, so the table comes straight from the schema.
_BASE_FIELDS = pb.BaseCommand.DESCRIPTOR.fields_by_number
BODY_FIELD: dict[int, str] = {
    value.number: _BASE_FIELDS[value.number].name for value in Type.DESCRIPTOR.values
}


# Bodies with no required field: IsInitialized() is true even when they are
# absent, so presence has to be asked for explicitly.
def _has_required(number: int) -> bool:
    body = _BASE_FIELDS[number].message_type
    assert body is not None
    return any(f.is_required for f in body.fields)


BODY_WITHOUT_REQUIRED: frozenset[int] = frozenset(n for n in BODY_FIELD if not _has_required(n))


def missing_fields(message: Message) -> str:
    """Names of the required fields ``message`` lacks, for error messages."""
    errors: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
    return ", ".join(errors)


# Every command type the schema knows, by number.
COMMAND_NAMES: dict[int, str] = {value.number: value.name for value in Type.DESCRIPTOR.values}


def command_name(type_: int) -> str:
    """``"SEND"`` for 6; ``"UNKNOWN(99)"`` for a type the schema does not know."""
    name = COMMAND_NAMES.get(type_)
    return name if name is not None else f"UNKNOWN({type_})"


class Frame:
    """One frame as read off the wire.

    ``raw`` is exactly the bytes received (length prefix included), which is
    what gets forwarded when nothing needs rewriting. ``error`` is the
    validation result: ``None`` for a valid frame. A frame can be invalid and
    still decoded as far as it goes (e.g. a checksum mismatch keeps its
    command and metadata).
    """

    __slots__ = (
        "body",
        "broker_entry_metadata",
        "checksum",
        "command",
        "error",
        "metadata",
        "metadata_offset",
        "payload_offset",
        "raw",
        "type",
    )

    def __init__(
        self,
        raw: bytes,
        type_: int,
        command: pb.BaseCommand | None,
        error: RemoteProtocolError | None = None,
        metadata: pb.MessageMetadata | None = None,
        metadata_offset: int = -1,
        payload_offset: int = -1,
        checksum: int | None = None,
        broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
        body: Any = None,
    ) -> None:
        self.raw = raw
        self.type = type_
        self.command = command
        self.error = error
        self.metadata = metadata
        # Offset of metaSize within raw; -1 for frames without a payload section.
        self.metadata_offset = metadata_offset
        # Offset of the application payload within raw; -1 when absent.
        self.payload_offset = payload_offset
        # The checksum as sent (None when the frame carries none).
        self.checksum = checksum
        self.broker_entry_metadata = broker_entry_metadata
        # The typed command (``CommandSend`` for a SEND), or None if unknown.
        # Looked up once: every tap and the correlator read it. The decoder,
        # which has it already, passes it in.
        if body is None and command is not None:
            field = BODY_FIELD.get(type_)
            body = getattr(command, field) if field is not None else None
        self.body: Any = body

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def name(self) -> str:
        return command_name(self.type)

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def payload(self) -> memoryview:
        """The application payload (possibly a compressed batch), without copying."""
        if self.payload_offset < 0:
            return memoryview(b"")
        return memoryview(self.raw)[self.payload_offset :]

    @property
    def has_payload_section(self) -> bool:
        return self.metadata_offset >= 0

    def __repr__(self) -> str:
        state = "ok" if self.error is None else repr(self.error)
        return f"<Frame {self.name} {len(self.raw)}B {state}>"
