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
from sluice.protocols.pulsar import Frame, Type, command, correlation, encode, encode_payload, pb
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.correlation import SEND_TABLE, Sends, SendTable
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
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder
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


def _chunk(chunk_id: int, chunks: int = 3) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2, uuid="p-1",
                              num_chunks_from_msg=chunks, total_chunk_msg_size=3,
                              chunk_id=chunk_id)  # fmt: skip


def test_a_chunked_message_counts_once_on_its_last_chunk_on_both_paths() -> None:
    """Each chunk counted as a message in sluice_topic_messages_total (a
    3-chunk message was 3), where recordings count it once, on its last."""
    for chunk_id, counted in ((0, 0), (1, 0), (2, 1)):
        (send,) = assert_equivalent([_send(_chunk(chunk_id))])
        assert isinstance(send, ScannedFrame) and send.ids is not None
        assert send.ids[2] == counted, chunk_id
        message = encode_payload(command(T("MESSAGE"), pb.CommandMessage(
            consumer_id=4, message_id=pb.MessageIdData(ledgerId=1, entryId=chunk_id))),
            _chunk(chunk_id), b"p")  # fmt: skip
        (delivered,) = assert_equivalent([message])
        assert isinstance(delivered, ScannedFrame) and delivered.ids is not None
        assert delivered.ids[2] == counted, chunk_id
    (whole,) = assert_equivalent([_send(_chunk(0, chunks=1))])
    assert whole.ids is not None and whole.ids[2] == 1


def test_strings_are_utf8_as_protobuf_reads_them() -> None:
    """A name that is not ASCII is taken when it is UTF-8, and left to the
    reference when it is not (in the producer name and in a property's key
    and value): proto2 does not check, so the reference decodes it as it
    decodes the rest."""
    meta = pb.MessageMetadata(producer_name="pé", sequence_id=1, publish_time=2,
                              properties=[pb.KeyValue(key="ké", value="vé")])  # fmt: skip
    good = _send(meta, checksum=False)
    (frame,) = assert_equivalent([good])
    assert isinstance(frame, ScannedFrame)
    assert good.count("é".encode()) == 3
    for n in range(3):  # each string in turn: é's second byte made a lone lead byte
        at = -1
        for _ in range(n + 1):
            at = good.index("é".encode(), at + 1)
        bad = good[: at + 1] + b"\xc3" + good[at + 2 :]
        (frame,) = assert_equivalent([bad])
        assert not isinstance(frame, ScannedFrame) and frame.ok, n


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
    from sluice.recording import pulsar as fmt

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


def proxied(taps: Taps, conn_id: int = 1) -> PulsarConnection:
    conn = Conn(conn_id, "127.0.0.1:50000", "127.0.0.1:6650", "pulsar")
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


def traffic(seed: int, whole: bool = False) -> list[tuple[bool, bytes]]:
    """Reads both ways: SENDs of known and unknown producers (some with
    properties), their receipts (some for SENDs never seen), MESSAGEs, FLOW
    and ACKs (one asking for a receipt), a PING and a corrupt SEND among them.
    ``whole``: reads are cut between frames only."""
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
        ends = list(itertools.accumulate(map(len, frames)))[:-1]
        cuts = sorted(rng.sample(ends if whole else range(1, len(data)), 12))
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
    reads: list[tuple[bool, bytes]],
    batches: bool,
    monkeypatch: pytest.MonkeyPatch,
    table: type[Sends] = SEND_TABLE,
) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(correlation, "SEND_TABLE", table)
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
        state = (core.correlator.sends.waiting(), core.in_flight_sends)
        traffic_ = watcher.metrics.traffic
        metrics = [list(counts) for counts in (*traffic_.frames, *traffic_.bytes)]
        events = [repr(e) for e in watcher.events]
        return (sent, watcher.shown, events, metrics, state, watcher.records), taken


@pytest.mark.parametrize("seed", range(6))
def test_a_read_taken_as_a_batch_is_relayed_counted_and_recorded_as_frame_by_frame(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = traffic(seed)
    assert SEND_TABLE is not SendTable, "sluice._frames is not built: run ./dev setup"
    by_batch, taken = run_core(reads, True, monkeypatch)
    # The reference: frame by frame, with the Python send table.
    by_frame, _ = run_core(reads, False, monkeypatch, SendTable)
    assert taken > 3  # the batch path ran
    for a, b in zip(by_batch, by_frame, strict=True):
        assert a == b
    # Batches accounted by the Python send table come out the same too.
    by_python, _ = run_core(reads, True, monkeypatch, SendTable)
    for a, b in zip(by_python, by_frame, strict=True):
        assert a == b


# Topics as equal strings that are not the same object, as producers on one
# topic give them.
_TOPICS = ["persistent://t/n/a", "persistent://t/n/b"]


def _topic(name: str, copy: bool) -> str:
    return "".join(list(name)) if copy else name


_IDS = st.sampled_from([0, 1, 2, 2**63, 2**64 - 1])
_SCANNED = st.tuples(
    st.sampled_from([T("SEND"), T("SEND_RECEIPT"), T("MESSAGE"), T("ACK"), T("FLOW"), 0]),
    _IDS,
    _IDS,
    st.integers(-(2**31), 2**31),  # num_messages is an int32 on the wire
    st.integers(0, 2000),  # the frame's size
)
_OWNERS = st.dictionaries(
    _IDS, st.tuples(st.sampled_from(_TOPICS), st.booleans()).map(lambda t: _topic(*t)), max_size=3
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(_SCANNED, max_size=12), _OWNERS, st.integers(0, 50)),
        max_size=8,
    )
)
def test_the_compiled_send_table_accounts_reads_as_the_reference_does(
    reads: list[tuple[bool, list[tuple[int, int, int, int, int]], dict[int, str], int]],
) -> None:
    """Reads of scanned frames, both ways, with SENDs, receipts (for SENDs
    seen, repeated or never seen), MESSAGEs and ACKs: the same tallies, the
    same ACKs to look at, and the same SENDs left in flight."""
    compiled = SEND_TABLE()
    reference = SendTable()
    assert type(compiled) is not SendTable, "sluice._frames is not built: run ./dev setup"
    for from_client, frames, owners, start in reads:
        found: list[Any] = []
        stop = start
        for kind, a, b, c, size in frames:
            stop += size
            found.append((stop, kind, 0, 0, 0, a, b, c, 0))
        now = float(start)
        if from_client:
            got: Any = compiled.account_client(found, start, now, owners)
            want: Any = reference.account_client(found, start, now, owners)
        else:
            got = compiled.account_broker(found, start, now, owners)
            want = reference.account_broker(found, start, now, owners)
        assert got == want
        assert [list(d or {}) for d in got if isinstance(d, dict | None)] == [
            list(d or {}) for d in want if isinstance(d, dict | None)
        ]  # the same topics in the same order: the events come in it
        assert compiled.waiting() == reference.waiting()
        assert (compiled.in_flight, len(compiled)) == (reference.in_flight, len(reference))
        for a, b in {(f[5], f[6]) for f in found}:
            assert compiled.peek(a, b) == reference.peek(a, b)
    for a, b, *_ in reference.waiting():
        assert compiled.sent(a, b) == reference.sent(a, b)
    assert compiled.in_flight == reference.in_flight


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_is_the_scan_it_holds_and_accounts_as_its_tuples(seed: int) -> None:
    """``scan_batch`` keeps the scanner's findings in compiled code: as a
    sequence they are ``scan``'s tuples, its counts are their tallies, and
    the send tables account it as they account the tuples."""
    from sluice._frames import scan, scan_batch

    compiled, reference = SEND_TABLE(), SendTable()
    decoders = {True: FrameDecoder(LIMIT), False: FrameDecoder(LIMIT)}
    batches = 0
    for from_client, data in traffic(seed):
        decoder = decoders[from_client]
        decoder.receive_data(data)
        taken = decoder.take_batch()
        if taken is None:
            list(decoder.frames())  # frame by frame: one is left to Python, or cut
            continue
        list(decoder.frames())  # a frame cut at the read's end
        batches += 1
        batch, start = taken.found, taken.start
        found = scan(taken.data, start, LIMIT)
        assert found and all(f[1] for f in found)
        assert list(batch) == found == [batch[i] for i in range(len(batch))]
        assert batch[-1] == found[-1] and (batch.start, batch.stop) == (start, found[-1][0])
        counts: dict[int, list[int]] = {}
        before = start
        for stop, kind, *_ in found:
            tally = counts.setdefault(kind, [0, 0])
            tally[0] += 1
            tally[1] += stop - before
            before = stop
        assert batch.counts == [(k, n, size) for k, (n, size) in counts.items()]
        owners = {1: "persistent://t/n/a", 5: "persistent://t/n/b"}
        if from_client:
            assert compiled.account_client(batch, start, 1.0, owners) == (
                reference.account_client(found, start, 1.0, owners)
            )
        else:
            assert compiled.account_broker(batch, start, 1.0, owners) == (
                reference.account_broker(found, start, 1.0, owners)
            )
        assert compiled.waiting() == reference.waiting()
    assert batches > 3
    flow = encode(command(T("FLOW"), pb.CommandFlow(consumer_id=5, messagePermits=1)))
    one = scan_batch(flow, 0, LIMIT)
    assert one is not None and len(one) == 1 and one[0] == one[-1]
    for outside in (1, -2):
        with pytest.raises(IndexError):
            one[outside]
    assert scan_batch(encode(command(T("PING"))), 0, LIMIT) is None  # left to Python


def test_the_compiled_send_table_refuses_what_is_not_a_scan_result() -> None:
    table = SEND_TABLE()
    with pytest.raises((TypeError, ValueError)):
        table.account_client([(1, 2, 3)], 0, 0.0, {})  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        table.sending(-1, 0, 0.0, None)
    assert table.in_flight == 0
