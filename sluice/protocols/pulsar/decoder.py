"""Incremental, sans-I/O frame decoder.

Feed it bytes as they arrive (any chunking), pull frames out::

    decoder = FrameDecoder()
    decoder.receive_data(chunk)          # b"" signals end of stream
    while (event := decoder.next_event()) is not NEED_DATA and event is not CLOSED:
        forward(event.raw)

Frame first, decode second: a frame whose boundaries are known is always
returned, with ``frame.error`` describing what is wrong inside it. Only a
problem that loses the frame boundary itself (a frame over the size limit, a
stream ending mid-frame) is raised, as a fatal ``RemoteProtocolError``; after
that the decoder refuses further work. No other exception escapes, whatever
the input bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, overload

import crc32c as _crc32c
from google.protobuf.message import DecodeError, Message

from sluice.protocols.core import compiled_frames_wanted
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.errors import Problem, RemoteProtocolError
from sluice.protocols.pulsar.frame import (
    BODY_FIELD,
    BODY_WITHOUT_REQUIRED,
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_PADDING,
    HOT_TYPES,
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CHECKSUM,
    PAYLOAD_TYPES,
    Frame,
    ScannedFrame,
    command_name,
    hot_ids,
    missing_fields,
)

if TYPE_CHECKING:
    from sluice._frames import Batch

Found = list[tuple[int, int, int, int, int, int, int, int, int]]
Scan = Callable[[bytes, int, int], Found]
Pack = Callable[[bytes, list[Frame], int], list[bytes | None]]
ScanBatch = Callable[[bytes, int, int], "Batch | None"]


class _Compiled(NamedTuple):
    scan: Scan
    pack: Pack
    scan_batch: ScanBatch
    # The send table (rust/src/account.rs; correlation.SendTable types it).
    send_table: Any
    # A recorded frame's summary numbers (recording/format.py types them).
    summary: Callable[[bytes], Any]
    # A relayed read carried whole in one call (rust/src/step.rs).
    step: Any
    # SENDs encrypted on the compiled path (rust/src/seal.rs): Seal, Sealing.
    seal: Any
    sealing: Any


def _compiled() -> _Compiled | None:
    """The compiled frame path (``sluice._frames``, built from rust/ into the
    wheel), unless ``SLUICE_FRAMES=python`` asks for the Python code alone.
    None in a source tree nobody built."""
    if not compiled_frames_wanted():
        return None
    try:
        from sluice._frames import (
            Seal,
            Sealing,
            SendTable,
            Step,
            pack_frames,
            scan,
            scan_batch,
            summary,
        )
    except ImportError:
        return None
    return _Compiled(scan, pack_frames, scan_batch, SendTable, summary, Step, Seal, Sealing)


COMPILED: Final = _compiled()
"""The compiled frame path's functions, or None."""
COMPILED_PACK: Final[Pack | None] = COMPILED.pack if COMPILED is not None else None
"""The compiled frame-record packer the recorder uses, or None."""
COMPILED_SCAN: Final[Scan | None] = COMPILED.scan if COMPILED is not None else None
"""The compiled frame scanner FrameDecoder uses by default, or None."""

_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">II")
_MAGIC_U32 = struct.Struct(">HI")
_MAGIC_U32_U32 = struct.Struct(">HII")
_CHECKSUM = int.from_bytes(MAGIC_CHECKSUM, "big")
_BROKER_ENTRY_METADATA = int.from_bytes(MAGIC_BROKER_ENTRY_METADATA, "big")
_crc = _crc32c.crc32c
_CONNECT = pb.BaseCommand.CONNECT
_parse_command = pb.BaseCommand.FromString
_parse_metadata = pb.MessageMetadata.FromString
_parse_bem = pb.BrokerEntryMetadata.FromString
# Below this many bytes, slicing (a copy) is cheaper than a memoryview.
_VIEW_FROM = 4096


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


def max_frame_size(max_message_size: int) -> int:
    """The largest whole frame (length prefix included) accepted for a message size limit."""
    return max_message_size + FRAME_PADDING


class FrameDecoder:
    """Turns one direction of a Pulsar byte stream into ``Frame`` objects.

    Received chunks are kept as they are and frames are sliced out of them,
    so a chunk holding exactly one frame is not copied at all, and chunks are
    joined only when a frame straddles them (each byte is copied at most
    twice, however the stream is split).
    """

    def __init__(
        self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, *, compiled: bool | None = None
    ) -> None:
        """``compiled``: use the compiled scanner (True: it must be there),
        the Python decoder alone (False), or the scanner when present (None)."""
        if compiled and COMPILED_SCAN is None:
            raise RuntimeError("the compiled frame scanner (sluice._frames) is not built")
        self._scan = COMPILED_SCAN if compiled is not False else None
        self._head = b""  # contiguous unread bytes start at self._pos
        self._pos = 0
        self._tail: list[bytes] = []  # later chunks, not joined yet
        self._tail_len = 0
        self._eof = False
        self._broken: RemoteProtocolError | None = None
        self.max_message_size = max_message_size

    @property
    def max_message_size(self) -> int:
        return self._max_message_size

    @max_message_size.setter
    def max_message_size(self, value: int) -> None:
        if value <= 0:
            raise ValueError(f"max_message_size must be positive, not {value}")
        self._max_message_size = value
        self._max_total = max_frame_size(value) - 4

    @property
    def max_total(self) -> int:
        """The largest length prefix accepted (the frame's size less 4)."""
        return self._max_total

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._head) - self._pos + self._tail_len

    def take_buffered(self) -> bytes:
        """The bytes received but not yet returned as frames (the start of
        a frame: frames are returned whole), given up; the decoder is as
        new after, but for the end of the stream and a break, kept."""
        if self._tail:
            self._join()
        rest = self._head[self._pos :]
        self._head, self._pos = b"", 0
        return rest

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer. An empty ``data`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("receive_data() after end of stream")
        chunk = data if type(data) is bytes else bytes(data)
        if self._pos == len(self._head) and not self._tail:
            self._head = chunk
            self._pos = 0
        else:
            self._tail.append(chunk)
            self._tail_len += len(chunk)

    def next_event(self) -> Frame | _Sentinel:
        """The next complete frame, ``NEED_DATA`` or ``CLOSED``.

        Raises a fatal ``RemoteProtocolError`` when framing is lost.
        """
        if self._broken is not None:
            raise self._broken
        pos = self._pos
        in_head = len(self._head) - pos
        if in_head < 4:
            if in_head + self._tail_len < 4:
                return self._at_end(in_head + self._tail_len)
            in_head = self._join()
            pos = 0
        (total,) = _U32.unpack_from(self._head, pos)
        if total > self._max_total:
            start = bytes(self._head[pos : pos + 4])
            if start.isascii() and start.decode().isprintable():  # "HTTP", "GET ", "SSH-"
                return self._break(
                    Problem.TOO_LARGE,
                    f"not the Pulsar binary protocol: the stream starts {start.decode()!r} "
                    "(an HTTP port, or another protocol's?)",
                )
            return self._break(
                Problem.TOO_LARGE,
                f"frame of {total + 4} bytes exceeds the limit of {self._max_total + 4} "
                f"(max message size {self._max_message_size})",
            )
        size = total + 4
        if in_head < size:
            if in_head + self._tail_len < size:
                return self._at_end(in_head + self._tail_len)
            self._join()
            pos = 0
        head = self._head
        self._pos = pos + size
        # A full-length slice of bytes is the object itself: no copy.
        raw = head[pos : pos + size]
        return decode_frame(raw) if self._scan is None else self._scan_one(raw)

    def _scan_one(self, raw: bytes) -> Frame:
        """One whole frame through the compiled scanner (a frame that
        straddled reads), else through the reference."""
        scan = self._scan
        assert scan is not None
        for _, kind, moff, poff, checksum, a, b, c, props in scan(raw, 0, self._max_total):
            if kind:
                return ScannedFrame(raw, kind, moff, poff, checksum, (a, b, c), props)
        return decode_frame(raw)

    def frames(self) -> Iterator[Frame]:
        """Every frame that is complete now, one at a time.

        The same as calling ``next_event()`` until it returns a sentinel, in
        one tight loop: this is the proxy's hot path. Frames are yielded as
        they are decoded, so memory is reused while it is still in cache.
        """
        # Not a generator itself: one generator per read, not two per frame.
        return self._scanned() if self._scan is not None else self._decoded()

    def _decoded(self) -> Iterator[Frame]:
        """``frames()`` with the Python decoder alone."""
        head = self._head
        pos = self._pos
        end = len(head)
        max_total = self._max_total
        unpack = _U32.unpack_from
        while True:
            if end - pos >= 4:
                (total,) = unpack(head, pos)
                stop = pos + 4 + total
                if total <= max_total and stop <= end:
                    self._pos = stop
                    yield decode_frame(head[pos:stop])
                    pos = stop
                    continue
            # Slow path: frames straddling chunks, limits, end of stream.
            event = self.next_event()
            if not isinstance(event, Frame):
                return
            yield event
            head = self._head
            pos = self._pos
            end = len(head)

    def take_batch(self) -> ScannedBatch | None:
        """Every complete frame of the contiguous bytes received as one
        ``ScannedBatch``, when the compiled scanner took every one of them;
        otherwise None, and nothing is taken (``frames()`` then goes frame
        by frame). A frame over the size limit or cut short stays, for
        ``frames()`` to say so."""
        if COMPILED is None or self._scan is None:
            return None
        if self._tail:  # a frame straddles reads: its start and the new bytes, joined
            if not self._whole_first():
                # Joined only once it is whole: a large frame sent in small
                # reads would otherwise be copied whole at each read (a 4 MiB
                # frame in 1,000-byte reads: 2 s of CPU, quadratic).
                return None
            self._join()
        head = self._head
        pos = self._pos
        if len(head) - pos < 8:
            return None
        found = COMPILED.scan_batch(head, pos, self._max_total)
        if found is None:
            return None
        self._pos = found.stop
        return ScannedBatch(head, found)

    def _scanned(self) -> Iterator[Frame]:
        """``frames()`` with the compiled scanner: one call finds every
        complete frame of the contiguous bytes and checks the hot ones; the
        rest go through ``decode_frame``, the reference."""
        scan = self._scan
        assert scan is not None
        scanned = ScannedFrame
        while True:
            head = self._head
            pos = self._pos
            if len(head) - pos >= 8:
                for stop, kind, moff, poff, checksum, a, b, c, props in scan(
                    head, pos, self._max_total
                ):
                    self._pos = stop
                    if kind:
                        yield scanned(head[pos:stop], kind, moff, poff, checksum, (a, b, c), props)
                    else:
                        yield decode_frame(head[pos:stop])
                    pos = stop
            # Frames straddling chunks, limits, end of stream.
            event = self.next_event()
            if not isinstance(event, Frame):
                return
            yield event

    def _whole_first(self) -> bool:
        """Whether the first frame buffered is all here (or its length
        prefix is not: then joining is cheap, the head being under 4
        bytes). A prefix over the limit counts as whole: it is said at once."""
        in_head = len(self._head) - self._pos
        if in_head < 4:
            return True
        total: int = _U32.unpack_from(self._head, self._pos)[0]
        return total > self._max_total or in_head + self._tail_len >= total + 4

    def _join(self) -> int:
        rest = memoryview(self._head)[self._pos :]
        self._head = b"".join([rest, *self._tail])
        rest.release()
        self._pos = 0
        self._tail.clear()
        self._tail_len = 0
        return len(self._head)

    def _at_end(self, available: int) -> _Sentinel:
        if not self._eof:
            return NEED_DATA
        if available == 0:
            return CLOSED
        return self._break(
            Problem.TRUNCATED, f"stream ended {available} bytes into an incomplete frame"
        )

    def _break(self, problem: Problem, message: str) -> _Sentinel:
        self._broken = RemoteProtocolError(problem, message, fatal=True)
        raise self._broken


def decode_frame(raw: bytes) -> Frame:
    """Decode one complete frame (length prefix included). Never raises."""
    size = len(raw)
    if size < 8:
        return Frame(raw, 0, None, _err(Problem.FRAMING, f"frame of {size} bytes has no command"))
    total, cmd_size = _U32_PAIR.unpack_from(raw, 0)
    if total != size - 4:
        return Frame(raw, 0, None, _err(Problem.FRAMING, "length prefix does not match frame"))
    cmd_end = 8 + cmd_size
    if cmd_end > size:
        return Frame(
            raw,
            0,
            None,
            _err(Problem.FRAMING, f"command size {cmd_size} exceeds frame size {total}"),
        )
    try:
        command = _parse_command(raw[8:cmd_end])
    except DecodeError as exc:
        return Frame(raw, _peek_type(raw[8:cmd_end]), None, _err(Problem.PARSE, f"command: {exc}"))
    type_ = command.type
    field = BODY_FIELD.get(type_)
    # A missing `type` reads as CONNECT (the enum's first value): a CONNECT
    # must name its type itself, or it lands in the slow path below, however
    # complete its body (brokers refuse a command without its type).
    if field is None:
        return _bad_command(raw, command, cmd_end)
    body = getattr(command, field)
    if (
        not body.IsInitialized()
        or (type_ in BODY_WITHOUT_REQUIRED and not _has_field(command, field))
        or (type_ == _CONNECT and not command.HasField("type"))
    ):
        return _bad_command(raw, command, cmd_end)
    if cmd_end == size:
        if type_ in PAYLOAD_TYPES:
            return Frame(
                raw,
                type_,
                command,
                _err(Problem.MISSING_FIELD, f"{command_name(type_)} without metadata"),
            )
        ids = hot_ids(type_, body, None) if type_ in HOT_TYPES else None
        return Frame(raw, type_, command, None, None, -1, -1, None, None, body, ids)
    if type_ not in PAYLOAD_TYPES:
        return Frame(
            raw,
            type_,
            command,
            _err(Problem.TRAILING, f"{size - cmd_end} bytes after a {command_name(type_)} command"),
        )
    # The layout clients and brokers send: a checksum, then the metadata. A
    # valid frame of that shape is decoded here; anything else, or any
    # fault, takes the general path below, which says what is wrong.
    if cmd_end + 10 <= size:
        magic, checksum, meta_size = _MAGIC_U32_U32.unpack_from(raw, cmd_end)
        offset = cmd_end + 6
        payload_offset = offset + 4 + meta_size
        if (
            magic == _CHECKSUM
            and payload_offset <= size
            and _crc(raw[offset:] if size - offset < _VIEW_FROM else memoryview(raw)[offset:])
            == checksum
        ):
            try:
                metadata = _parse_metadata(raw[offset + 4 : payload_offset])
            except DecodeError:
                pass
            else:
                if metadata.IsInitialized():
                    return Frame(raw, type_, command, None, metadata, offset, payload_offset,
                                 checksum, None, body, hot_ids(type_, body, metadata))  # fmt: skip
    return _decode_payload_section(raw, type_, command, cmd_end, body)


def _decode_payload_section(
    raw: bytes, type_: int, command: pb.BaseCommand, offset: int, body: Message
) -> Frame:
    size = len(raw)
    if offset + 6 > size:
        return Frame(raw, type_, command, _err(Problem.FRAMING, "payload section too short"))
    bem: pb.BrokerEntryMetadata | None = None
    magic, value = _MAGIC_U32.unpack_from(raw, offset)
    if magic == _BROKER_ENTRY_METADATA:
        bem_end = offset + 6 + value
        if bem_end + 6 > size:
            return Frame(
                raw, type_, command, _err(Problem.FRAMING, "broker entry metadata overruns frame")
            )
        try:
            bem = _parse_bem(raw[offset + 6 : bem_end])
        except DecodeError as exc:
            return Frame(raw, type_, command, _err(Problem.PARSE, f"broker entry metadata: {exc}"))
        offset = bem_end
        magic, value = _MAGIC_U32.unpack_from(raw, offset)
    checksum: int | None = None
    error: RemoteProtocolError | None = None
    if magic == _CHECKSUM:
        checksum = value
        offset += 6
        actual = _crc(raw[offset:] if size - offset < _VIEW_FROM else memoryview(raw)[offset:])
        if actual != checksum:
            error = _err(
                Problem.CHECKSUM,
                f"checksum mismatch: frame says {checksum:#010x}, content is {actual:#010x}",
            )
    if offset + 4 > size:
        return Frame(
            raw,
            type_,
            command,
            error or _err(Problem.FRAMING, "payload section without metadata size"),
            None,
            -1,
            -1,
            checksum,
            bem,
        )
    (meta_size,) = _U32.unpack_from(raw, offset)
    payload_offset = offset + 4 + meta_size
    if payload_offset > size:
        return Frame(
            raw,
            type_,
            command,
            error or _err(Problem.FRAMING, f"metadata size {meta_size} overruns frame"),
            None,
            -1,
            -1,
            checksum,
            bem,
        )
    try:
        metadata = _parse_metadata(raw[offset + 4 : payload_offset])
    except DecodeError as exc:
        return Frame(
            raw,
            type_,
            command,
            error or _err(Problem.PARSE, f"message metadata: {exc}"),
            None,
            offset,
            payload_offset,
            checksum,
            bem,
        )
    if error is None and not metadata.IsInitialized():
        missing = missing_fields(metadata)
        error = _err(Problem.MISSING_FIELD, f"message metadata lacks {missing}")
    ids = hot_ids(type_, body, metadata) if error is None else None
    return Frame(
        raw, type_, command, error, metadata, offset, payload_offset, checksum, bem, body, ids
    )


def _has_field(message: Message, name: str) -> bool:
    return message.HasField(name)


def _bad_command(raw: bytes, command: pb.BaseCommand, cmd_end: int) -> Frame:
    """Explain why a parsed command failed the fast validity check."""
    if not command.HasField("type"):
        type_ = _peek_type(raw[8:cmd_end])
        if type_ and type_ not in BODY_FIELD:
            # Kept as-is and passed on; a newer peer may know what it means.
            return Frame(
                raw, type_, None, _err(Problem.UNKNOWN_TYPE, f"unknown command type {type_}")
            )
        return Frame(raw, 0, None, _err(Problem.MISSING_FIELD, "command has no type"))
    type_ = command.type
    field = BODY_FIELD[type_]
    if not _has_field(command, field):
        return Frame(
            raw,
            type_,
            command,
            _err(Problem.MISSING_FIELD, f"{command_name(type_)} without its {field} body"),
        )
    missing = missing_fields(getattr(command, field))
    return Frame(
        raw,
        type_,
        command,
        _err(Problem.MISSING_FIELD, f"{command_name(type_)} lacks required {missing}"),
    )


def _peek_type(data: bytes) -> int:
    """Best-effort read of BaseCommand field 1 (a varint) from raw bytes; 0 if absent."""
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        if key < 0:
            return 0
        wire = key & 7
        if key >> 3 == 1 and wire == 0:
            value, _ = _varint(data, pos)
            return value if 0 < value < 2**31 else 0
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            if length < 0:
                return 0
            pos += length
        elif wire == 5:
            pos += 4
        else:
            return 0
        if pos < 0:
            return 0
    return 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position), or (-1, -1) when the varint is cut short or too long."""
    result = 0
    shift = 0
    end = len(data)
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    return -1, -1


def _err(problem: Problem, message: str) -> RemoteProtocolError:
    return RemoteProtocolError(problem, message)


def decode_stream(
    data: bytes, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, *, compiled: bool | None = None
) -> list[Frame]:
    """Decode a complete byte stream (e.g. a capture file) into frames.

    Raises a fatal ``RemoteProtocolError`` if the stream is cut mid-frame or
    holds a frame over the size limit.
    """
    decoder = FrameDecoder(max_message_size, compiled=compiled)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    frames = list(decoder.frames())
    decoder.next_event()  # raises on trailing partial frame
    return frames


class ScannedBatch(Sequence[Frame]):
    """The frames of one read, every one taken by the compiled scanner,
    shown to the taps at once. A tap that can count or record them in bulk
    reads ``counts`` or calls ``packed``; any other sees ``Frame`` objects,
    made when first asked for."""

    __slots__ = ("_frames", "data", "found")

    def __init__(self, data: bytes, found: Batch) -> None:
        self.data = data
        # The frames as the scanner found them in ``data``, kept in compiled
        # code: one (stop, type, metadata_offset, payload_offset, checksum,
        # a, b, c, properties) per frame, made when asked for.
        self.found = found
        self._frames: list[Frame] | None = None

    @property
    def start(self) -> int:
        """Where the first frame starts in ``data``."""
        return self.found.start

    @property
    def stop(self) -> int:
        """Where the last frame ends in ``data``."""
        return self.found.stop

    @property
    def counts(self) -> list[tuple[int, int, int]]:
        """(command type, frames, bytes) for each type in the batch."""
        return self.found.counts

    def frame(self, index: int) -> ScannedFrame:
        """The ``index``th frame, made afresh."""
        found = self.found
        begin = self.start if index == 0 else found[index - 1][0]
        stop, kind, moff, poff, checksum, a, b, c, props = found[index]
        return ScannedFrame(self.data[begin:stop], kind, moff, poff, checksum, (a, b, c), props)

    def packed(self, prefix: bytes, payloads: int) -> list[bytes | None]:
        """The recorder's records (``pack_frames``), None for each frame the
        compiled packer leaves to the Python recorder."""
        return self.found.pack(prefix, self.data, payloads)

    def _all(self) -> list[Frame]:
        frames = self._frames
        if frames is None:
            frames = self._frames = [self.frame(i) for i in range(len(self.found))]
        return frames

    def __len__(self) -> int:
        return len(self.found)

    @overload
    def __getitem__(self, index: int) -> Frame: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Frame]: ...

    def __getitem__(self, index: int | slice) -> Frame | Sequence[Frame]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Frame]:
        return iter(self._all())
