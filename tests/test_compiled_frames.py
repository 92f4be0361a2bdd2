"""The compiled frame scanner (rust/, ``sluice._frames``) against the Python
decoder, the reference, on the same bytes: valid, corrupted, cut anywhere,
and arbitrary. The two must give the same frames, the same problems and the
same errors; the scanner may only take a frame the reference calls valid.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings
from msgpack import unpackb

from sluice.protocols.core import Conn, OnInvalid, Taps
from sluice.protocols.pulsar import Frame, Type, command, encode, encode_payload, pb
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.decoder import (
    COMPILED_PACK,
    COMPILED_SCAN,
    FrameDecoder,
    decode_stream,
)
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.protocols.pulsar.frame import HOT_TYPES, ScannedFrame
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.metrics import Metrics
from sluice.recording.format import FrameRecorder, PayloadPolicy
from tests.helpers.strategies import commands, frame_bytes, payload_frames

T = Type.Value
GOLDEN = Path(__file__).parent / "golden" / "data"
LIMIT = 5 * 1024 * 1024


def test_the_compiled_scanner_is_built() -> None:
    # ./dev builds it into the package; a missing build must fail, not fall back quietly.
    assert COMPILED_SCAN is not None, "sluice._frames is not built: run ./dev setup"
    assert FrameDecoder()._scan is COMPILED_SCAN


def decode(chunks: list[bytes], compiled: bool, limit: int = LIMIT) -> tuple[list[Frame], Any]:
    """Frames and how the stream ended (a sentinel, or the fatal error's problem and text)."""
    decoder = FrameDecoder(limit, compiled=compiled)
    frames: list[Frame] = []
    end: Any = None
    try:
        for chunk in filter(None, chunks):  # b"" would mean the end of the stream
            decoder.receive_data(chunk)
            frames += decoder.frames()
        decoder.receive_data(b"")
        frames += decoder.frames()
        end = repr(decoder.next_event())
    except RemoteProtocolError as exc:
        end = (exc.problem, str(exc), exc.fatal)
    return frames, end


def error_of(frame: Frame) -> Any:
    e = frame.error
    return None if e is None else (e.problem, str(e), e.server_error)


def assert_same(compiled: Frame, reference: Frame) -> None:
    assert compiled.raw == reference.raw
    assert compiled.type == reference.type
    assert error_of(compiled) == error_of(reference)
    assert compiled.metadata_offset == reference.metadata_offset
    assert compiled.payload_offset == reference.payload_offset
    assert compiled.checksum == reference.checksum
    assert compiled.ids == reference.ids
    assert compiled.command == reference.command
    assert compiled.body == reference.body
    assert compiled.metadata == reference.metadata
    assert compiled.broker_entry_metadata == reference.broker_entry_metadata
    if isinstance(compiled, ScannedFrame):
        assert reference.error is None and reference.type in HOT_TYPES
        assert reference.metadata is None or compiled.properties == len(
            reference.metadata.properties
        )


def assert_equivalent(chunks: list[bytes], limit: int = LIMIT) -> list[Frame]:
    fast, fast_end = decode(chunks, True, limit)
    ref, ref_end = decode(chunks, False, limit)
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        assert_same(a, b)
    assert fast_end == ref_end
    return fast


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a] or [data]


def golden_streams() -> list[bytes]:
    streams = [path.read_bytes() for path in sorted(GOLDEN.glob("*/*.bin"))]
    assert streams
    return streams


def test_real_streams_decode_alike_and_nearly_all_frames_take_the_compiled_path() -> None:
    scanned = total = 0
    for data in golden_streams():
        frames = assert_equivalent([data])
        total += len(frames)
        scanned += sum(isinstance(f, ScannedFrame) for f in frames)
        # Every valid hot frame of the real client and broker is the scanner's.
        for frame in frames:
            if frame.ok and frame.type in HOT_TYPES and frame.broker_entry_metadata is None:
                assert isinstance(frame, ScannedFrame), frame
    assert scanned > total // 2, (scanned, total)


def payload_samples() -> list[bytes]:
    """A few real frames from the first SEND (client side) or MESSAGE (broker side) on."""
    out = []
    for data in golden_streams():
        frames = decode_stream(data, compiled=False)
        starts = [i for i, f in enumerate(frames) if f.type in (T("SEND"), T("MESSAGE"))]
        if starts:
            out.append(b"".join(f.raw for f in frames[starts[0] : starts[0] + 3]))
    assert len(out) >= 4
    return out


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_every_cut_and_every_changed_byte_of_real_frames_decodes_alike(index: int) -> None:
    sample = payload_samples()[index][:1500]
    assert isinstance(assert_equivalent([sample])[0], ScannedFrame)
    for cut in range(1, len(sample)):
        assert_equivalent([sample[:cut], sample[cut:]])
        assert_equivalent([sample[:cut]])
    for i in range(len(sample)):
        for value in (0x00, 0x01, 0x7F, 0x80, 0xFF):
            changed = bytearray(sample)
            changed[i] = value
            assert_equivalent([bytes(changed)])


HOT_COMMANDS: list[int] = [T("SEND_RECEIPT"), T("ACK"), T("FLOW")]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(frame_bytes(), min_size=1, max_size=6), st.lists(st.integers(0, 10**6)))
def test_valid_streams_split_anywhere_decode_alike(frames: list[bytes], cuts: list[int]) -> None:
    assert_equivalent(split(b"".join(frames), cuts))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(commands(HOT_COMMANDS), payload_frames()), st.data())
def test_mutated_hot_frames_decode_alike(frame: Any, data: st.DataObject) -> None:
    raw = encode(frame) if isinstance(frame, pb.BaseCommand) else frame.raw
    changed = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(changed) - 1))
        changed[i] = data.draw(st.integers(0, 255))
    assert_equivalent([bytes(changed)])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(max_size=200), max_size=5), st.sampled_from([64, 1024, LIMIT]))
@example([b"\x00\x00\x00\x04\x00\x00\x00\x00"], LIMIT)
def test_arbitrary_bytes_decode_alike(chunks: list[bytes], limit: int) -> None:
    assert_equivalent(chunks, limit)


def _send(metadata: pb.MessageMetadata, checksum: bool = True, **body: Any) -> bytes:
    fields = {"producer_id": 1, "sequence_id": 2, **body}
    return encode_payload(
        command(T("SEND"), pb.CommandSend(**fields)), metadata, b"p", checksum=checksum
    )


META = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
FULL_META = pb.MessageMetadata(
    producer_name="p",
    sequence_id=1,
    publish_time=2,
    num_messages_in_batch=7,
    properties=[pb.KeyValue(key="a", value="b")],
    encryption_keys=[pb.EncryptionKeys(key="k", value=b"v")],
    compacted_batch_indexes=[1, 2],
)
ACK = pb.CommandAck(
    consumer_id=1,
    ack_type=pb.CommandAck.Cumulative,
    message_id=[pb.MessageIdData(ledgerId=1, entryId=2, ack_set=[1, -1])],
    request_id=3,
)


@pytest.mark.parametrize(
    "raw",
    [
        _send(META),
        _send(META, checksum=False),
        _send(META, num_messages=-3),
        _send(META, num_messages=2**31 - 1, highest_sequence_id=9, is_chunk=True),
        _send(META, message_id=pb.MessageIdData(ledgerId=1, entryId=2)),
        _send(FULL_META),
        encode(command(T("FLOW"), pb.CommandFlow(consumer_id=2**64 - 1, messagePermits=2**32 - 1))),
        encode(command(T("ACK"), ACK)),
        encode(command(T("SEND_RECEIPT"), pb.CommandSendReceipt(producer_id=1, sequence_id=2))),
    ],
)
def test_edge_values_are_read_as_protobuf_reads_them(raw: bytes) -> None:
    (frame,) = assert_equivalent([raw])
    assert isinstance(frame, ScannedFrame)


def test_what_the_scanner_leaves_alone_is_still_decoded_by_the_reference() -> None:
    bem = pb.BrokerEntryMetadata(broker_timestamp=1, index=2)
    with_bem = encode_payload(
        command(T("MESSAGE"), pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(
            ledgerId=1, entryId=2))), META, b"p", broker_entry_metadata=bem)  # fmt: skip
    ping = encode(command(T("PING")))
    frames = assert_equivalent([with_bem + ping])
    assert [type(f) for f in frames] == [Frame, Frame]
    assert all(f.ok for f in frames)


def test_decode_stream_takes_the_same_switch() -> None:
    data = golden_streams()[0]
    a = decode_stream(data, compiled=True)
    b = decode_stream(data, compiled=False)
    assert any(isinstance(f, ScannedFrame) for f in a)
    assert not any(isinstance(f, ScannedFrame) for f in b)


@pytest.mark.parametrize("policy", list(PayloadPolicy))
def test_the_compiled_packer_lays_out_records_as_the_python_recorder_does(
    policy: PayloadPolicy,
) -> None:
    recorder = FrameRecorder(policy)
    assert recorder._compiled is COMPILED_PACK is not None
    taken = 0
    for data in golden_streams():
        frames = decode_stream(data, compiled=True)
        for direction in (0, 1):
            for times in ((0, 0), (2**64 - 1, 1), (255, 2**63)):
                compiled = recorder.packed(7, direction, *times, frames)
                prefix = recorder_prefix(7, direction, *times)
                reference = recorder._laid_out(7, direction, *times, prefix, frames)
                assert compiled == reference
                # And each reads back as the record the slow way makes.
                for frame, packed in zip(frames, compiled, strict=True):
                    assert unpackb(packed) == recorder.record(7, direction, *times, frame)
        taken += sum(isinstance(f, ScannedFrame) and f.properties == 0 for f in frames)
    assert taken > 100


def recorder_prefix(conn: int, direction: int, mono_ns: int, wall_ns: int) -> bytes:
    from sluice.recording import format as fmt

    return fmt._PREFIX.pack(fmt._MAP_7, fmt._K, conn, fmt._D, direction, fmt._T, mono_ns,
                            fmt._W, wall_ns)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(frame_bytes(), min_size=1, max_size=6), st.sampled_from(list(PayloadPolicy)))
def test_the_compiled_packer_agrees_on_any_valid_frames(
    frames: list[bytes], policy: PayloadPolicy
) -> None:
    decoded = decode_stream(b"".join(frames), compiled=True)
    recorder = FrameRecorder(policy)
    prefix = recorder_prefix(1, 0, 5, 6)
    assert recorder.packed(1, 0, 5, 6, decoded) == recorder._laid_out(1, 0, 5, 6, prefix, decoded)


# --- the batch path: a read the scanner took whole, accounted at once ------------------

BROKER_URL = "pulsar://127.0.0.1:6650"
TOPIC_A = "persistent://public/default/a"
TOPIC_B = "persistent://public/default/b"


class Watcher:
    """A tap that keeps what it was shown, frame by frame, and a Metrics tap
    and a recorder's records beside it."""

    def __init__(self) -> None:
        self.shown: list[tuple[bool, bytes, int | None]] = []
        self.events: list[Any] = []
        self.metrics = Metrics()
        self.recorders = {p: FrameRecorder(p) for p in PayloadPolicy}
        self.records: dict[PayloadPolicy, list[bytes]] = {p: [] for p in PayloadPolicy}

    def frames_tap(self) -> Taps:
        return Taps([self, self.metrics])

    def frames(self, conn: Conn, from_client: bool, frames: Any) -> None:
        for policy, recorder in self.recorders.items():
            self.records[policy] += recorder.packed(conn.id, int(not from_client), 1, 2, frames)
        for frame in frames:
            self.shown.append((from_client, frame.raw, frame.type))

    def event(self, conn: Conn | None, event: Any) -> None:
        self.events.append(event)


def proxied(taps: Taps) -> PulsarConnection:
    conn = Conn(1, "127.0.0.1:50000", "127.0.0.1:6650", "pulsar")
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5)
    core = PulsarConnection(conn, settings, Routing(parse_broker_url(BROKER_URL)), taps)
    hello = pb.CommandConnect(client_version="t", protocol_version=20,
                              proxy_to_broker_url="127.0.0.1:6650")  # fmt: skip
    core.receive_client(encode(command(T("CONNECT"), hello)), 0.0)
    connected = pb.CommandConnected(server_version="t", protocol_version=20)
    core.receive_broker(encode(command(T("CONNECTED"), connected)), 0.0)
    asks = b"".join(
        encode(command(T("PRODUCER"), pb.CommandProducer(topic=t, producer_id=i, request_id=i)))
        for i, t in ((1, TOPIC_A), (2, TOPIC_B))
    ) + encode(command(T("SUBSCRIBE"), pb.CommandSubscribe(
        topic=TOPIC_A, subscription="s", consumer_id=5, request_id=3,
        subType=pb.CommandSubscribe.Shared)))  # fmt: skip
    core.receive_client(asks, 0.0)
    answers = b"".join(
        encode(command(T("PRODUCER_SUCCESS"),
                       pb.CommandProducerSuccess(request_id=i, producer_name=f"p{i}")))
        for i in (1, 2)
    ) + encode(command(T("SUCCESS"), pb.CommandSuccess(request_id=3)))  # fmt: skip
    core.receive_broker(answers, 0.0)
    assert core.established and len(core.correlator.producers) == 2
    return core


def traffic(seed: int) -> list[tuple[bool, bytes]]:
    """Reads both ways: SENDs of known and unknown producers (some with
    properties), their receipts (some for SENDs never seen), MESSAGEs, FLOW
    and ACKs (one asking for a receipt), a PING and a corrupt SEND among them."""
    rng = random.Random(seed)
    client: list[bytes] = []
    broker: list[bytes] = []
    for seq in range(60):
        producer = rng.choice([1, 1, 2, 9])
        meta = pb.MessageMetadata(producer_name=f"p{producer}", sequence_id=seq, publish_time=seq)
        if rng.random() < 0.2:
            meta.properties.add(key=rng.choice(["k", "auth-token"]), value="v")
        body = pb.CommandSend(producer_id=producer, sequence_id=seq,
                              num_messages=rng.choice([1, 3]))  # fmt: skip
        client.append(
            encode_payload(command(T("SEND"), body), meta, rng.randbytes(rng.randint(0, 300)))
        )
        if rng.random() < 0.9:
            receipt = pb.CommandSendReceipt(
                producer_id=producer, sequence_id=seq + rng.choice([0, 0, 0, 100])
            )
            broker.append(encode(command(T("SEND_RECEIPT"), receipt)))
        mid = pb.MessageIdData(ledgerId=1, entryId=seq)
        message = pb.CommandMessage(consumer_id=rng.choice([5, 5, 6]), message_id=mid)
        meta.num_messages_in_batch = rng.choice([1, 4])
        broker.append(
            encode_payload(command(T("MESSAGE"), message), meta, b"m" * rng.randint(0, 50))
        )
        if seq % 17 == 0:
            client.append(
                encode(command(T("FLOW"), pb.CommandFlow(consumer_id=5, messagePermits=100)))
            )
            ack = pb.CommandAck(consumer_id=5, ack_type=pb.CommandAck.Individual,
                                message_id=[mid], request_id=50 + seq)  # fmt: skip
            client.append(encode(command(T("ACK"), ack)))
    client.insert(rng.randrange(len(client)), encode(command(T("PING"))))
    bad = bytearray(client[rng.randrange(len(client))])
    bad[-1] ^= 0xFF
    client.insert(rng.randrange(len(client)), bytes(bad))
    sides: list[list[tuple[bool, bytes]]] = []
    for from_client, frames in ((True, client), (False, broker)):
        data = b"".join(frames)
        cuts = sorted(rng.sample(range(1, len(data)), 12))
        sides.append(
            [(from_client, data[a:b]) for a, b in itertools.pairwise([0, *cuts, len(data)])]
        )
    # Each side in its order, the two interleaved at random.
    reads: list[tuple[bool, bytes]] = []
    while any(sides):
        side = rng.choice([s for s in sides if s])
        reads.append(side.pop(0))
    return reads


def run_core(
    reads: list[tuple[bool, bytes]], batches: bool, monkeypatch: pytest.MonkeyPatch
) -> Any:
    with monkeypatch.context() as patch:
        if not batches:
            patch.setattr(FrameDecoder, "take_batch", lambda self: None)
        watcher = Watcher()
        core = proxied(watcher.frames_tap())
        taken = 0
        sent: list[Any] = []
        for from_client, data in reads:
            if batches:
                decoder = core._client if from_client else core._broker
                before = decoder.take_batch
                seen: list[Any] = []

                def counting(before: Any = before, seen: list[Any] = seen) -> Any:
                    batch = before()
                    seen.append(batch)
                    return batch

                decoder.take_batch = counting  # type: ignore[method-assign]
            receive = core.receive_client if from_client else core.receive_broker
            sent += [(type(a).__name__, getattr(a, "data", None)) for a in receive(data, 1.5)]
            if batches:
                taken += sum(b is not None for b in seen)
        sends = core.correlator.sends
        state = (sorted((k, p.topic, p.repeats) for k, p in sends.items()), core.in_flight_sends)
        traffic_ = watcher.metrics.traffic
        metrics = [list(counts) for counts in (*traffic_.frames, *traffic_.bytes)]
        events = [repr(e) for e in watcher.events]
        return (sent, watcher.shown, events, metrics, state, watcher.records), taken


@pytest.mark.parametrize("seed", range(6))
def test_a_read_taken_as_a_batch_is_relayed_counted_and_recorded_as_frame_by_frame(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = traffic(seed)
    by_batch, taken = run_core(reads, True, monkeypatch)
    by_frame, _ = run_core(reads, False, monkeypatch)
    assert taken > 3  # the batch path ran
    for a, b in zip(by_batch, by_frame, strict=True):
        assert a == b
