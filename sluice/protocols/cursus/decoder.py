"""Incremental, sans-I/O Cursus frame decoder, and the broker's classification.

Feed bytes of one direction as they arrive, in any chunks; take frames::

    decoder = FrameDecoder(from_client=True)
    decoder.receive_data(chunk)          # b"" when the peer closed
    for frame in decoder.frames():       # or next_event() until NEED_DATA / CLOSED
        forward(frame.raw)

A frame whose length is known is always returned, with ``frame.error`` set
when the broker would refuse it. Only lost framing is raised, as a fatal
``RemoteProtocolError``: a length over ``max_frame_size`` (the broker hangs
up on those) or a stream that ends inside a frame. After that the decoder
refuses further work; no other exception ever escapes it.

A client body is classified the way the broker does it, in order: a batch
(magic 0xBA 0x7C and a topic length that is not zero and fits), a bare text
command (first word a command the broker knows), an envelope
``[u16 topic length][topic][payload]`` whose payload is a command or, with a
topic and a payload, a plain message; else malformed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from sluice.protocols.core import compiled_frames_wanted
from sluice.protocols.cursus.batch import BatchHead, decode_batch, is_batch
from sluice.protocols.cursus.commands import KNOWN, OtherCommand, looks_like_command, parse_command
from sluice.protocols.cursus.compression import Compression, decompress
from sluice.protocols.cursus.errors import (
    DECODE_FAILED,
    MALFORMED_INPUT,
    MISSING_TOPIC_OR_PAYLOAD,
    Problem,
    RemoteProtocolError,
)
from sluice.protocols.cursus.frame import (
    BROKER_MAX_FRAME_SIZE,
    LENGTH_SIZE,
    SPEC_MAX_FRAME_SIZE,
    BatchFrame,
    EnvelopeMessage,
    Frame,
)
from sluice.protocols.cursus.replies import Keepalive, parse_reply_text
from sluice.protocols.cursus.text import decode_text

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_LONGEST_COMMAND = max(len(name) for name in KNOWN)
_KNOWN_BYTES = frozenset(name.encode() for name in KNOWN)
_KEEPALIVE = Keepalive()
# Decompressed bodies may be this many times the frame limit.
DECOMPRESSED_FACTOR = 4

try:  # batches checked in compiled code (rust/src/cursus.rs)
    from sluice._frames import cursus_batch_head as _compiled_head
except ImportError:  # a source tree nobody built: the reference decodes them
    _compiled_head = None  # type: ignore[assignment]
if not compiled_frames_wanted():  # SLUICE_FRAMES=python: the reference alone
    _compiled_head = None  # type: ignore[assignment]
COMPILED: Final = _compiled_head is not None


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Final = _Sentinel("NEED_DATA")
"""``next_event()`` needs more bytes before it can return a frame."""
CLOSED: Final = _Sentinel("CLOSED")
"""The peer ended the stream cleanly, on a frame boundary."""


def default_max_frame_size(from_client: bool) -> int:
    """The broker's limit for what clients send; the client's for what brokers send."""
    return BROKER_MAX_FRAME_SIZE if from_client else SPEC_MAX_FRAME_SIZE


class FrameDecoder:
    """Turns one direction of a Cursus byte stream into ``Frame`` objects.

    ``from_client`` picks the classification (requests or replies);
    ``compression`` is the broker-wide setting, applied to client frames only;
    ``compiled=False`` decodes every batch with the reference, never with
    the compiled check (for comparing the two).
    """

    def __init__(
        self,
        *,
        from_client: bool,
        max_frame_size: int | None = None,
        compression: Compression = Compression.NONE,
        compiled: bool = True,
    ) -> None:
        self.from_client = from_client
        self.compiled = compiled
        self.compression = compression
        limit = default_max_frame_size(from_client) if max_frame_size is None else max_frame_size
        if limit <= 0:
            raise ValueError(f"max_frame_size must be positive, not {limit}")
        self.max_frame_size = limit
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._broken: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def take_buffered(self) -> bytes:
        """The bytes received but not yet returned as frames (the start of
        a frame: frames are returned whole), given up; the decoder is as
        new after, but for the end of the stream and a break, kept."""
        rest = bytes(self._buf[self._pos :])
        self._buf.clear()
        self._pos = 0
        return rest

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer. An empty ``data`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("receive_data() after end of stream")
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_event(self) -> Frame | _Sentinel:
        """The next complete frame, ``NEED_DATA`` or ``CLOSED``.

        Raises a fatal ``RemoteProtocolError`` when framing is lost.
        """
        if self._broken is not None:
            raise self._broken
        available = len(self._buf) - self._pos
        if available < LENGTH_SIZE:
            return self._at_end(available)
        (length,) = _U32.unpack_from(self._buf, self._pos)
        if length > self.max_frame_size:
            self._broken = RemoteProtocolError(
                Problem.TOO_LARGE,
                f"frame body of {length} bytes exceeds the limit of {self.max_frame_size}",
                fatal=True,
            )
            raise self._broken
        end = self._pos + LENGTH_SIZE + length
        if end > len(self._buf):
            return self._at_end(available)
        with memoryview(self._buf) as view:
            raw = bytes(view[self._pos : end])  # one copy
        self._pos = end
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        return decode_frame(
            raw,
            from_client=self.from_client,
            compression=self.compression,
            max_frame_size=self.max_frame_size,
            compiled=self.compiled,
        )

    def frames(self) -> Iterator[Frame]:
        """Every frame that is complete now (raises like ``next_event``)."""
        while isinstance(event := self.next_event(), Frame):
            yield event

    def _at_end(self, available: int) -> _Sentinel:
        if not self._eof:
            return NEED_DATA
        if available == 0:
            return CLOSED
        self._broken = RemoteProtocolError(
            Problem.TRUNCATED,
            f"stream ended {available} bytes into an incomplete frame",
            fatal=True,
        )
        raise self._broken


def decode_frame(
    raw: bytes,
    *,
    from_client: bool,
    compression: Compression = Compression.NONE,
    max_frame_size: int | None = None,
    compiled: bool = True,
) -> Frame:
    """Decode one complete frame (length prefix included). Never raises.
    A valid batch is checked in compiled code where built (a ``BatchFrame``,
    its messages decoded when asked for), unless ``compiled`` is False."""
    if compiled and (not from_client or compression is Compression.NONE):
        # A valid batch is a batch whoever sent it: checked in place.
        found = _scanned(raw, None)
        if found is not None:
            return found
    if len(raw) < LENGTH_SIZE or _U32.unpack_from(raw)[0] != len(raw) - LENGTH_SIZE:
        error = RemoteProtocolError(Problem.FRAMING, "length prefix does not match the frame")
        return Frame(raw, b"", None, error)
    body = raw[LENGTH_SIZE:]
    if from_client:
        limit = default_max_frame_size(True) if max_frame_size is None else max_frame_size
        return decode_request_body(raw, body, compression, limit * DECOMPRESSED_FACTOR, compiled)
    return decode_reply_body(raw, body, compiled)


def decode_request_body(
    raw: bytes,
    body: bytes,
    compression: Compression = Compression.NONE,
    max_decompressed: int = BROKER_MAX_FRAME_SIZE * DECOMPRESSED_FACTOR,
    compiled: bool = True,
) -> Frame:
    """Classify and decode what a client sent, as the broker would. Never raises."""
    if not body:
        return Frame(raw, body, _KEEPALIVE)
    if compression is not Compression.NONE:
        try:
            body = decompress(body, compression, max_decompressed)
        except RemoteProtocolError as exc:
            return Frame(raw, body, None, exc)
    if is_batch(body):
        return _batch(raw, body, compiled)
    if _first_word_known(body):
        return _command(raw, body, decode_text(body), None)
    return _envelope(raw, body)


def _first_word_known(body: bytes) -> bool:
    head = body[: _LONGEST_COMMAND + 1]
    parts = head.split(None, 1)
    if not parts:
        return False
    word = parts[0]
    if len(word) == len(head) and len(body) > len(head):
        return False  # the word runs on past the longest command name
    return word in _KNOWN_BYTES


def _command(raw: bytes, body: bytes, text: str, envelope: str | None) -> Frame:
    try:
        command = parse_command(text)
    except RemoteProtocolError as exc:
        return Frame(raw, body, None, exc, envelope)
    if isinstance(command, OtherCommand) and not command.known:
        error = RemoteProtocolError(
            Problem.UNKNOWN_TYPE, f"command {command.command[:40]!r} is not one we know"
        )
        return Frame(raw, body, command, error, envelope)
    return Frame(raw, body, command, None, envelope)


def _envelope(raw: bytes, body: bytes) -> Frame:
    if len(body) < 2:
        return Frame(raw, body, None, _bad_topic_length("body too short for a topic length"))
    (topic_len,) = _U16.unpack_from(body)
    if 2 + topic_len > len(body):
        return Frame(
            raw,
            body,
            None,
            _bad_topic_length(f"topic length {topic_len} overruns a {len(body)}-byte body"),
        )
    topic = decode_text(body[2 : 2 + topic_len])
    payload = body[2 + topic_len :]
    if payload and _first_word_known(payload):
        return _command(raw, body, decode_text(payload), topic)
    if not topic and payload and looks_like_command(decode_text(payload[:64])):
        # Only the broker knows all its commands (transactions): let it judge.
        return _command(raw, body, decode_text(payload), topic)
    message = EnvelopeMessage(topic, payload)
    if not topic or not payload:
        error = RemoteProtocolError(
            Problem.MISSING_FIELD,
            "envelope without a topic or a payload",
            code=MALFORMED_INPUT,
            reason=MISSING_TOPIC_OR_PAYLOAD,
            closes=True,
        )
        return Frame(raw, body, message, error, topic)
    return Frame(raw, body, message, None, topic)


def _bad_topic_length(message: str) -> RemoteProtocolError:
    # The broker's words for it.
    return RemoteProtocolError(
        Problem.FRAMING, message, code=DECODE_FAILED, reason="invalid topic length"
    )


def _scanned(raw: bytes, body: bytes | None) -> BatchFrame | None:
    """``raw``'s frame when its body (``body``; None: ``raw`` past its
    length prefix, which must then be right) is a batch the compiled check
    vouches for; else None."""
    if _compiled_head is None:
        return None
    if body is None:
        if len(raw) < LENGTH_SIZE or _U32.unpack_from(raw)[0] != len(raw) - LENGTH_SIZE:
            return None
        data, found = raw, _compiled_head(raw, LENGTH_SIZE)
    else:
        data, found = body, _compiled_head(body)
    if found is None:
        return None
    begin, end, partition, count, last = found
    head = BatchHead(decode_text(data[begin:end]), partition, count, None if last < 0 else last)
    return BatchFrame(raw, head, body)


def _batch(raw: bytes, body: bytes, compiled: bool) -> Frame:
    """A body the broker takes for a batch: checked in compiled code, or
    decoded by the reference (which says what is wrong)."""
    if compiled:
        found = _scanned(raw, body)
        if found is not None:
            return found
    try:
        return Frame(raw, body, decode_batch(body))
    except RemoteProtocolError as exc:
        return Frame(raw, body, None, exc)


def decode_reply_body(raw: bytes, body: bytes, compiled: bool = True) -> Frame:
    """Decode what a broker sent. Never raises."""
    if not body:
        return Frame(raw, body, _KEEPALIVE)
    if is_batch(body):
        return _batch(raw, body, compiled)
    try:
        return Frame(raw, body, parse_reply_text(decode_text(body)))
    except RemoteProtocolError as exc:
        return Frame(raw, body, None, exc)


def decode_stream(
    data: bytes,
    *,
    from_client: bool,
    compression: Compression = Compression.NONE,
    compiled: bool = True,
) -> list[Frame]:
    """Every frame of a complete byte stream (e.g. one side of a capture).

    Raises a fatal ``RemoteProtocolError`` if the stream ends inside a frame.
    """
    decoder = FrameDecoder(from_client=from_client, compression=compression, compiled=compiled)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    frames = list(decoder.frames())
    decoder.next_event()
    return frames
