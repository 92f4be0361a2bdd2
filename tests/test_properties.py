"""Property tests for the codec (Hypothesis)."""

from __future__ import annotations

import contextlib
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocols.pulsar import (
    CLOSED,
    NEED_DATA,
    Frame,
    FrameDecoder,
    Problem,
    RemoteProtocolError,
    decode_frame,
    encode,
)
from sluice.protocols.pulsar.decoder import _decode_payload_section
from sluice.protocols.pulsar.payload import messages
from tests.strategies import PayloadFrame, commands, frame_bytes, payload_frames

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def feed(chunks: list[bytes], max_message_size: int | None = None) -> list[Frame]:
    decoder = FrameDecoder() if max_message_size is None else FrameDecoder(max_message_size)
    out: list[Frame] = []
    # An empty chunk means end of stream, so only the last one may be empty.
    for chunk in [*(c for c in chunks if c), b""]:
        decoder.receive_data(chunk)
        while True:
            event = decoder.next_event()
            if event is NEED_DATA or event is CLOSED:
                break
            assert isinstance(event, Frame)
            out.append(event)
    return out


def feed_fast(chunks: list[bytes]) -> list[Frame]:
    """Like feed(), through the frames() fast path the proxy uses."""
    decoder = FrameDecoder()
    out: list[Frame] = []
    for chunk in [*(c for c in chunks if c), b""]:
        decoder.receive_data(chunk)
        out += list(decoder.frames())
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@SETTINGS
@given(st.lists(frame_bytes(), min_size=1, max_size=6), st.lists(st.integers(0, 10**6)))
def test_a_stream_split_anywhere_decodes_to_the_same_frames(
    frames: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(frames)
    whole = feed([data])
    pieces = feed(split(data, cuts))
    fast = feed_fast(split(data, cuts))
    assert [f.raw for f in fast] == frames
    assert [f.raw for f in whole] == frames
    assert [f.raw for f in pieces] == frames
    assert all(f.ok for f in pieces), [f.error for f in pieces if not f.ok]
    assert [f.type for f in pieces] == [f.type for f in whole]


@SETTINGS
@given(commands())
def test_simple_commands_round_trip(cmd: object) -> None:
    raw = encode(cmd)  # type: ignore[arg-type]
    frame = decode_frame(raw)
    assert frame.ok, frame.error
    assert frame.command == cmd
    assert frame.raw == raw


@SETTINGS
@given(payload_frames())
def test_payload_commands_round_trip(pf: PayloadFrame) -> None:
    frame = decode_frame(pf.raw)
    assert frame.ok, frame.error
    assert frame.command == pf.command
    assert frame.metadata == pf.metadata
    assert bytes(frame.payload) == pf.payload
    assert (frame.checksum is not None) == pf.checksum
    assert frame.broker_entry_metadata == pf.broker_entry_metadata
    assert [m.payload for m in messages(frame)] == pf.messages


@SETTINGS
@given(payload_frames(checksum=True), st.data())
def test_any_corrupted_byte_under_the_checksum_is_detected(
    pf: PayloadFrame, data: st.DataObject
) -> None:
    frame = decode_frame(pf.raw)
    covered_from = frame.metadata_offset
    index = data.draw(st.integers(covered_from, len(pf.raw) - 1))
    flip = data.draw(st.integers(1, 255))
    corrupted = bytearray(pf.raw)
    corrupted[index] ^= flip
    bad = decode_frame(bytes(corrupted))
    assert bad.error is not None
    assert bad.error.problem is Problem.CHECKSUM
    assert bad.error.server_error_name == "ChecksumError"


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(1, 4096))
def test_arbitrary_bytes_only_ever_give_typed_errors(chunks: list[bytes], limit: int) -> None:
    try:
        frames = feed(chunks, max_message_size=limit)
    except RemoteProtocolError as exc:
        assert exc.fatal
        return
    for frame in frames:
        assert frame.error is None or isinstance(frame.error, RemoteProtocolError)


@SETTINGS
@given(frame_bytes(), st.data())
def test_mutated_frames_only_ever_give_typed_errors(raw: bytes, data: st.DataObject) -> None:
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(mutated) - 1))
        mutated[index] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del mutated[data.draw(st.integers(0, len(mutated))) :]
    frame = decode_frame(bytes(mutated))
    assert frame.raw == bytes(mutated)
    if frame.metadata is not None:
        with contextlib.suppress(RemoteProtocolError):
            messages(frame)


@SETTINGS
@given(payload_frames(), st.data())
def test_the_usual_layouts_shortcut_decodes_as_the_general_path_does(
    pf: PayloadFrame, data: st.DataObject
) -> None:
    """``decode_frame`` takes a shortcut for a valid checksummed frame;
    whatever the bytes after the command, it must give what the general
    payload-section path gives."""
    raw = bytearray(pf.raw)
    cmd_end = 8 + int.from_bytes(raw[4:8], "big")
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(cmd_end, len(raw) - 1))] = data.draw(st.integers(0, 255))
    frame = decode_frame(bytes(raw))
    general = _decode_payload_section(bytes(raw), frame.type, pf.command, cmd_end, frame.body)
    for name in Frame.__slots__:
        got, want = getattr(frame, name), getattr(general, name)
        if name == "error":
            got, want = (e and (e.problem, e.message) for e in (got, want))
        assert got == want, name
