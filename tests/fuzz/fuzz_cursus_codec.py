"""Fuzz harness: the Cursus frame decoder and what it uses (the broker's
classification, text commands and replies, batches, decompression), and the
address rewriting the proxy applies to replies.

Input: one byte that picks the direction, the broker's compression, the
size limit and the chunking (``common.chunked``), then the byte stream of
that direction. Promises checked:

- ``FrameDecoder`` raises nothing but a fatal ``RemoteProtocolError``, and
  once it has raised it raises the same again;
- the frames are the stream cut at frame boundaries, whatever the chunking,
  the same through ``frames()`` and ``next_event()``;
- every error has the refusal the broker answers with;
- a decoded command, reply or batch written out again (``format_command``,
  ``format_reply``, ``encode_batch``: what replay sends) reads back as the
  same value, unless the writer refuses it with ``LocalProtocolError``;
- after ``rewrite_addresses``, a reply names no broker address but the
  proxy's: a client never learns one to dial around the proxy.
"""

from __future__ import annotations

from sluice.protocols.cursus import (
    CLOSED,
    NEED_DATA,
    Batch,
    BatchAck,
    Compression,
    Frame,
    FrameDecoder,
    Keepalive,
    LocalProtocolError,
    OtherCommand,
    RemoteProtocolError,
    StreamControl,
    addresses_in,
    decode_batch,
    encode_batch,
    format_command,
    format_reply,
    parse_command,
    parse_reply_text,
    refusal,
    rewrite_addresses,
)
from sluice.protocols.cursus.commands import Command
from sluice.protocols.cursus.replies import ErrorReply, OkReply
from tests.fuzz import common
from tests.fuzz.common import check, chunked

COMPRESSIONS = tuple(Compression)
SMALL_LIMIT = 4096
PROXY_HOST = "127.0.0.1"

Outcome = tuple[list[Frame], str | None]


def decode(chunks: list[bytes], decoder: FrameDecoder, *, stepwise: bool) -> Outcome:
    """Every frame of the chunks, and the fatal error's text (None: closed cleanly)."""
    frames, fatal = common.decode(
        decoder, chunks, stepwise=stepwise, need_data=NEED_DATA, closed=CLOSED
    )
    if fatal is None:
        return frames, None
    assert isinstance(fatal, RemoteProtocolError)
    check(refusal(fatal).close, "lost framing does not close")
    return frames, repr(fatal)


def key(frame: Frame) -> tuple[object, ...]:
    error = None if frame.error is None else repr(frame.error)
    return frame.raw, frame.body, frame.message, error, frame.envelope


def reads_back(frame: Frame) -> None:
    message = frame.message
    try:
        if isinstance(message, Batch):
            check(decode_batch(encode_batch(message)) == message, "batch does not read back")
        elif isinstance(message, Command) and not isinstance(message, OtherCommand):
            text = format_command(message)
            check(parse_command(text) == message, f"command does not read back as {text!r}")
        elif isinstance(message, OkReply | ErrorReply | BatchAck | StreamControl):
            text = format_reply(message)
            check(parse_reply_text(text) == message, f"reply does not read back as {text!r}")
    except LocalProtocolError:
        pass  # the writer refused it, as documented


def to_proxy(host: str, port: int) -> tuple[str, int]:
    return PROXY_HOST, 7000 + port % 1000


def rewritten(frame: Frame) -> None:
    if isinstance(frame.message, Batch | Keepalive | BatchAck | StreamControl):
        return  # the client routes by none of these; the proxy leaves them
    body = rewrite_addresses(frame.body, to_proxy)
    final = frame.body if body is None else body
    left = [a for a in addresses_in(final) if a[0] != PROXY_HOST]
    check(not left, f"rewritten reply still names {left}")


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    plan, stream = data[0], data[1:]
    from_client = bool(plan & 1)
    compression = COMPRESSIONS[(plan >> 1) % len(COMPRESSIONS)] if from_client else None

    def decoder() -> FrameDecoder:
        limit = SMALL_LIMIT if plan & 0x80 else None
        return FrameDecoder(
            from_client=from_client,
            max_frame_size=limit,
            compression=compression or Compression.NONE,
        )

    frames, fatal = decode([stream], decoder(), stepwise=False)
    joined = b"".join(f.raw for f in frames)
    check(stream.startswith(joined), "frames are not the stream cut at boundaries")
    check(fatal is not None or joined == stream, "a clean close left bytes unread")
    cut, cut_fatal = decode(chunked(stream, plan), decoder(), stepwise=bool(plan & 0x40))
    check([key(f) for f in cut] == [key(f) for f in frames], "the chunking changed the frames")
    check(cut_fatal == fatal, f"the chunking changed the ending: {cut_fatal} != {fatal}")
    for frame in frames:
        repr(frame)
        if frame.error is not None:
            check(not frame.error.fatal, f"{frame!r} carries a fatal error")
            refusal(frame.error)
        else:
            reads_back(frame)
        if not from_client:
            rewritten(frame)
