"""One Cursus frame as read off the wire, and the limits that apply to it.

Every frame, both ways, is ``[u32 big-endian length][body]``. What the body
is depends on who sent it: a client sends batches, text commands (bare or in
a ``[u16 topic length][topic][payload]`` envelope) and, rarely, empty
frames; a broker sends text replies, JSON batch acks, batches and, on a
STREAM, empty keepalive frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.protocols.cursus.batch import Batch, BatchHead, decode_batch
from sluice.protocols.cursus.commands import Command
from sluice.protocols.cursus.errors import RemoteProtocolError
from sluice.protocols.cursus.replies import Keepalive, Reply

# The broker refuses bodies over 16 MiB (and hangs up); the spec and the
# client allow 64 MiB.
BROKER_MAX_FRAME_SIZE = 16 * 1024 * 1024
SPEC_MAX_FRAME_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_FRAME_SIZE = BROKER_MAX_FRAME_SIZE
LENGTH_SIZE = 4


# Where a Cursus broker listens unless told otherwise.
DEFAULT_PORT = 9000


@dataclass(frozen=True, slots=True)
class EnvelopeMessage:
    """An envelope whose payload is no command: a topic and opaque bytes."""

    topic: str
    payload: bytes
    name = "MESSAGE"


Item = Keepalive | Batch | Command | EnvelopeMessage | Reply


def item_name(item: Item | None) -> str:
    if item is None:
        return "INVALID"
    if isinstance(item, Batch):
        return "BATCH"
    return str(item.name)


class Frame:
    """One frame.

    ``raw`` is the bytes as received, length prefix included: what a proxy
    forwards when nothing needs changing. ``body`` is what was classified
    (after the broker's decompression, for frames from a client).
    ``message`` is the decoded value, or ``None`` when the body could not be
    decoded at all; ``envelope`` is the envelope's topic when the message
    came in one (``""`` is the client's usual), else ``None``. ``error`` is
    the validation result: ``None`` when the broker would accept the frame.
    """

    __slots__ = ("body", "envelope", "error", "message", "raw")

    def __init__(
        self,
        raw: bytes,
        body: bytes,
        message: Item | None,
        error: RemoteProtocolError | None = None,
        envelope: str | None = None,
    ) -> None:
        self.raw = raw
        self.body = body
        self.message = message
        self.error = error
        self.envelope = envelope

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def name(self) -> str:
        """The command (``CONSUME``), ``BATCH``, ``OK``, ``ERROR``, ``ACK``,
        ``STREAM_CONTROL``, ``KEEPALIVE``, ``MESSAGE`` or ``INVALID``."""
        return item_name(self.message)

    @property
    def head(self) -> BatchHead | None:
        """A batch's topic, partition, count and last offset; None for any
        other frame."""
        message = self.message
        return BatchHead.of(message) if isinstance(message, Batch) else None

    @property
    def size(self) -> int:
        return len(self.raw)

    def check(self) -> Frame:
        """The frame itself, or its error raised."""
        if self.error is not None:
            raise self.error
        return self

    def __repr__(self) -> str:
        state = "ok" if self.error is None else repr(self.error)
        return f"<Frame {self.name} {len(self.raw)}B {state}>"


class OwnFrame(Frame):
    """A frame Sluice wrote to the client itself (a refusal, a fault rule's
    answer, a drain's STREAM_CONTROL): no broker sent it, which recordings
    say (``own``) so that replay does not expect it from one."""

    __slots__ = ()


# The slots, under BatchFrame's properties.
_MESSAGE = Frame.__dict__["message"]
_BODY = Frame.__dict__["body"]


class BatchFrame(Frame):
    """A batch frame whose body the compiled check (rust/src/cursus.rs)
    found valid, as the reference would: its head was read there, and its
    messages are decoded by the reference (``decode_batch``) only when
    ``message`` is asked for. The relay, the metrics and the recorder ask
    for the head and the name only: no object per message. ``body`` is
    ``raw`` without its length prefix, copied out only when asked for
    (unless given: a body the broker would decompress)."""

    __slots__ = ("_head",)

    def __init__(self, raw: bytes, head: BatchHead, body: bytes | None = None) -> None:
        super().__init__(raw, body, None)  # type: ignore[arg-type]
        self._head = head

    @property
    def body(self) -> bytes:
        body = _BODY.__get__(self, Frame)
        if body is None:
            body = self.raw[LENGTH_SIZE:]
            _BODY.__set__(self, body)
        return body  # type: ignore[no-any-return]

    @body.setter
    def body(self, value: bytes | None) -> None:
        _BODY.__set__(self, value)

    @property
    def message(self) -> Item | None:
        message = _MESSAGE.__get__(self, Frame)
        if message is None:
            message = decode_batch(self.body)
            _MESSAGE.__set__(self, message)
        return message  # type: ignore[no-any-return]

    @message.setter
    def message(self, value: Item | None) -> None:
        _MESSAGE.__set__(self, value)

    @property
    def head(self) -> BatchHead:
        return self._head

    @property
    def name(self) -> str:
        return "BATCH"
