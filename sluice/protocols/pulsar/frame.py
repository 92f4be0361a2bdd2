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


def standalone(raw: bytes) -> bytes:
    """A recorded frame whose payload was left out (``--record-payloads hash``
    or ``none``), as a frame that ends where the payload would start: its
    length prefix made to say so, so it decodes up to its metadata and a
    stream of such frames stays framed. Whole frames come back as they are."""
    if len(raw) >= 4 and int.from_bytes(raw[:4], "big") != len(raw) - 4:
        return (len(raw) - 4).to_bytes(4, "big") + raw[4:]
    return raw


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


def text(value: str | bytes) -> str:
    """A protobuf string field as text. Python's protobuf hands over a
    string that is not UTF-8 as bytes (a damaged frame, or a client's bug);
    Java's clients and brokers read such a string with replacement
    characters, and so does Sluice wherever it keeps one (summaries, the
    topics it correlates answers with)."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def command_name(type_: int) -> str:
    """``"SEND"`` for 6; ``"UNKNOWN(99)"`` for a type the schema does not know."""
    name = COMMAND_NAMES.get(type_)
    return name if name is not None else f"UNKNOWN({type_})"


SEND = Type.Value("SEND")
SEND_RECEIPT = Type.Value("SEND_RECEIPT")
MESSAGE = Type.Value("MESSAGE")
ACK = Type.Value("ACK")
FLOW = Type.Value("FLOW")
# The commands that make up nearly all traffic: their ids are read for the
# hot path (``Frame.ids``), by the compiled scanner when it is there.
HOT_TYPES = frozenset({SEND, SEND_RECEIPT, MESSAGE, ACK, FLOW})

Ids = tuple[int, int, int]
"""``(a, b, c)`` of a hot frame: SEND (producer_id, sequence_id, num_messages),
SEND_RECEIPT (producer_id, sequence_id, 0), MESSAGE (consumer_id, 0, the
metadata's num_messages_in_batch), ACK (consumer_id, 0, 0), FLOW
(consumer_id, messagePermits, 0)."""


def hot_ids(type_: int, body: Any, metadata: pb.MessageMetadata | None) -> Ids | None:
    """``Frame.ids`` worked out from a parsed command: the reference for the
    compiled scanner's."""
    if type_ == SEND:
        return (body.producer_id, body.sequence_id, _counted(body.num_messages, metadata))
    if type_ == SEND_RECEIPT:
        return (body.producer_id, body.sequence_id, 0)
    if type_ == MESSAGE:
        in_batch = metadata.num_messages_in_batch if metadata else 1
        return (body.consumer_id, 0, _counted(in_batch, metadata))
    if type_ == ACK:
        return (body.consumer_id, 0, 0)
    if type_ == FLOW:
        return (body.consumer_id, body.messagePermits, 0)
    return None


def _counted(messages: int, metadata: pb.MessageMetadata | None) -> int:
    """The messages a SEND or MESSAGE counts for: a chunked message's
    frames count it once, on its last chunk (as recordings do)."""
    if metadata is not None and metadata.num_chunks_from_msg > 1:
        return messages if metadata.chunk_id == metadata.num_chunks_from_msg - 1 else 0
    return messages


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
        "ids",
        "metadata",
        "metadata_offset",
        "payload_offset",
        "properties",
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
        ids: Ids | None = None,
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
        # The numbers the proxy's hot path reads (see ``Ids``): set for valid
        # SEND, SEND_RECEIPT, MESSAGE, ACK and FLOW frames, None otherwise.
        self.ids = ids
        # How many properties the message metadata holds; -1: not counted
        # (look at ``metadata``). The compiled scanner counts them.
        self.properties = -1

    # Whether Sluice wrote the frame itself (``OwnFrame``): a class
    # attribute, never set per frame.
    own = False

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


class OwnFrame(Frame):
    """A frame Sluice writes to the client itself (``encoder.own_frame``), no
    broker's: a refusal, a keepalive, a lookup's answer, a drain's
    CLOSE_PRODUCER. Recorded with ``own`` (docs/recording-format.md), so
    that replay knows which frames no broker sent."""

    __slots__ = ()

    own = True


_parse_command = pb.BaseCommand.FromString
_parse_metadata = pb.MessageMetadata.FromString


class ScannedFrame(Frame):
    """A frame the compiled scanner found valid (a hot type, every check of
    the Python decoder passed). Its command and metadata are parsed from
    ``raw`` only if something asks for them: the hot path reads ``ids``."""

    __slots__ = ("_body", "_command", "_metadata")

    # Always so for a scanned frame: read from the class, not set per frame.
    error = None
    broker_entry_metadata = None

    def __init__(
        self,
        raw: bytes,
        type_: int,
        metadata_offset: int,
        payload_offset: int,
        checksum: int,
        ids: Ids,
        properties: int,
    ) -> None:
        self.raw = raw
        self.type = type_
        self.metadata_offset = metadata_offset
        self.payload_offset = payload_offset
        self.checksum = checksum if checksum >= 0 else None
        self.ids = ids
        self.properties = properties
        self._command: pb.BaseCommand | None = None
        self._metadata: pb.MessageMetadata | None = None
        self._body: Any = None

    @property
    def command(self) -> pb.BaseCommand:
        command = self._command
        if command is None:
            raw = self.raw
            end = 8 + int.from_bytes(raw[4:8], "big")
            command = self._command = _parse_command(raw[8:end])
        return command

    @command.setter
    def command(self, value: pb.BaseCommand) -> None:
        self._command = value
        self._body = None

    @property
    def body(self) -> Any:
        body = self._body
        if body is None:
            body = self._body = getattr(self.command, BODY_FIELD[self.type])
        return body

    @body.setter
    def body(self, value: Any) -> None:
        self._body = value

    @property
    def metadata(self) -> pb.MessageMetadata | None:
        metadata = self._metadata
        if metadata is None and self.metadata_offset >= 0:
            start = self.metadata_offset + 4
            metadata = self._metadata = _parse_metadata(self.raw[start : self.payload_offset])
        return metadata

    @metadata.setter
    def metadata(self, value: pb.MessageMetadata | None) -> None:
        self._metadata = value
