"""Recording through the proxy, read back with `sluice inspect`."""

from __future__ import annotations

import collections
import errno
import json
import resource
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pulsar
import pytest
import trio

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode, pb
from sluice.protocols.pulsar.encoder import encode_payload
from sluice.protocols.pulsar.frame import command_name
from sluice.recording import format as fmt
from sluice.recording.format import RecordingError, read_records, recording_files
from sluice.recording.writer import Recorder, RecorderConfig
from tests.helpers.poll import wait_until_in_trio
from tests.helpers.support import SLUICE, client, start_proxy
from tests.test_dashboards import scrape, value

# The connection the in-process recorder tests record frames of.
CONN_1 = Conn(1, "127.0.0.1:1", "plain", "pulsar")


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, "inspect", *args], capture_output=True, text=True, timeout=120, check=False
    )


def json_records(directory: Path, *extra: str) -> list[dict[str, Any]]:
    result = inspect(str(directory), "--json", *extra)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def recorded_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in recording_files(directory))


def all_closed(p: Any, admin: int) -> dict[Any, float]:
    """The proxy's metrics once it has no client connection open (their
    last frames read, counted and recorded), within 10 s."""
    deadline = time.monotonic() + 10
    while True:
        metrics = scrape(p, admin)
        active = [v for (name, _), v in metrics.items() if name == "sluice_connections_active"]
        if active and not any(active):
            return metrics
        assert time.monotonic() < deadline, f"connections still open: {active}"
        time.sleep(0.05)


def test_inspect_shows_every_frame_and_counts_match_the_traffic(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    rec, admin = tmp_path / "rec", free_port()
    p = start_proxy(broker.url, tmp_path, "--record", str(rec), "--admin", f"127.0.0.1:{admin}")
    sends = 30
    try:
        with client(p.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(sends):
                producer.send(f"m{i}".encode())
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(sends):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        # The client's last frames (its acks, its closes) are counted once
        # the proxy has read them: by the time their connections are closed.
        metrics = all_closed(p, admin)
        assert p.terminate() == 0  # graceful: the writer flushes everything
    finally:
        p.kill()
    frames = [r for r in json_records(rec) if r["kind"] == "frame"]
    counted = collections.Counter((r["cmd"], r["direction"]) for r in frames)
    assert counted[("SEND", "client_to_broker")] == sends
    assert counted[("SEND_RECEIPT", "broker_to_client")] == sends
    assert counted[("MESSAGE", "broker_to_client")] == sends
    # Every frame the proxy counted is in the recording, and nothing else.
    from_metrics = {
        (dict(labels)["command"], dict(labels)["direction"]): v
        for (name, labels), v in metrics.items()
        if name == "sluice_frames_total"
    }
    assert from_metrics == {k: float(v) for k, v in counted.items()}
    # The summary names topics, ids and sizes; the timeline shows every frame.
    sends_seen = [r for r in frames if r["cmd"] == "SEND"]
    assert all(r["topic"] == topic and r["payload"]["size"] > 0 for r in sends_seen)
    assert [r["seq"] for r in sends_seen] == list(range(sends))
    timeline = inspect(str(rec))
    assert timeline.returncode == 0
    assert timeline.stdout.count(" C→B SEND ") == sends
    assert f"{len(frames)} frames on" in timeline.stdout
    # Filters.
    only_sends = json_records(rec, "--command", "send", "--topic", topic)
    assert [r["cmd"] for r in only_sends] == ["SEND"] * sends


@pytest.mark.parametrize("payloads", ["full", "hash", "none"])
def test_credentials_never_reach_files_or_logs(
    broker: EmbeddedBroker, tmp_path: Path, topic: str, payloads: str
) -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.c2x1aWNlLXRlc3Q.secret-signature-4711"
    property_secret = "property-secret-0815"
    rec = tmp_path / "rec"
    p = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-payloads", payloads,
                    "--log-level", "debug")  # fmt: skip
    try:
        with client(p.url, authentication=pulsar.AuthenticationToken(token)) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"payload", properties={"api-token": property_secret, "color": "blue"})
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            assert consumer.receive(timeout_millis=10_000).properties()["color"] == "blue"
        assert p.terminate() == 0
    finally:
        p.kill()
    data = recorded_bytes(rec)
    assert data, "nothing was recorded"
    for secret in (token, "secret-signature-4711", property_secret):
        assert secret.encode() not in data
        assert secret not in p.log()
    connects = [r for r in json_records(rec) if r.get("cmd") == "CONNECT"]
    assert connects and all(r.get("redacted") for r in connects)
    if payloads == "full":  # the payload itself is kept, only the secret goes
        assert b"payload" in data and b"blue" in data


def frames_on_disk(rec: Path, *, live: bool = False) -> int:
    """The frames a reader finds in the recording now (a torn last record
    is left out, not an error); ``live``: beside its writer, where a file
    just started may not have its header yet."""
    total = 0
    for path in recording_files(rec):
        result = fmt.ReadResult(path)
        try:
            total += sum(1 for r in read_records(path, result) if r["k"] == "frame")
        except fmt.Unfinished:
            if not live:
                raise
    return total


def test_kill_9_leaves_readable_files(broker: EmbeddedBroker, tmp_path: Path, topic: str) -> None:
    rec = tmp_path / "rec"
    p = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-flush-interval", "0.2")
    sent = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal sent
        with client(p.url) as c:
            producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=3000)
            while not stop.is_set():
                try:
                    producer.send(b"x" * 200)
                    sent += 1
                except pulsar.PulsarException:
                    return

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while sent < 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Flushed (every 0.2 s), as a reader beside the writer sees them.
        while (flushed := frames_on_disk(rec, live=True)) < 200:
            assert time.monotonic() < deadline, f"{flushed} frames on disk"
            time.sleep(0.05)
        p.process.send_signal(signal.SIGKILL)
        p.process.wait(10)
    finally:
        stop.set()
        thread.join(30)
        p.kill()
    assert recording_files(rec)
    assert frames_on_disk(rec) >= flushed  # everything flushed before the kill reads back
    summary = inspect(str(rec), "--summary")
    assert summary.returncode == 0, summary.stderr
    assert "Traceback" not in summary.stderr


def test_disk_trouble_drops_frames_but_never_traffic(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    rec, admin = tmp_path / "rec", free_port()
    limit = 48 * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-payloads", "full",
                    "--admin", f"127.0.0.1:{admin}", "--record-flush-interval", "0.1",
                    preexec=small_files)  # fmt: skip
    count = 300
    try:
        with client(p.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(count):
                producer.send(f"{i:04d}".encode() * 500)  # 2 KB each, ~600 KB in all
            time.sleep(2.5)  # the writer retries a failed disk after 2 s
            producer.send(b"after the retry")
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            got = [consumer.receive(timeout_millis=10_000).data() for _ in range(count + 1)]
        assert got[-1] == b"after the retry" and len(set(got)) == count + 1
        # Read once no frame can come (every connection closed): a drop
        # after the reading would be in a gap record and not in the count.
        dropped = value(all_closed(p, admin), "sluice_recorder_dropped_frames_total")
        assert dropped > 0
        assert p.terminate() == 0
    finally:
        p.kill()
    assert "recording failed" in p.log()
    assert "internal error" not in p.log() and "Traceback" not in p.log()
    gaps = [r for r in json_records(rec) if r["kind"] == "gap"]
    assert gaps and sum(g["dropped"] for g in gaps) <= dropped
    assert all(path.stat().st_size <= limit for path in recording_files(rec))


def test_pcap_export_reassembles_to_the_recorded_bytes(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    tshark = shutil.which("tshark")
    assert tshark, "tshark is not installed (./dev setup installs it)"
    rec = tmp_path / "rec"
    p = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-payloads", "full")
    try:
        with client(p.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"small")
            producer.send(b"L" * 150_000)  # larger than one synthetic segment
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(2):
                consumer.receive(timeout_millis=10_000)
        assert p.terminate() == 0
    finally:
        p.kill()
    out = tmp_path / "out.pcapng"
    exported = inspect(str(rec), "--pcap", str(out))
    assert exported.returncode == 0, exported.stderr
    # What the recording says each side of each connection sent.
    expected: dict[tuple[int, bool], bytes] = collections.defaultdict(bytes)
    ports: dict[int, int] = {}
    for record in (r for path in recording_files(rec) for r in read_records(path)):
        if record["k"] == "conn":
            ports[int(record["client"].rsplit(":", 1)[1])] = record["c"]
        elif record["k"] == "frame":
            expected[(record["c"], record["d"] == 0)] += record["raw"]
    fields = subprocess.run(
        [tshark, "-r", str(out), "-T", "fields", "-E", "separator=;", "-e", "tcp.srcport",
         "-e", "tcp.dstport", "-e", "tcp.payload"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    seen: dict[tuple[int, bool], bytes] = collections.defaultdict(bytes)
    for line in fields.splitlines():
        src, dst, payload = line.split(";")
        from_client = int(src) in ports
        conn = ports[int(src) if from_client else int(dst)]
        seen[(conn, from_client)] += bytes.fromhex(payload.replace(":", ""))
    assert seen == expected
    problems = subprocess.run(
        [tshark, "-r", str(out), "-Y", "tcp.analysis.flags && !tcp.analysis.window_update"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert problems.strip() == "", problems


# --- the format --------------------------------------------------------------


def write(path: Path, records: list[dict[str, Any]], tail: bytes = b"") -> Path:
    path.write_bytes(fmt.dumps(records) + tail)
    return path


def a_header(version: int = fmt.VERSION) -> dict[str, Any]:
    h = fmt.header(
        capture="c", segment=1, started_ns=0, payloads=fmt.PayloadPolicy.HASH, sluice_version="t"
    )
    h["version"] = version
    return h


def test_truncated_tail_is_reported_not_raised(tmp_path: Path) -> None:
    frame = {"k": "close", "c": 1, "t": 0, "w": 0, "reason": "x"}
    path = write(tmp_path / "a.sluice", [a_header(), frame], msgpack.packb(frame)[:-3])
    result = fmt.ReadResult(path)
    assert [r["k"] for r in read_records(path, result)] == ["header", "close"]
    assert result.truncated_bytes == len(msgpack.packb(frame)) - 3
    # However little of the last record made it: a map's first bytes alone.
    path = write(tmp_path / "b.sluice", [a_header(), frame], b"\x87\xa1k")
    result = fmt.ReadResult(path)
    assert [r["k"] for r in read_records(path, result)] == ["header", "close"]
    assert result.truncated_bytes == 3


@pytest.mark.e2e
def test_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "x.sluice"
    path.write_bytes(b"\x00garbage that is not msgpack at all \xc1\xc1")
    with pytest.raises(RecordingError, match="not a Sluice recording"):
        list(read_records(path))
    result = inspect(str(path))
    assert result.returncode == 2 and "not a Sluice recording" in result.stderr
    assert "Traceback" not in result.stderr
    assert inspect(str(tmp_path / "missing")).returncode == 2


def test_newer_format_is_refused_with_advice(tmp_path: Path) -> None:
    path = write(tmp_path / "n.sluice", [a_header(fmt.VERSION + 1)])
    with pytest.raises(RecordingError, match="upgrade Sluice"):
        list(read_records(path))


def test_older_formats_are_upgraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def from_v0(record: dict[str, Any]) -> dict[str, Any]:
        if record.get("k") == "close" and "reason" not in record:
            record = {**record, "reason": "unknown (format 0)"}
        return record

    monkeypatch.setitem(fmt.UPGRADERS, 0, from_v0)
    path = write(tmp_path / "old.sluice", [a_header(0), {"k": "close", "c": 1, "t": 0, "w": 0}])
    result = fmt.ReadResult(path)
    records = list(read_records(path, result))
    assert result.version == 0
    assert records[1]["reason"] == "unknown (format 0)"


# --- the recorder's queue ------------------------------------------------------


async def test_lossless_mode_waits_for_the_writer_instead_of_dropping(tmp_path: Path) -> None:
    import trio

    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    config = RecorderConfig(tmp_path, lossless=True, queue_frames=2, flush_interval=0.05)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder.frames(CONN_1, True, [ping])
    recorder.frames(CONN_1, True, [ping])
    with trio.move_on_after(0.3) as blocked:
        await recorder.room()  # full, and no writer yet: must wait
    assert blocked.cancelled_caught
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(50):  # the proxy's loop in lossless mode: wait for room, then record
            await recorder.room()
            recorder.frames(CONN_1, True, [ping])
        await trio.sleep(0.3)
        nursery.cancel_scope.cancel()
    frames = [r for p in recording_files(tmp_path) for r in read_records(p) if r["k"] == "frame"]
    assert len(frames) == 52
    assert not [r for p in recording_files(tmp_path) for r in read_records(p) if r["k"] == "gap"]


async def test_every_reader_waiting_for_room_goes_on_once_there_is_some(tmp_path: Path) -> None:
    """Lossless mode: both directions of a connection (and others') may
    wait for room at once; once the writer takes the queue, every one of
    them goes on. (Each waiter made its own event and the writer set only
    the last one: the others waited for good, a direction never read
    again.)"""
    import trio
    import trio.testing

    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    config = RecorderConfig(tmp_path, lossless=True, queue_frames=2, flush_interval=0.05)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder.frames(CONN_1, True, [ping, ping])  # full
    went_on: list[int] = []

    async def reader(number: int, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await recorder.room()
        went_on.append(number)

    async with trio.open_nursery() as nursery:
        for number in range(3):
            await nursery.start(reader, number)
        await trio.testing.wait_all_tasks_blocked()
        assert went_on == []  # all three wait: no writer yet
        await nursery.start(recorder.run)
        with trio.fail_after(10):
            while len(went_on) < 3:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert sorted(went_on) == [0, 1, 2]


async def test_a_full_queue_drops_whole_reads_and_says_so(tmp_path: Path) -> None:
    """Without lossless, a read that finds the queue full is dropped, counted,
    and a gap record says how many frames are missing; the frames of one
    read share its time."""
    import trio

    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, queue_frames=4, flush_interval=0.05))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder.frames(CONN_1, True, [ping] * 2)  # the queue: the conn record and these
    time.sleep(0.002)  # a later read, a later time
    recorder.frames(CONN_1, False, [ping] * 5)  # goes over by one read, at most
    recorder.frames(CONN_1, True, [ping] * 4)  # finds it full: dropped
    assert recorder.queued == 8 and recorder.dropped_total == 4
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        with trio.fail_after(10):
            while recorder.frames_written < 7:
                await trio.sleep(0.01)
        recorder.frames(CONN_1, True, [ping])  # room again
        with trio.fail_after(10):
            while recorder.frames_written < 8:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    frames = [r for r in records if r["k"] == "frame"]
    assert [r["d"] for r in frames] == [0, 0, 1, 1, 1, 1, 1, 0]
    assert len({(r["t"], r["w"]) for r in frames[2:7]}) == 1  # one read, one time
    assert frames[1]["t"] < frames[2]["t"]
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [4]  # the next write says so


async def test_a_recorder_bug_drops_the_part_says_so_once_and_recording_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import trio

    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, flush_interval=0.05))
    packed = recorder._frame_records
    failing = [True, True]

    def buggy(conn: int, direction: int, mono_ns: int, wall_ns: int, frames: Any) -> list[bytes]:
        if failing and failing.pop():
            raise ValueError("a bug")
        return packed(conn, direction, mono_ns, wall_ns, frames)

    recorder._frame_records = buggy
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder.frames(CONN_1, True, [ping] * 3)  # raises inside: never out of frames()
    recorder.frames(CONN_1, True, [ping] * 2)  # again: logged once
    recorder.frames(CONN_1, False, [ping])
    assert recorder.dropped_total == 5
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        with trio.fail_after(10):
            while recorder.frames_written < 1:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    assert [r["d"] for r in records if r["k"] == "frame"] == [1]
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [5]
    assert len([m for m in caplog.messages if "could not record" in m]) == 1


@pytest.mark.e2e
def test_inspect_time_filters(tmp_path: Path) -> None:
    frame = {"k": "frame", "c": 1, "d": 0, "t": 0, "n": 13, "raw": b"",
             "s": {"cmd": "PING"}}  # fmt: skip
    header = fmt.header(capture="c", segment=1, started_ns=10**18, payloads=fmt.PayloadPolicy.HASH,
                        sluice_version="t")  # fmt: skip
    records = [header] + [{**frame, "w": 10**18 + i * 10**9} for i in range(10)]  # one a second
    (tmp_path / "r.sluice").write_bytes(fmt.dumps(records))
    assert len(json_records(tmp_path)) == 10
    assert len(json_records(tmp_path, "--since", "3", "--until", "5.5")) == 3
    assert json_records(tmp_path, "--since", "100") == []


class FullDisk:
    """A file that accepts writes and then cannot flush them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        raise OSError(errno.EFBIG, "File too large")

    def close(self) -> None:
        self.inner.close()
        raise OSError(errno.EFBIG, "File too large")


async def test_a_failing_flush_is_counted_not_fatal(tmp_path: Path) -> None:
    import trio

    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.proxy.metrics import Metrics
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    metrics = Metrics()
    recorder = Recorder(RecorderConfig(tmp_path, flush_interval=0.05))
    metrics.watch(recorder)
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")

    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.frames(CONN_1, True, [ping])
        # Written for real, flushed.
        await wait_until_in_trio(
            lambda: recorder.frames_written == 1 and recorder._unflushed == 0,
            10,
            "1 frame written, all flushed",
        )
        assert recorder._file is not None
        recorder._file = FullDisk(recorder._file)  # type: ignore[assignment]
        for _ in range(5):
            recorder.frames(CONN_1, True, [ping])
        # The flush fails: those 5 are lost, and counted.
        await wait_until_in_trio(lambda: recorder.dropped_total == 5, 10, "5 frames dropped")
        recorder._retry_at = 0.0  # the disk is back
        recorder.frames(CONN_1, True, [ping])
        await wait_until_in_trio(
            lambda: recorder.frames_written == 7 and recorder._unflushed == 0,
            10,
            "7 frames written, all flushed",
        )
        nursery.cancel_scope.cancel()
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    assert sum(1 for r in records if r["k"] == "frame") == 2
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [5]
    assert recorder.dropped_total == 5
    assert metrics.registry.get_sample_value("sluice_recorder_dropped_frames_total") == 5


async def test_a_gap_record_lost_with_a_failing_flush_is_said_again(tmp_path: Path) -> None:
    """Frames dropped (a full queue), then the gap record saying so handed to
    a file whose flush fails: the next gap record says those drops as well
    as the frames the failure lost, so the recording says everything it
    lacks. (The gap's count was gone with it: 7 dropped, 4 said.)"""
    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording.writer import Recorder, RecorderConfig

    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, queue_frames=4))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder._take_queued()  # as the writer does, one step at a time
    await recorder._write_packed()
    await recorder._flush()
    recorder.frames(CONN_1, True, [ping] * 4)
    recorder.frames(CONN_1, True, [ping] * 3)  # the queue is full: 3 dropped
    recorder._file = FullDisk(recorder._file)  # type: ignore[assignment]
    recorder._take_queued()
    await recorder._write_packed()  # a gap of 3 and 4 frames, buffered
    await recorder._flush()  # fails: the 4 frames are lost, and the gap record
    recorder._retry_at = 0.0  # the disk is back
    recorder.frames(CONN_1, True, [ping])
    recorder._take_queued()
    await recorder._write_packed()
    await recorder._close_file()
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [7]
    assert recorder.dropped_total == 7
    assert sum(1 for r in records if r["k"] == "frame") == 1


async def test_drops_no_record_followed_are_said_at_shutdown(tmp_path: Path) -> None:
    """The last flush fails (the frames it held are lost), the disk comes
    back, and the proxy stops before another record: the gap record saying
    so is still written."""
    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    recorder.frames(CONN_1, True, [ping] * 3)
    recorder._take_queued()  # as the writer does, one step at a time
    await recorder._write_packed()
    recorder._file = FullDisk(recorder._file)  # type: ignore[assignment]
    await recorder._flush()  # fails: the conn record and 3 frames are lost
    recorder._retry_at = 0.0  # the disk is back
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        nursery.cancel_scope.cancel()  # shutdown
    records = [r for p in recording_files(tmp_path) for r in read_records(p)]
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [3]
    assert recorder.dropped_total == 3


def test_a_directory_pruned_while_it_is_listed_lists_without_error(tmp_path: Path) -> None:
    """Retention removes snapshot directories as they empty, while readers
    (inspect, view, analyze) list the recording directory: what is gone
    meanwhile is not listed, never an error."""
    for round_ in range(5):
        for n in range(200):
            (tmp_path / f"snapshot-{round_}-{n:03d}").mkdir()
            (tmp_path / f"snapshot-{round_}-{n:03d}" / f"s-{n}.sluice").write_bytes(b"")

        def prune() -> None:
            for directory in sorted(tmp_path.iterdir()):
                shutil.rmtree(directory)

        pruning = threading.Thread(target=prune)
        pruning.start()
        listings = 0
        while pruning.is_alive():
            recording_files(tmp_path)
            listings += 1
        pruning.join()
        assert listings > 0 and recording_files(tmp_path) == []


async def _segmented_capture(directory: Path) -> None:
    """One connection over several segments of the default payload policy
    (hash: a SEND's bytes recorded up to its payload): SENDs of 100 bytes
    and PINGs from the client, PONGs from the broker."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping, pong = (decode_frame(encode(command(Type.Value(n)))) for n in ("PING", "PONG"))
    recorder = Recorder(RecorderConfig(directory, max_file_bytes=600, flush_interval=0.01))
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for seq in range(12):
            body = pb.CommandSend(producer_id=1, sequence_id=seq)
            meta = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1)
            send = decode_frame(encode_payload(command(Type.SEND, body), meta, b"x" * 100))
            recorder.frames(conn, True, [send, ping])
            recorder.frames(conn, False, [pong])
            await trio.sleep(0.02)
        recorder.close_connection(1, "client closed")
        nursery.cancel_scope.cancel()  # what is queued is written on the way out


@pytest.mark.e2e  # runs tshark
async def test_pcap_of_a_connection_over_segments_is_one_framed_conversation(
    tmp_path: Path,
) -> None:
    """The conn record each segment opens with is the same connection, not
    a new one; frames recorded without their payload still frame the stream;
    a --command filter keeps the connection the kept frames travel on."""
    tshark = shutil.which("tshark")
    assert tshark, "tshark is not installed (./dev setup installs it)"
    rec = tmp_path / "rec"
    await _segmented_capture(rec)
    assert len(recording_files(rec)) >= 3
    out = tmp_path / "out.pcapng"
    exported = inspect(str(rec), "--pcap", str(out))
    assert exported.returncode == 0, exported.stderr

    def tcp(*fields: str, where: str = "") -> list[list[str]]:
        args = [tshark, "-r", str(out), "-T", "fields", "-E", "separator=;"]
        args += [a for f in fields for a in ("-e", f)] + (["-Y", where] if where else [])
        lines = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
        return [line.split(";") for line in lines.stdout.splitlines()]

    assert len(tcp("frame.number", where="tcp.flags.syn == 1 && tcp.flags.ack == 0")) == 1
    assert tcp("frame.number", where="tcp.analysis.flags && !tcp.analysis.window_update") == []
    stream = b"".join(
        bytes.fromhex(payload.replace(":", ""))
        for port, payload in tcp("tcp.srcport", "tcp.payload")
        if port == "5555" and payload
    )
    names = []
    while stream:  # each length prefix says where the next frame starts
        size = int.from_bytes(stream[:4], "big")
        assert 4 + size <= len(stream), (size, len(stream))
        names.append(command_name(decode_frame(stream[: 4 + size]).type))
        stream = stream[4 + size :]
    assert names == ["SEND", "PING"] * 12
    timeline = inspect(str(rec)).stdout.splitlines()
    assert len([line for line in timeline if line.split()[1:3] == ["c1", "open"]]) == 1
    pings = inspect(str(rec), "--command", "PING", "--pcap", str(out))
    assert pings.returncode == 0, pings.stderr
    assert [p for (p,) in tcp("tcp.len", where="tcp.len > 0")] == ["13"] * 12
