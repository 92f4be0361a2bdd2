"""Fuzz harness: the Pulsar frame decoder, fed any bytes in any chunking,
and payload inspection of every frame it returns.

Input: one byte that picks the chunking (``common.chunked``) and the size
limit, then the byte stream of one direction. Promises checked:

- ``FrameDecoder`` raises nothing but a fatal ``RemoteProtocolError``, and
  once it has raised it raises the same again;
- the frames are the stream cut at frame boundaries (their bytes, joined,
  are what was read), and the same whatever the chunking, through
  ``frames()`` (the compiled scanner, when built) or ``next_event()`` (the
  Python decoder, the reference);
- a frame without an error has its command, body and, for SEND and MESSAGE,
  its metadata; every error maps to the ServerError a broker answers with;
- payload inspection (``payload.messages``) raises nothing but a non-fatal
  ``RemoteProtocolError``;
- the recorder can record every frame (credentials redacted or the bytes
  withheld), and a log line can show it (``redact.loggable``).
"""

from __future__ import annotations

from sluice.protocols.pulsar import payload
from sluice.protocols.pulsar.decoder import CLOSED, NEED_DATA, FrameDecoder
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.protocols.pulsar.frame import BODY_FIELD, PAYLOAD_TYPES, Frame
from sluice.protocols.pulsar.redact import loggable
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder
from tests.fuzz import common
from tests.fuzz.common import check, chunked
from tests.test_compiled_frames import assert_same

# Small enough that the fuzzer reaches the size limit, large enough for the
# recorded frames.
SMALL_LIMIT = 4096
LARGE_LIMIT = 5 * 1024 * 1024

Outcome = tuple[list[Frame], str | None]
RECORDER = FrameRecorder(PayloadPolicy.FULL)


def decode(chunks: list[bytes], limit: int, *, stepwise: bool, compiled: bool | None) -> Outcome:
    """Every frame of the chunks, and the fatal error's text (None: closed cleanly)."""
    decoder = FrameDecoder(limit, compiled=compiled)
    frames, fatal = common.decode(
        decoder, chunks, stepwise=stepwise, need_data=NEED_DATA, closed=CLOSED
    )
    return frames, None if fatal is None else repr(fatal)


def inspect(frame: Frame) -> None:
    error = frame.error
    if error is None:
        check(frame.command is not None and frame.body is not None, f"{frame!r} has no body")
        check(frame.type in BODY_FIELD, f"{frame!r} is of no known type")
        if frame.type in PAYLOAD_TYPES:
            check(frame.metadata is not None, f"{frame!r} has no metadata")
            check(
                0 <= frame.metadata_offset < frame.payload_offset <= len(frame.raw),
                f"{frame!r} has offsets {frame.metadata_offset}, {frame.payload_offset}",
            )
    else:
        check(not error.fatal, f"{frame!r} carries a fatal error")
        error.server_error_name  # noqa: B018 (every problem has a ServerError)
    repr(frame)
    if frame.metadata is not None:
        try:
            payload.messages(frame)
        except RemoteProtocolError as exc:
            check(not exc.fatal, f"payload inspection raised a fatal error: {exc!r}")
            exc.server_error_name  # noqa: B018
    RECORDER.packed(1, 0, 1, 1, [frame])
    loggable(frame)


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    plan, stream = data[0], data[1:]
    limit = SMALL_LIMIT if plan & 0x80 else LARGE_LIMIT
    # The reference: the Python decoder, the stream in one read.
    frames, fatal = decode([stream], limit, stepwise=False, compiled=False)
    joined = b"".join(f.raw for f in frames)
    check(stream.startswith(joined), "frames are not the stream cut at boundaries")
    check(fatal is not None or joined == stream, "a clean close left bytes unread")
    # The proxy's way (the compiled scanner when built), in reads as the plan cuts them.
    cut, cut_fatal = decode(chunked(stream, plan), limit, stepwise=bool(plan & 0x40), compiled=None)
    check(len(cut) == len(frames), "the chunking changed the frames")
    for one, other in zip(cut, frames, strict=True):
        assert_same(one, other)
    check(cut_fatal == fatal, f"the chunking changed the ending: {cut_fatal} != {fatal}")
    for frame in frames:
        inspect(frame)
