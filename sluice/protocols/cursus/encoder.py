"""Building frames: the inverse of the decoder.

A proxy forwards unchanged frames as their original bytes; these functions
are for frames written from values (rewritten replies, refusals, the test
broker, replay and serve). Requests go out as the real client writes them:
text commands inside an envelope with topic ``""`` unless told otherwise,
and the whole body compressed with the broker-wide setting.
"""

from __future__ import annotations

import struct

from sluice.protocols.cursus.batch import Batch, encode_batch
from sluice.protocols.cursus.commands import Command, format_command
from sluice.protocols.cursus.compression import Compression, compress
from sluice.protocols.cursus.errors import (
    LocalProtocolError,
    Problem,
    ProtocolError,
    Refusal,
    refusal,
)
from sluice.protocols.cursus.frame import SPEC_MAX_FRAME_SIZE, EnvelopeMessage, Frame, OwnFrame
from sluice.protocols.cursus.replies import ErrorReply, Keepalive, Reply, format_reply
from sluice.protocols.cursus.text import encode_text

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
KEEPALIVE = b"\x00\x00\x00\x00"


def frame(body: bytes, *, max_frame_size: int = SPEC_MAX_FRAME_SIZE) -> bytes:
    """``body`` with its length prefix."""
    if len(body) > max_frame_size:
        raise LocalProtocolError(
            Problem.TOO_LARGE, f"body of {len(body)} bytes exceeds the limit of {max_frame_size}"
        )
    return _U32.pack(len(body)) + body


def envelope(topic: str, payload: bytes) -> bytes:
    """``[u16 topic length][topic][payload]`` (no length prefix)."""
    name = encode_text(topic)
    if len(name) > 0xFFFF:
        raise LocalProtocolError(Problem.PARSE, f"topic of {len(name)} bytes is too long")
    return _U16.pack(len(name)) + name + payload


def request_body(
    message: Command | Batch | EnvelopeMessage | Keepalive,
    *,
    envelope_topic: str | None = "",
) -> bytes:
    """The body a client sends for ``message``, before compression.

    Commands go in an envelope with ``envelope_topic`` (the client uses ``""``,
    and ``"admin"`` for CREATE); ``None`` sends the bare text.
    """
    if isinstance(message, Keepalive):
        return b""
    if isinstance(message, Batch):
        return encode_batch(message)
    if isinstance(message, EnvelopeMessage):
        return envelope(message.topic, message.payload)
    text = encode_text(format_command(message))
    return text if envelope_topic is None else envelope(envelope_topic, text)


def encode_request(
    message: Command | Batch | EnvelopeMessage | Keepalive,
    *,
    envelope_topic: str | None = "",
    compression: Compression = Compression.NONE,
    max_frame_size: int = SPEC_MAX_FRAME_SIZE,
) -> bytes:
    """A whole client frame for ``message`` (see ``request_body``)."""
    body = request_body(message, envelope_topic=envelope_topic)
    if body:
        body = compress(body, compression)
    return frame(body, max_frame_size=max_frame_size)


def reply_body(reply: Reply | Batch | Keepalive) -> bytes:
    """The body a broker sends for ``reply`` (never compressed)."""
    if isinstance(reply, Keepalive):
        return b""
    if isinstance(reply, Batch):
        return encode_batch(reply)
    return encode_text(format_reply(reply))


def encode_reply(
    reply: Reply | Batch | Keepalive, *, max_frame_size: int = SPEC_MAX_FRAME_SIZE
) -> bytes:
    """A whole broker frame for ``reply``."""
    return frame(reply_body(reply), max_frame_size=max_frame_size)


def refusal_frame(error: ProtocolError) -> tuple[bytes | None, bool]:
    """The broker's framed answer to ``error`` (``None``: no answer) and
    whether it then closes the connection."""
    answer: Refusal = refusal(error)
    body = answer.body
    return (None if body is None else frame(body)), answer.close


def refusal_reply(error: ProtocolError) -> tuple[ErrorReply | None, bool]:
    """The broker's answer to ``error`` as an ``ErrorReply`` (``None``: no
    answer) and whether it then closes the connection."""
    answer = refusal(error)
    if answer.text is None:
        return None, answer.close
    words = answer.text.split(" ", 2)  # "ERROR:", the code, the rest as one word
    return ErrorReply(words[1], tuple(words[2:])), answer.close


def own_frame(reply: Reply | Batch | Keepalive) -> Frame:
    """A broker-side frame Sluice writes itself, as a ``Frame`` for taps."""
    body = reply_body(reply)
    return OwnFrame(frame(body), body, reply)
