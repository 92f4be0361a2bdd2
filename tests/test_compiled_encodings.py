"""The compiled frame path (rust/, ``sluice._frames``) against the Python
reference on protobuf as any encoder may write it, not only as protobuf's
own serializer does: keys and varints padded to more bytes than they need,
fields repeated, reordered, of the wrong wire type, unknown fields of every
wire type (groups and invalid ones included) and nested messages encoded the
same way, in hot frames (SEND, SEND_RECEIPT, MESSAGE, ACK, FLOW) with the
checksum present, absent or wrong, cut anywhere across reads. The scanner,
the summary reader and the record packer must agree with the reference on
every frame; the compiled send table with the Python one on any sequence
of SENDs and answers.
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path
from typing import Any

import crc32c
import hypothesis.strategies as st
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, example, given, settings

from sluice.protocols.pulsar import Type, decode_frame, pb
from sluice.protocols.pulsar.correlation import SEND_TABLE, SendTable
from sluice.protocols.pulsar.decoder import COMPILED_SCAN, decode_stream
from sluice.protocols.pulsar.frame import BODY_FIELD, ScannedFrame
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder
from sluice.recording.writer import Recorder, RecorderConfig
from tests.helpers.strategies import commands, message_of
from tests.test_compiled_frames import assert_equivalent, recorder_prefix, run_core, split
from tests.test_compiled_summaries import assert_summarized_alike, frame_record
from tests.test_quick_step import records, relay

T = Type.Value
HOT: list[int] = [T("SEND"), T("SEND_RECEIPT"), T("MESSAGE"), T("ACK"), T("FLOW")]
SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

# --- protobuf's wire format, written by hand ------------------------------------------


def varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint, ``pad`` bytes longer than it needs (the last
    byte marked as going on, then 0x80s and a 0x00): still the same value."""
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value:
            break
        out[-1] |= 0x80
    if pad:
        out[-1] |= 0x80
        out += b"\x80" * (pad - 1) + b"\x00"
    return bytes(out)


def sized(value: int, size: int) -> bytes:
    """``value`` as a varint padded to ``size`` bytes where it is shorter."""
    return varint(value, max(0, size - len(varint(value))))


def key(field: int, wire: int, size: int = 0) -> bytes:
    """A field's key, padded to ``size`` bytes where it is shorter."""
    return sized(field << 3 | wire, size)


Token = tuple[int, int, Any]  # (field, wire type, value: int or bytes)


def tokens(data: bytes) -> list[Token]:
    """The fields of a message protobuf serialized (no groups)."""
    out: list[Token] = []
    pos = 0

    def read() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while pos < len(data):
        k = read()
        field, wire = k >> 3, k & 7
        if wire == 0:
            out.append((field, wire, read()))
        elif wire == 2:
            n = read()
            out.append((field, wire, data[pos : pos + n]))
            pos += n
        else:
            n = 8 if wire == 1 else 4
            out.append((field, wire, data[pos : pos + n]))
            pos += n
    return out


UNKNOWN_FIELDS = [50, 99, 1000, 19_000, 2**29 - 1]


@st.composite
def unknown_field(draw: st.DrawFn, wild: bool) -> bytes:
    """A field the schema does not have; ``wild``: of any wire type, its
    key padded to any length (protobuf refuses some of these)."""
    field = draw(st.sampled_from(UNKNOWN_FIELDS))
    wire = draw(st.sampled_from([0, 0, 1, 2, 2, 5, 3, 4, 6, 7] if wild else [0, 1, 2, 5]))
    k = key(field, wire, draw(st.sampled_from([0, 0, 0, 5, 6, 8] if wild else [0, 0, 3, 5])))
    if wire == 0:
        return k + varint(draw(st.sampled_from([0, 1, 2**63, 2**64 - 1])), draw(st.integers(0, 2)))
    if wire == 1:
        return k + draw(st.binary(min_size=8, max_size=8))
    if wire == 2:
        return k + varint(len(body := draw(st.binary(max_size=6)))) + body
    if wire == 5:
        return k + draw(st.binary(min_size=4, max_size=4))
    if wire == 3:  # a group: its end, or not
        return k + (key(field, 4) if draw(st.booleans()) else b"")
    return k  # an end of group alone, or a wire type that does not exist


def message_descriptor(descriptor: Descriptor, field: int) -> Descriptor | None:
    f = descriptor.fields_by_number.get(field)
    if f is not None and f.type == FieldDescriptor.TYPE_MESSAGE:
        return f.message_type
    return None


@st.composite
def rewritten(
    draw: st.DrawFn, data: bytes, descriptor: Descriptor, wild: bool, depth: int = 0
) -> bytes:
    """``data`` (a message protobuf serialized) written again as another
    encoder might: the same message (keys and varints padded, fields
    repeated, reordered, unknown fields added), or, ``wild``, sometimes
    not (a key padded to 6 bytes or more, a wrong wire type, an unknown
    group), which the reference then says is wrong."""
    out: list[bytes] = []
    toks = tokens(data)
    if len(toks) > 1 and draw(st.integers(0, 5)) == 0:
        toks = draw(st.permutations(toks))
    for field, wire, value in toks:
        copies = 2 if draw(st.integers(0, 7)) == 0 else 1
        for _ in range(copies):
            size = draw(st.sampled_from([0] * 12 + ([2, 3, 5, 6, 7] if wild else [2, 3, 5])))
            if wire == 0:
                value_pad = draw(st.sampled_from([0] * 6 + [1, 3]))
                v = value
                if draw(st.integers(0, 9)) == 0:
                    v |= draw(st.sampled_from([1 << 32, 1 << 40, 1 << 63]))  # bits int32 drops
                if len(varint(v, value_pad)) > 10:
                    value_pad = 0
                if wild and draw(st.integers(0, 15)) == 0:
                    # the wrong wire type for this field
                    out.append(key(field, 2) + varint(len(enc := varint(v))) + enc)
                else:
                    out.append(key(field, 0, size) + varint(v, value_pad))
            elif wire == 2:
                nested = message_descriptor(descriptor, field)
                body = value
                if nested is not None and depth < 4:
                    body = draw(rewritten(value, nested, wild, depth + 1))
                out.append(
                    key(field, 2, size)
                    + sized(
                        len(body),
                        draw(st.sampled_from([0] * 6 + ([2, 5, 6, 10] if wild else [2, 5]))),
                    )
                    + body
                )
            else:
                out.append(key(field, wire, size) + value)
        if draw(st.integers(0, 9)) == 0:
            out.append(draw(unknown_field(wild)))
    if draw(st.integers(0, 9)) == 0:
        out.insert(draw(st.integers(0, len(out))), draw(unknown_field(wild)))
    return b"".join(out)


def framed(command: bytes, section: tuple[bytes, bytes] | None, checksum: str) -> bytes:
    """A frame of ``command`` (serialized) and, for SEND and MESSAGE, its
    metadata and payload, with a checksum right, wrong or none."""
    content = struct.pack(">I", len(command)) + command
    if section is not None:
        metadata, payload = section
        rest = struct.pack(">I", len(metadata)) + metadata + payload
        if checksum != "none":
            crc = crc32c.crc32c(rest) ^ (checksum == "wrong")
            rest = b"\x0e\x01" + struct.pack(">I", crc) + rest
        content += rest
    return struct.pack(">I", len(content)) + content


@st.composite
def hot_frames(draw: st.DrawFn, types: list[int] = HOT, known: bool = False) -> bytes:
    """A hot frame, its command and metadata rewritten (``rewritten``);
    ``known``: of the producers and consumers ``proxied`` opens, or not."""
    base = draw(commands(types))
    if known:
        body = getattr(base, BODY_FIELD[base.type])
        if base.type in (T("SEND"), T("SEND_RECEIPT")):
            body.producer_id = draw(st.sampled_from([1, 2, 9]))
            body.sequence_id = draw(st.integers(0, 4))
        else:
            body.consumer_id = draw(st.sampled_from([5, 6]))
        if base.type == T("ACK") and draw(st.booleans()):
            body.ClearField("request_id")
    wild = draw(st.integers(0, 3)) == 0
    command = draw(rewritten(base.SerializeToString(), pb.BaseCommand.DESCRIPTOR, wild))
    section = None
    if base.type in (T("SEND"), T("MESSAGE")):
        metadata = draw(message_of(pb.MessageMetadata.DESCRIPTOR))
        encoded = draw(rewritten(metadata.SerializeToString(), pb.MessageMetadata.DESCRIPTOR, wild))
        payload = draw(st.sampled_from([b"", b"x", b"\x00" * 40]))
        section = (encoded, payload)
    return framed(command, section, draw(st.sampled_from(["right", "right", "none", "wrong"])))


# --- what a padded key or length is to protobuf----------------------------------------------

SEND_BODY = key(1, 0) + varint(3) + key(2, 0) + varint(7)
METADATA = key(1, 2) + varint(1) + b"p" + key(2, 0) + varint(1) + key(3, 0) + varint(5)


def send_frame(body: bytes = SEND_BODY, metadata: bytes = METADATA) -> bytes:
    command = key(1, 0) + varint(6) + key(6, 2) + varint(len(body)) + body
    return framed(command, (metadata, b"x"), "right")


def test_a_key_padded_past_five_bytes_is_refused_on_both_paths() -> None:
    """protobuf's parser reads a key of up to 5 bytes, however small its
    value: a key padded to 6 bytes or more is a corrupt message to it, and the
    scanner must not vouch for the frame."""
    assert COMPILED_SCAN is not None
    for size, valid in ((1, True), (5, True), (6, False), (10, False)):
        for raw in (
            send_frame(key(1, 0, size) + varint(3) + key(2, 0) + varint(7)),  # in the body
            send_frame(metadata=METADATA + key(12, 0, size) + varint(1)),  # in the metadata
            framed(
                key(1, 0, size) + varint(6) + key(6, 2) + varint(len(SEND_BODY)) + SEND_BODY,
                (METADATA, b""),
                "none",
            ),  # in BaseCommand
        ):
            reference = decode_frame(raw)
            assert (reference.error is None) is valid, (size, reference.error)
            frames = assert_equivalent([raw])
            assert isinstance(frames[0], ScannedFrame) is valid, size
            assert_summarized_alike([frame_record(1, 0, 1, raw), frame_record(1, 1, 2, raw)])


def test_a_length_padded_past_five_bytes_is_refused_on_both_paths() -> None:
    """protobuf's parser reads the length of a field (a string, bytes, a
    message) as a varint of up to 5 bytes, however small: one padded to 6
    bytes or more is a corrupt message to it, and the scanner must not
    vouch for the frame."""
    for size, valid in ((1, True), (5, True), (6, False), (10, False)):
        for raw in (
            send_frame(
                metadata=METADATA.replace(b"\x0a\x01", b"\x0a" + sized(1, size))
            ),  # a string
            framed(  # the body in BaseCommand
                key(1, 0) + varint(6) + key(6, 2) + sized(len(SEND_BODY), size) + SEND_BODY,
                (METADATA, b""),
                "none",
            ),
            framed(  # a message id in the body, the one field of an ACK wanting its summary
                key(1, 0)
                + varint(10)
                + key(10, 2)
                + varint(
                    len(
                        ACK := key(1, 0)
                        + varint(5)
                        + key(2, 0)
                        + varint(0)
                        + key(3, 2)
                        + sized(4, size)
                        + key(1, 0)
                        + varint(1)
                        + key(2, 0)
                        + varint(2)
                    )
                )
                + ACK,
                None,
                "none",
            ),
        ):
            reference = decode_frame(raw)
            assert (reference.error is None) is valid, (size, reference.error)
            frames = assert_equivalent([raw])
            assert isinstance(frames[0], ScannedFrame) is valid, size
            assert_summarized_alike([frame_record(1, 0, 1, raw), frame_record(1, 1, 2, raw)])


# --- the scanner, the summary reader and the packer on rewritten frames ---------------


@SETTINGS
@given(st.lists(hot_frames(), min_size=1, max_size=4), st.lists(st.integers(0, 2**16), max_size=4))
@example([send_frame(key(1, 0, 6) + varint(3) + key(2, 0) + varint(7))], [])
def test_rewritten_hot_frames_decode_alike_cut_anywhere(
    frames: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(frames)
    assert_equivalent(split(data, cuts))


@SETTINGS
@given(hot_frames())
def test_a_rewritten_hot_frame_decodes_alike_cut_at_every_byte(raw: bytes) -> None:
    for cut in range(1, len(raw)):
        assert_equivalent([raw[:cut], raw[cut:]])


@SETTINGS
@given(st.lists(hot_frames(), min_size=1, max_size=4))
def test_rewritten_hot_frames_are_summarized_alike(frames: list[bytes]) -> None:
    records = [{"k": "conn", "c": 1, "t": 0, "w": 0, "client": "c", "broker": "b",
                "kind": "proxied", "listener": "plain",
                "producers": {0: "persistent://t/n/x"}, "consumers": {}}]  # fmt: skip
    for n, raw in enumerate(frames):
        records += [frame_record(1, 0, n, raw), frame_record(1, 1, n, raw)]
    assert_summarized_alike(records)


@SETTINGS
@given(st.lists(hot_frames(), min_size=1, max_size=4), st.sampled_from(list(PayloadPolicy)))
def test_rewritten_hot_frames_are_recorded_alike(
    frames: list[bytes], policy: PayloadPolicy
) -> None:
    decoded = decode_stream(b"".join(frames), compiled=True)
    recorder = FrameRecorder(policy)
    prefix = recorder_prefix(1, 0, 5, 6)
    assert recorder.packed(1, 0, 5, 6, decoded) == recorder._laid_out(1, 0, 5, 6, prefix, decoded)


# --- a connection's reads: the batch path, the relay step ---------------------------


@st.composite
def connection_reads(draw: st.DrawFn) -> list[tuple[bool, bytes]]:
    """A connection's reads both ways, of rewritten hot frames of its own
    producers and consumers (SENDs, ACKs and FLOWs from the client,
    receipts and MESSAGEs from the broker), cut anywhere or between frames."""
    out: list[tuple[bool, bytes]] = []
    for from_client in draw(st.lists(st.booleans(), min_size=1, max_size=6)):
        types: list[int] = (
            [T("SEND"), T("ACK"), T("FLOW")] if from_client else [T("SEND_RECEIPT"), T("MESSAGE")]
        )
        frames = draw(st.lists(hot_frames(types, known=True), min_size=1, max_size=4))
        data = b"".join(frames)
        cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=2))
        out += [(from_client, part) for part in split(data, cuts)]
    return out


@settings(SETTINGS, max_examples=60)
@given(reads=connection_reads())
def test_rewritten_reads_are_relayed_counted_and_recorded_alike_by_batch_or_frame(
    reads: list[tuple[bool, bytes]], monkeypatch: Any
) -> None:
    by_frame, _ = run_core(reads, False, monkeypatch, SendTable)
    assert run_core(reads, True, monkeypatch)[0] == by_frame
    assert run_core(reads, True, monkeypatch, SendTable)[0] == by_frame


@settings(SETTINGS, max_examples=60)
@given(connection_reads())
def test_rewritten_reads_are_carried_by_the_step_as_the_core_relays_them(
    reads: list[tuple[bool, bytes]],
) -> None:
    by_step, _ = relay(reads, True)
    by_core, none = relay(reads, False)
    assert none == 0
    assert by_step == by_core


@settings(SETTINGS, max_examples=40)
@given(connection_reads(), st.sampled_from(list(PayloadPolicy)))
def test_rewritten_reads_carried_while_recording_are_recorded_as_the_recorder_records_them(
    reads: list[tuple[bool, bytes]], payloads: PayloadPolicy
) -> None:
    by = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quick in (True, False):
            recorder = Recorder(RecorderConfig(Path(tmp) / str(quick), payloads))
            result, _ = relay(reads, quick, recorder)
            by[quick] = (result, records(recorder), recorder.dropped_total)
    assert by[True] == by[False]


# --- the send table -------------------------------------------------------------------

Op = tuple[str, int, int]


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["send", "send", "sent", "peek"]),
            st.integers(0, 2),
            st.integers(0, 6) | st.sampled_from([2**63, 2**64 - 1]),
        ),
        max_size=60,
    )
)
def test_the_compiled_send_table_keeps_what_the_reference_keeps(ops: list[Op]) -> None:
    """Receipts in any order, for SENDs repeated, numbered up or down, and
    never sent: every answer and the whole table the same after each step."""
    compiled, reference = SEND_TABLE(), SendTable()
    assert type(compiled) is not SendTable, "sluice._frames is not built: run ./dev setup"
    for now, (op, producer, sequence) in enumerate(ops):
        topic = None if producer == 2 else f"t{producer}"
        if op == "send":
            compiled.sending(producer, sequence, float(now), topic)
            reference.sending(producer, sequence, float(now), topic)
        elif op == "sent":
            assert compiled.sent(producer, sequence) == reference.sent(producer, sequence)
        else:
            assert compiled.peek(producer, sequence) == reference.peek(producer, sequence)
        assert compiled.waiting() == reference.waiting()
        assert (compiled.in_flight, len(compiled)) == (reference.in_flight, len(reference))
