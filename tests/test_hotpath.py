"""The hot path's shortcuts give what the plain code gives: frame records and
their summaries, latency histograms, command names, frame bodies, and a
recorder that hands its file few large writes."""

from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf.message import Message
from msgpack import unpackb
from prometheus_client import CollectorRegistry, Histogram

from sluice.protocols.core import Conn, Opened
from sluice.protocols.pulsar import (
    Frame,
    Type,
    command,
    decode_frame,
    decode_stream,
    encode,
    encode_payload,
    own_frame,
    pb,
)
from sluice.protocols.pulsar.correlation import Correlator
from sluice.protocols.pulsar.frame import BODY_FIELD, command_name
from sluice.protocols.pulsar.redact import redacted, sensitive
from sluice.proxy.metrics import Histograms, Metrics
from sluice.recording.format import (
    PayloadPolicy,
    RecordingError,
    header,
    pack,
    read_records,
    read_records_from,
    recording_files,
)
from sluice.recording.pulsar import FrameRecorder
from sluice.recording.writer import WRITE_BYTES, Recorder, RecorderConfig

T = Type.Value
GOLDEN = Path(__file__).parent / "golden" / "data"


def plain_record(
    correlator: Correlator, policy: PayloadPolicy, conn: int, direction: int, t: int, frame: Frame
) -> dict[str, Any]:
    """A frame record the straightforward way: each body's descriptor asked
    for its fields, every frame shown to the correlator."""
    out: dict[str, Any] = {"cmd": frame.name}
    body: Any = frame.body
    if body is not None:
        fields = body.DESCRIPTOR.fields_by_name
        for name, short in (("request_id", "rid"), ("producer_id", "pid"),
                            ("sequence_id", "seq"), ("consumer_id", "cid")):  # fmt: skip
            if name in fields and body.HasField(name):
                out[short] = getattr(body, name)
        topic = body.topic if "topic" in fields and body.HasField("topic") else None
        if topic is None and "pid" in out:
            topic = correlator.topic_of_producer(out["pid"])
        elif topic is None and "cid" in out:
            topic = correlator.topic_of_consumer(out["cid"])
        if topic:
            out["topic"] = topic
        if "message_id" in fields and frame.type != T("ACK") and body.HasField("message_id"):
            mid = body.message_id
            out["mid"] = [mid.ledgerId, mid.entryId, mid.partition, mid.batch_index]
        if "error" in fields and body.HasField("error"):
            out["error"] = pb.ServerError.Name(body.error)
    meta = frame.metadata
    if meta is not None:
        out["msgs"] = meta.num_messages_in_batch
        if meta.num_chunks_from_msg > 1:
            last = meta.chunk_id == meta.num_chunks_from_msg - 1
            out["chunk"] = [meta.uuid, meta.chunk_id, meta.num_chunks_from_msg,
                            meta.total_chunk_msg_size]  # fmt: skip
            out["msgs"] = 1 if last else 0
    if frame.error is not None:
        out["invalid"] = frame.error.problem.value
        out["why"] = frame.error.message
    done = correlator.observe(frame, direction == 0, t / 1e9)
    if done is not None and done.topic and "topic" not in out:
        out["topic"] = done.topic
    raw = redacted(frame) if sensitive(frame) else frame.raw
    if raw is not frame.raw:
        out["redacted"] = True
    payload_frame = frame.type in (T("SEND"), T("MESSAGE")) and frame.payload_offset >= 0
    if payload_frame and policy is not PayloadPolicy.FULL:
        payload = bytes(frame.payload)
        info: dict[str, Any] = {"size": len(payload)}
        if policy is PayloadPolicy.HASH:
            info["sha256"] = hashlib.sha256(payload).hexdigest()
        out["payload"] = info
        raw = raw[: len(raw) - len(payload)]  # redacting may have moved the payload
    return {"k": "frame", "c": conn, "d": direction, "t": t, "w": t, "n": len(frame.raw),
            "raw": raw, "s": out}  # fmt: skip


def odd_frames() -> list[tuple[int, Frame]]:
    """Frames the golden streams lack: credentials, bad checksums, unknown
    types, errors, answers to requests and sends, a closed producer."""
    send = encode_payload(
        command(T("SEND"), pb.CommandSend(producer_id=0, sequence_id=9)),
        pb.MessageMetadata(
            producer_name="p",
            sequence_id=9,
            publish_time=1,
            properties=[pb.KeyValue(key="token", value="t")],
        ),
        b"hello",
    )
    broken = bytearray(send)
    broken[-1] ^= 1
    out: list[tuple[int, bytes | Message]] = [
        (0, pb.CommandConnect(client_version="c", auth_data=b"s", protocol_version=20)),
        (0, send),
        (0, bytes(broken)),
        (0, b"\x00\x00\x00\x06\x00\x00\x00\x02\x08\x63"),  # type 99
        (0, pb.CommandProducer(topic="persistent://t/n/x", producer_id=5, request_id=1)),
        (1, pb.CommandProducerSuccess(request_id=1, producer_name="p")),
        (1, pb.CommandError(request_id=5, error=pb.ServiceNotReady, message="m")),
        (
            1,
            pb.CommandSendError(
                producer_id=5, sequence_id=9, error=pb.PersistenceError, message="m"
            ),
        ),
        (
            0,
            pb.CommandAck(
                consumer_id=0,
                ack_type=pb.CommandAck.Individual,
                request_id=7,
                message_id=[pb.MessageIdData(ledgerId=1, entryId=2)],
            ),
        ),
        (1, pb.CommandAckResponse(consumer_id=0, request_id=7)),
        (0, pb.CommandCloseProducer(producer_id=5, request_id=8)),
        (1, pb.CommandSuccess(request_id=8)),
        (1, pb.CommandSendReceipt(producer_id=5, sequence_id=9)),
    ]
    frames: list[tuple[int, Frame]] = []
    for direction, item in out:
        if isinstance(item, bytes):
            frames.append((direction, decode_frame(item)))
        else:
            type_ = next(t for t, f in BODY_FIELD.items()
                         if type(getattr(pb.BaseCommand(), f)) is type(item))  # fmt: skip
            frames.append((direction, decode_frame(encode(command(type_, item)))))
    return frames


def golden_frames() -> list[tuple[int, list[tuple[int, Frame]]]]:
    """(connection, frames) of every captured scenario, both sides interleaved."""
    conns = []
    for number, client in enumerate(sorted(GOLDEN.glob("*/*-client.bin"))):
        broker = client.with_name(client.name.replace("client", "broker"))
        pairs = itertools.zip_longest(decode_stream(client.read_bytes()),
                                      decode_stream(broker.read_bytes()))  # fmt: skip
        frames = [(d, f) for a, b in pairs for d, f in ((0, a), (1, b)) if f is not None]
        conns.append((number, frames + odd_frames()))
    return conns


@pytest.mark.parametrize("policy", list(PayloadPolicy))
def test_frame_records_read_back_as_a_plain_reading_gives(policy: PayloadPolicy) -> None:
    """The recorder writes lean records on the hot path; a reader works the
    summary out from them. Together they give what the plain reading of
    every frame gives, bytes, redaction, payload digests and topics included."""
    recorder = FrameRecorder(policy)
    written: list[bytes] = [pack(header(capture="c", segment=1, started_ns=0, payloads=policy,
                                        sluice_version="test"))]  # fmt: skip
    expected: list[dict[str, Any]] = []
    for conn, frames in golden_frames():
        correlator = Correlator()
        for t, (direction, frame) in enumerate(frames):
            record = recorder.record(conn, direction, t, t, frame)
            if "s" in record:  # bytes withheld: what parsed is all a reader will have
                assert record["raw"] == b"" and record["s"]["withheld"], record
                continue
            # Otherwise no summary on the hot path.
            # What the recorder queues: the same record (keys in the same
            # order), whether laid out by hand or packed by msgpack.
            (packed,) = recorder.packed(conn, direction, t, t, [frame])
            assert list(unpackb(packed).items()) == list(record.items())
            written.append(packed)
            expected.append(plain_record(correlator, policy, conn, direction, t, frame))
    read = list(read_records_from(b"".join(written), "test.sluice"))[1:]
    assert len(read) == len(expected) > 300
    for got, want in zip(read, expected, strict=True):
        assert got == want, want["s"]
        # Same keys in the same order as a version-1 record: the same bytes
        # when a tool writes records it has read.
        assert pack(got) == pack(want)


@pytest.mark.parametrize("policy", list(PayloadPolicy))
def test_packed_records_are_msgpack_of_the_record_at_every_width(policy: PayloadPolicy) -> None:
    """``packed`` lays frame records out by hand, with a short and a long
    form of ``n`` and of ``raw``'s length: each side of each boundary reads
    back as the record itself, and so do the ids, directions and clock
    values it hands to msgpack instead."""
    recorder = FrameRecorder(policy)
    sizes: set[int] = set()  # of n and of raw's length
    layouts: set[int] = set()  # the map's first byte: 7 or 8 keys

    def check(frame: Frame, conn: int, direction: int, mono: int, wall: int) -> None:
        assert frame.error is None
        record = recorder.record(conn, direction, mono, wall, frame)
        (packed,) = recorder.packed(conn, direction, mono, wall, [frame])
        assert list(unpackb(packed).items()) == list(record.items())
        sizes.update((len(frame.raw), len(record["raw"])))
        layouts.add(packed[0])

    def send(name_size: int, size: int, fill: bytes = b"x") -> Frame:
        meta = pb.MessageMetadata(producer_name="p" * name_size, sequence_id=1,
                                  publish_time=1_795_267_584_681)  # fmt: skip
        body = pb.CommandSend(producer_id=7, sequence_id=1)
        return decode_frame(encode_payload(command(T("SEND"), body), meta, fill * size))

    wall = 1_795_267_584_681_000_000
    # The whole frame's size (n) across 255/256, then the recorded part's.
    for size in range(150, 260):
        check(send(1, size), 1, 0, 10**13, wall)
    for name_size in range(150, 260):
        check(send(name_size, 1024), 2**32 - 1, 0, 2**64 - 1, wall)
    check(send(1, 70_000), 0, 0, 0, 0)  # hashed from a view, not a copy
    message_id = pb.MessageIdData(ledgerId=2**63, entryId=1)
    answer = pb.CommandSendReceipt(producer_id=7, sequence_id=1, message_id=message_id)
    receipt = decode_frame(encode(command(T("SEND_RECEIPT"), answer)))
    check(receipt, 5, 1, 10**13, wall)
    # What the fixed-width layout cannot hold takes msgpack's own way.
    for conn, direction, mono, when in ((2**32, 0, 1, wall), (7, 2, 1, wall), (7, 200, 1, wall),
                                        (7, 0, -1, -wall), (-1, 1, 2**63, wall)):  # fmt: skip
        check(receipt, conn, direction, mono, when)
        check(send(1, 10), conn, direction, mono, when)
    # One read's frames at once, as the recorder hands them over: each as it
    # is alone, with those that take msgpack's way (credentials, an invalid
    # frame) among them.
    hello = pb.CommandConnect(client_version="c", protocol_version=21, auth_data=b"secret")
    connect = decode_frame(encode(command(T("CONNECT"), hello)))
    broken = bytearray(send(1, 300).raw)
    broken[-1] ^= 1
    bad = decode_frame(bytes(broken))
    assert sensitive(connect) and bad.error is not None
    # Runs of one size (each payload its own), and a frame of the same size
    # whose payload starts a byte later.
    same = [send(1, 100, fill) for fill in (b"a", b"b", b"c")]
    later = send(2, 99)
    assert len(later.raw) == len(same[0].raw)
    assert later.payload_offset == same[0].payload_offset + 1
    read = [*same, later, same[0], connect, receipt, receipt, bad, send(1, 2000), send(300, 10)]
    packed = recorder.packed(3, 1, 10**13, wall, read)
    want = [recorder.record(3, 1, 10**13, wall, frame) for frame in read]
    assert [list(unpackb(p).items()) for p in packed] == [list(r.items()) for r in want]
    assert {255, 256} <= sizes
    assert layouts == ({0x87} if policy is PayloadPolicy.FULL else {0x87, 0x88})
    if policy is not PayloadPolicy.FULL:  # the recorded part itself crossed 255/256
        cut = {len(recorder.record(1, 0, 0, 0, send(n, 1024))["raw"]) for n in range(150, 260)}
        assert {255, 256} <= cut


def test_a_later_segment_names_the_topics_of_producers_made_before_it(tmp_path: Path) -> None:
    """A connection's producers are re-stated with it at a new segment, so a
    reader of that segment alone (a Spark task) still names their topics."""
    producer = decode_frame(
        encode(command(T("PRODUCER"), pb.CommandProducer(topic="persistent://t/n/a",
                                                         producer_id=3, request_id=1)))
    )  # fmt: skip
    success = decode_frame(
        encode(command(T("PRODUCER_SUCCESS"),
                       pb.CommandProducerSuccess(request_id=1, producer_name="p")))
    )  # fmt: skip
    receipt = decode_frame(
        encode(command(T("SEND_RECEIPT"), pb.CommandSendReceipt(producer_id=3, sequence_id=0)))
    )

    async def main() -> None:
        config = RecorderConfig(tmp_path, max_file_bytes=1, flush_interval=0.01)
        recorder = Recorder(config)
        conn = Conn(1, "127.0.0.1:1", "plain", "pulsar", kind="proxied")
        correlator = Correlator()
        conn.state = correlator
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            recorder.event(conn, Opened())
            for direction, frame in ((0, producer), (1, success)):
                correlator.observe(frame, direction == 0, 0.0)
                recorder.frames(conn, direction == 0, [frame])
            # One segment, then a new one for each write: the first frames
            # written before the receipt is queued (a fixed 0.1 s was not
            # always enough on a busy host: one write, one segment).
            with trio.fail_after(10):
                while recorder.frames_written < 2:
                    await trio.sleep(0.005)
                recorder.frames(conn, False, [receipt])
                while recorder.frames_written < 3:
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()

    trio.run(main)
    files = recording_files(tmp_path)
    assert len(files) >= 2
    last = [r for r in read_records(files[-1]) if r["k"] == "frame"]
    assert [r["s"]["cmd"] for r in last] == ["SEND_RECEIPT"]
    assert last[0]["s"]["topic"] == "persistent://t/n/a"
    conns = [r for r in read_records(files[-1]) if r["k"] == "conn"]
    assert conns and "producers" not in conns[0]  # taken in by the reader


async def test_segments_a_closing_connections_last_records_fall_in_re_state_it(
    tmp_path: Path,
) -> None:
    """A connection's last frames and its close, written in one batch that
    the file cap cuts into segments: each segment re-states the connection
    (with its producers: its SENDs name their topic), although it had
    closed by the time they were written. (Re-stated from the connections
    still open then, it was in none: its frames there had no connection.)"""
    topic = "persistent://t/n/a"
    opening = pb.CommandProducer(topic=topic, producer_id=3, request_id=1)
    producer = decode_frame(encode(command(T("PRODUCER"), opening)))
    ok = pb.CommandProducerSuccess(request_id=1, producer_name="p")
    success = decode_frame(encode(command(T("PRODUCER_SUCCESS"), ok)))

    def send(sequence: int) -> Frame:
        body = pb.CommandSend(producer_id=3, sequence_id=sequence, num_messages=1)
        meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence, publish_time=1)
        return decode_frame(encode_payload(command(T("SEND"), body), meta, b"x" * 200))

    recorder = Recorder(RecorderConfig(tmp_path, PayloadPolicy.FULL, max_file_bytes=1500))
    conn = Conn(1, "127.0.0.1:1", "plain", "pulsar", kind="proxied")
    correlator = Correlator()
    conn.state = correlator
    recorder.event(conn, Opened())
    read = [(True, producer), (False, success), *((True, send(i)) for i in range(12))]
    for from_client, frame in read:
        correlator.observe(frame, from_client, 0.0)
        recorder.frames(conn, from_client, [frame])
    recorder.close_connection(1, "bye")
    recorder._take_queued()  # one batch, as the writer takes it
    await recorder._write_packed()
    await recorder._close_file()
    files = recording_files(tmp_path)
    assert len(files) >= 3
    sends = 0
    for path in files:
        records = [r for r in read_records(path) if r["k"] != "header"]
        assert records[0]["k"] == "conn" and records[0]["c"] == 1, (path.name, records[0])
        for r in records:
            if r["k"] == "frame" and r["s"]["cmd"] == "SEND":
                assert r["s"]["topic"] == topic, path.name
                sends += 1
    assert sends == 12
    assert [r["k"] for r in read_records(files[-1])][-1] == "close"


def test_version_1_records_keep_their_summary() -> None:
    """A version-1 file's frames carry their summary; it is read as written."""
    v1 = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.HASH,
                sluice_version="old") | {"version": 1}  # fmt: skip
    frame = {"k": "frame", "c": 1, "d": 0, "t": 1, "w": 1, "n": 12, "raw": b"not a frame",
             "s": {"cmd": "SEND", "topic": "written"}}  # fmt: skip
    read = list(read_records_from(pack(v1) + pack(frame), "old.sluice"))
    assert read[1]["s"] == {"cmd": "SEND", "topic": "written"}


def test_a_frame_record_without_summary_or_bytes_is_a_damaged_file() -> None:
    first = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.HASH,
                   sluice_version="x")  # fmt: skip
    broken = {"k": "frame", "c": 1, "d": 0, "t": 1, "w": 1, "n": 12}
    with pytest.raises(RecordingError, match="damaged after 1 records"):
        list(read_records_from(pack(first) + pack(broken), "bad.sluice"))


def test_topic_traffic_is_exported_per_label_with_the_rest_as_other() -> None:
    metrics = Metrics(topic_limit=2)
    reads = [("a", 1, 100), ("b", 2, 50), ("c", 4, 10), ("a", 3, 7), ("d", 8, 1), ("c", 1, 1)]
    for topic, messages, size in reads:
        metrics.topic_traffic(topic, "client_to_broker", messages, size)
    metrics.topic_traffic("a", "broker_to_client", 5, 5)
    got = {
        (s.name, s.labels["topic"], s.labels["direction"]): s.value
        for family in metrics.exposed.collect()
        for s in family.samples
        if s.name.startswith("sluice_topic_")
    }
    c2b, b2c = "client_to_broker", "broker_to_client"
    assert got == {
        ("sluice_topic_messages_total", "a", c2b): 4,
        ("sluice_topic_bytes_total", "a", c2b): 107,
        ("sluice_topic_messages_total", "b", c2b): 2,
        ("sluice_topic_bytes_total", "b", c2b): 50,
        ("sluice_topic_messages_total", "other", c2b): 13,
        ("sluice_topic_bytes_total", "other", c2b): 12,
        ("sluice_topic_messages_total", "a", b2c): 5,
        ("sluice_topic_bytes_total", "a", b2c): 5,
    }


def test_latency_histograms_export_what_prometheus_client_would() -> None:
    buckets = (0.001, 0.01, 0.1, 1.0)
    ours = CollectorRegistry()
    histograms = Histograms("x_seconds", "help", "command", ("A", "B"), buckets)
    ours.register(histograms)
    theirs = CollectorRegistry()
    reference = Histogram("x_seconds", "help", ["command"], buckets=buckets, registry=theirs)
    reference.labels("A")
    reference.labels("B")
    rng = random.Random(7)
    values = [*buckets, 0.0, 5.0, *(rng.expovariate(30) for _ in range(500))]
    for value in values:
        label = rng.choice("AB")
        histograms.children[label].observe(value)
        reference.labels(label).observe(value)
    # A read's worth at once (send receipts), few or many, bounds and all:
    # the same as one at a time.
    few = [0.01, rng.expovariate(30)]
    many = [*buckets, 0.0, 5.0, *buckets, *(rng.expovariate(30) for _ in range(100))]
    for label, values in (("A", few), ("B", many)):
        histograms.children[label].observe_all(values)
        for value in values:
            reference.labels(label).observe(value)

    def samples(registry: CollectorRegistry) -> list[tuple[str, tuple[Any, ...], float]]:
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), round(s.value, 9))
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        )

    assert samples(ours) == samples(theirs)
    assert histograms.children["A"].counts[0] > 0  # the first bucket took its bound itself


def test_command_names_come_from_the_schema() -> None:
    for number in [*range(-1, 120), 2**31 - 1]:
        try:
            expected = Type.Name(number)
        except ValueError:
            expected = f"UNKNOWN({number})"
        assert command_name(number) == expected


def test_a_frame_carries_its_commands_body() -> None:
    frames = [f for _, fs in golden_frames() for _, f in fs]
    frames.append(own_frame(T("PING")))
    for frame in frames:
        field = BODY_FIELD.get(frame.type)
        if frame.command is None or field is None:
            assert frame.body is None
        else:
            assert frame.body == getattr(frame.command, field)
            assert frame.body.DESCRIPTOR.name == type(getattr(pb.BaseCommand(), field)).__name__


async def test_the_writer_hands_the_file_few_large_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    io = Recorder._io

    async def counted(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "write":
            writes.append(len(args[0]))
        return await io(fn, *args)

    monkeypatch.setattr(Recorder, "_io", staticmethod(counted))
    ping = decode_frame(encode(command(T("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, flush_interval=60.0))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    conn = Conn(1, "127.0.0.1:1", "plain", "pulsar")
    sent = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(50):  # a read of 40 frames every 2 ms
            recorder.frames(conn, True, [ping] * 40)
            sent += 40
            await trio.sleep(0.002)
        await trio.sleep(0.05)
        # Packed as they were queued, the records wait: the writer is not
        # woken for each read (nor for the first of each), only by the
        # amount queued or its clock.
        assert recorder.queued == 2000
        record = len(recorder._queue[0])
        while recorder.queued * record < WRITE_BYTES:
            recorder.frames(conn, True, [ping] * 40)
            sent += 40
        with trio.fail_after(5):
            while recorder.queued:  # taken once WRITE_BYTES were queued
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    assert sum(1 for r in records if r["k"] == "frame") == sent
    # Few large writes: the file as soon as there is a connection, the
    # WRITE_BYTES batch, and the rest when the writer stops.
    assert len(writes) <= 4, writes


async def test_a_new_file_states_each_open_connection_once(tmp_path: Path) -> None:
    ping = decode_frame(encode(command(T("PING"))))
    # Every write starts a new file, and each batch below opens a connection.
    recorder = Recorder(RecorderConfig(tmp_path, max_file_bytes=1, flush_interval=0.01))
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for conn in range(1, 6):
            recorder.open_connection(conn, client="127.0.0.1:1", kind="proxied", listener="plain")
            recorder.frames(Conn(conn, "127.0.0.1:1", "plain", "pulsar"), True, [ping])
            # Written before the next batch (a fixed sleep was not enough on a busy host).
            with trio.fail_after(10):
                while recorder.frames_written < conn:
                    await trio.sleep(0.005)
        recorder.close_connection(1)
        await trio.sleep(0.03)
        nursery.cancel_scope.cancel()
    files = recording_files(tmp_path)
    assert len(files) >= 5
    for path in files:
        records = list(read_records(path))
        opened = [r["c"] for r in records if r["k"] == "conn"]
        assert len(opened) == len(set(opened)), (path.name, opened)
        framed = {r["c"] for r in records if r["k"] == "frame"}
        assert framed <= set(opened), path.name  # every frame's connection is stated first
    last = list(read_records(files[-1]))
    assert {r["c"] for r in last if r["k"] == "conn"} >= {2, 3, 4, 5}
