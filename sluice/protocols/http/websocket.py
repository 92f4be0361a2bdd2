"""The WebSocket API through Sluice's HTTP listener, sans-I/O.

h11 carries the upgrade handshake (``sluice/proxy/http.py``); after the
broker's ``101 Switching Protocols`` both directions are relayed as they
came (``sluice/proxy/websocket.py``), and each is parsed on the way by
wsproto's frame parser, here, so that Sluice validates and counts frames:

- ``is_websocket_upgrade``, ``upgrade_headers``, ``switched_headers``,
  ``switch_problem``: the handshake's headers, both ways.
- ``FrameReader``: one direction's frames (``feed`` bytes, get what they
  held and how much of them to pass on), a malformed frame or a message
  over the size limit raising ``WebSocketError`` with the close code to
  send.
- ``close_frame``: the CLOSE frame Sluice writes itself when it ends a
  session.

No extension is negotiated (``Sec-WebSocket-Extensions`` stays behind), so
frames are plain and the parser reads them whole. Nothing here imports trio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from wsproto.frame_protocol import (
    CloseReason,
    Frame,
    FrameProtocol,
    MessageDecoder,
    Opcode,
    ParseFailed,
)

from sluice.protocols.http import Headers, answer_headers, forward_headers

# Frame kinds, by opcode: a metric label (a continuation frame counts as
# its message's kind, text or binary).
OPCODES = ("text", "binary", "close", "ping", "pong")
_OPCODE_NAMES = {
    Opcode.TEXT: "text",
    Opcode.BINARY: "binary",
    Opcode.CLOSE: "close",
    Opcode.PING: "ping",
    Opcode.PONG: "pong",
}
# How a session ended: a metric label. ``closed``: a CLOSE frame went by and
# a side hung up, or a CLOSE frame went each way and Sluice closed both
# connections after a grace; ``hangup``: a side hung up without one; the
# others: Sluice ended it (a CLOSE frame with the code to each side it could
# send one to).
ENDINGS = ("closed", "hangup", "protocol_error", "message_too_large", "idle_timeout", "shutdown")

PROTOCOL_ERROR = int(CloseReason.PROTOCOL_ERROR)  # 1002
MESSAGE_TOO_BIG = int(CloseReason.MESSAGE_TOO_BIG)  # 1009
GOING_AWAY = int(CloseReason.GOING_AWAY)  # 1001
NO_STATUS = int(CloseReason.NO_STATUS_RCVD)  # 1005: a CLOSE frame without a code


def _tokens(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> set[bytes]:
    return {
        token.strip().lower()
        for n, v in headers
        if n.lower() == name
        for token in v.split(b",")
        if token.strip()
    }


def is_websocket_upgrade(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The request asks to switch to WebSocket (``Upgrade: websocket``)."""
    return b"websocket" in _tokens(headers, b"upgrade")


def upgrade_headers(headers: Iterable[tuple[bytes, bytes]], host: bytes) -> Headers:
    """An upgrade request's headers as they go to the broker at ``host``:
    those of any request (``forward_headers``), ``Sec-WebSocket-Key``,
    ``-Version`` and ``-Protocol`` among them, less
    ``Sec-WebSocket-Extensions`` (Sluice reads plain frames only), and the
    upgrade asked for again on this hop."""
    kept = [
        (n, v)
        for n, v in forward_headers(headers, host)
        if n.lower() != b"sec-websocket-extensions"
    ]
    return [*kept, (b"connection", b"Upgrade"), (b"upgrade", b"websocket")]


def switched_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The broker's ``101`` headers as they go to the client
    (``Sec-WebSocket-Accept`` and the rest), the upgrade said again on this hop."""
    return [*answer_headers(headers), (b"connection", b"Upgrade"), (b"upgrade", b"websocket")]


def switch_problem(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a broker's ``101`` cannot be relayed (None: it can)."""
    headers = list(headers)
    if not is_websocket_upgrade(headers):
        return "the broker switched to a protocol other than WebSocket"
    if _tokens(headers, b"sec-websocket-extensions"):
        return "the broker chose a WebSocket extension, which Sluice did not offer"
    return None


class WebSocketError(Exception):
    """A direction Sluice will not relay further: ``code`` for the CLOSE
    frames, ``ending`` for the metric, the message for the log."""

    def __init__(self, code: int, ending: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.ending = ending


@dataclass
class Seen:
    """What one read held: frames completed (by opcode), data messages
    completed, and the CLOSE frame's code and reason if one came; with a
    reader that ``keeps`` them, each completed frame's payload too
    (``payloads``, in the order of ``frames``), and whether it ended its
    message (``finals``: False for a data message's fragment but its last;
    True for a control frame)."""

    frames: list[str] = field(default_factory=list)
    messages: int = 0
    close: tuple[int, str] | None = None
    payloads: list[bytes] = field(default_factory=list)
    finals: list[bool] = field(default_factory=list)
    # How many of the read's bytes to pass on (None: all of them): none
    # past the direction's CLOSE frame.
    passed: int | None = None


class _WireText(MessageDecoder):
    """wsproto's message decoder, whose text frames' payloads are the
    bytes each carried: checked as UTF-8 (a ``ParseFailed``, 1007,
    otherwise) but not decoded, since a character split between two
    fragments would be handed out whole with the second."""

    def process_frame(self, frame: Frame) -> Frame:
        checked = super().process_frame(frame)
        payload = frame.payload  # a data frame's: its bytes, unmasked
        assert isinstance(payload, bytes | bytearray)
        return Frame(
            checked.opcode, bytes(payload), checked.frame_finished, checked.message_finished
        )


# A close code IANA's registry assigns that wsproto 1.x takes for a reserved
# one: 1014 (Bad Gateway), which Jetty, the broker's web server, sends.
_ASSIGNED = frozenset({1014})


class _Frames(FrameProtocol):
    """wsproto's frame protocol, taking the close codes in ``_ASSIGNED``
    as any other it knows."""

    def _process_close(self, frame: Frame) -> Frame:
        data = frame.payload
        assert isinstance(data, bytes | bytearray)
        if len(data) < 2 or struct.unpack("!H", data[:2])[0] not in _ASSIGNED:
            return super()._process_close(frame)
        try:
            reason = bytes(data[2:]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseFailed(
                f"Error decoding CLOSE reason: {exc}", CloseReason.INVALID_FRAME_PAYLOAD_DATA
            ) from None
        code = struct.unpack("!H", data[:2])[0]
        return Frame(frame.opcode, (code, reason), frame.frame_finished, frame.message_finished)


class FrameReader:
    """One direction of a session, parsed by wsproto: ``from_client``
    frames must be masked, the broker's must not. A data message larger
    than ``max_message`` bytes (its frames' payloads together) is an error
    (1009), as is anything wsproto finds wrong (1002; 1007 for text that is
    not UTF-8). After a CLOSE frame nothing more is parsed, nor passed on
    (``Seen.passed``)."""

    def __init__(self, *, from_client: bool, max_message: int, keep: bool = False) -> None:
        # FrameProtocol(client=True) reads what a server sends.
        self._protocol = _Frames(client=not from_client, extensions=[])
        # Text frames' payloads as they came (wsproto 1.x's message decoder).
        self._protocol._message_decoder = _WireText()
        self.max_message = max_message
        # Whether frames' payloads are handed out (a recording keeps them),
        # and the parts of the frame being read.
        self.keep = keep
        self._parts: list[bytes] = []
        self.closed: tuple[int, str] | None = None
        self._message = 0
        self._frame_done = True
        # After an error: whether what came before the failed read ended
        # between frames (the failed read is not passed on).
        self._failed_between: bool | None = None

    def feed(self, data: bytes) -> Seen:
        seen = Seen()
        if self.closed is not None:
            seen.passed = 0  # a side says nothing after its CLOSE
            return seen
        if self._failed_between is not None:
            return seen
        before = self.between_frames
        self._protocol.receive_bytes(data)
        try:
            for frame in self._protocol.received_frames():
                self._frame_done = frame.frame_finished
                if frame.opcode is Opcode.CLOSE:
                    parsed = frame.payload  # (code, reason), checked by wsproto
                    assert isinstance(parsed, tuple)
                    self.closed = seen.close = (int(parsed[0]), str(parsed[1]))
                    seen.frames.append("close")
                    # What followed the CLOSE frame is still in wsproto's buffer.
                    seen.passed = len(data) - len(self._protocol._frame_decoder.buffer)
                    if self.keep:  # as on the wire: the code, then the reason
                        code = int(parsed[0])  # 1005: the frame had none
                        seen.finals.append(True)
                        seen.payloads.append(
                            b""
                            if code == NO_STATUS
                            else code.to_bytes(2, "big") + str(parsed[1]).encode()
                        )
                    break
                got = frame.payload
                assert isinstance(got, str | bytes | bytearray)
                payload = got.encode() if isinstance(got, str) else bytes(got)
                if self.keep:
                    self._parts.append(payload)
                if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                    self._message += len(payload)
                    if self._message > self.max_message:
                        raise WebSocketError(
                            MESSAGE_TOO_BIG,
                            "message_too_large",
                            f"a WebSocket message larger than {self.max_message} bytes "
                            "(--http-max-body)",
                        )
                    if frame.message_finished:
                        self._message = 0
                        seen.messages += 1
                if frame.frame_finished:
                    seen.frames.append(_OPCODE_NAMES[frame.opcode])
                    if self.keep:
                        seen.payloads.append(b"".join(self._parts))
                        seen.finals.append(frame.message_finished)
                        self._parts = []
        except WebSocketError:
            self._failed_between = before
            raise
        except ParseFailed as exc:
            self._failed_between = before
            raise WebSocketError(
                int(exc.code), "protocol_error", f"malformed WebSocket frame: {exc}"
            ) from None
        return seen

    @property
    def between_frames(self) -> bool:
        """Whatever came so far ended with a whole frame: a frame of
        Sluice's may follow it (a CLOSE). wsproto says no partial header
        is waiting in its buffer (its FrameDecoder's state, wsproto 1.x).
        After an error: whether the reads before the failed one did."""
        if self._failed_between is not None:
            return self._failed_between
        decoder = self._protocol._frame_decoder
        return self._frame_done and decoder.header is None and len(decoder.buffer) == 0


def close_frame(code: int, reason: str, *, to_client: bool) -> bytes:
    """A CLOSE frame of Sluice's: unmasked toward the client, masked (as a
    client's) toward the broker; the reason cut to fit a control frame."""
    return bytes(FrameProtocol(client=not to_client, extensions=[]).close(code, reason))
