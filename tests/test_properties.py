"""Property tests for the codec (Hypothesis)."""

from __future__ import annotations

import contextlib
import itertools
from unittest import mock

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocols.pulsar import (
    CLOSED,
    NEED_DATA,
    Frame,
    FrameDecoder,
    Problem,
    RemoteProtocolError,
    Type,
    command,
    decode_frame,
    decoder,
    encode,
    pb,
)
from sluice.protocols.pulsar.payload import messages
from tests.helpers.strategies import PayloadFrame, commands, frame_bytes, payload_frames

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
    payload-section path gives. Mutated frames get their checksum made
    right again half of the time, so that broken metadata reaches the
    shortcut's later checks too."""
    raw = bytearray(pf.raw)
    cmd_end = 8 + int.from_bytes(raw[4:8], "big")
    mutations = data.draw(st.integers(0, 3))
    for _ in range(mutations):
        raw[data.draw(st.integers(cmd_end, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if raw[cmd_end : cmd_end + 2] == b"\x0e\x01" and data.draw(st.booleans()):
        raw[cmd_end + 2 : cmd_end + 6] = crc32c(bytes(raw[cmd_end + 6 :])).to_bytes(4, "big")
    with mock.patch.object(decoder, "_decode_payload_section",
                           wraps=decoder._decode_payload_section) as general:  # fmt: skip
        frame = decode_frame(bytes(raw))
    if not mutations and pf.checksum and pf.broker_entry_metadata is None:
        assert not general.called  # the shortcut took it
    want = decoder._decode_payload_section(bytes(raw), frame.type, pf.command, cmd_end, frame.body)
    for name in Frame.__slots__:
        got, expected = getattr(frame, name), getattr(want, name)
        if name == "error":
            got, expected = (e and (e.problem, e.message) for e in (got, expected))
        assert got == expected, name


def _checksummed_send(
    metadata: bytes, payload: bytes = b"body", meta_size: int | None = None
) -> bytes:
    """A SEND frame with these metadata bytes and a right checksum."""
    cmd = command(Type.Value("SEND"), pb.CommandSend(producer_id=1, sequence_id=2))
    cmd_bytes = cmd.SerializeToString()
    size = len(metadata) if meta_size is None else meta_size
    covered = size.to_bytes(4, "big") + metadata + payload
    rest = len(cmd_bytes).to_bytes(4, "big") + cmd_bytes + b"\x0e\x01"
    rest += crc32c(covered).to_bytes(4, "big") + covered
    return len(rest).to_bytes(4, "big") + rest


_COMPLETE = pb.MessageMetadata(producer_name="p", sequence_id=2, publish_time=3)


@pytest.mark.parametrize(
    "raw",
    [
        _checksummed_send(_COMPLETE.SerializeToString()),  # the shortcut's own case
        _checksummed_send(b"\xff\xff\xff"),  # does not parse
        _checksummed_send(
            pb.MessageMetadata(producer_name="p").SerializePartialToString()
        ),  # lacks fields
        _checksummed_send(b"", b""),  # no metadata at all
        _checksummed_send(_COMPLETE.SerializeToString(), meta_size=10_000),  # size overruns
        _checksummed_send(_COMPLETE.SerializeToString(), b"")[:-3],  # length prefix made wrong
    ],
    ids=["valid", "unparseable", "incomplete", "empty", "overrun", "cut"],
)
def test_the_shortcut_falls_back_on_broken_metadata_under_a_right_checksum(raw: bytes) -> None:
    frame = decode_frame(raw)
    if frame.command is None:  # refused before the payload section: nothing to compare
        assert frame.error is not None
        return
    cmd_end = 8 + int.from_bytes(raw[4:8], "big")
    want = decoder._decode_payload_section(raw, frame.type, frame.command, cmd_end, frame.body)
    for name in Frame.__slots__:
        got, expected = getattr(frame, name), getattr(want, name)
        if name == "error":
            got, expected = (e and (e.problem, e.message) for e in (got, expected))
        assert got == expected, name
