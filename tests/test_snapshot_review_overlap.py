"""Flight-recorder snapshots that cover the same seconds, read together:
every recorded frame once, not once per snapshot that holds it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import PayloadPolicy, read_records
from sluice.recording.reader import load
from sluice.recording.writer import Recorder, RecorderConfig
from tests.helpers.support import client
from tests.test_flight_recorder import http_post, ring_proxy, sent_payloads, snapshot_cli

MiB = 1024 * 1024


async def test_overlapping_snapshots_of_one_ring_read_as_each_frame_once(tmp_path: Path) -> None:
    """Snapshots A (4 pings), B (A's 4 and 4 more), C (the last 4 only), and
    D (all of it again): read together, 8 frames, in the order recorded."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping = decode_frame(encode(command(Type.Value("PING"))))
    pong = decode_frame(encode(command(Type.Value("PONG"))))
    config = RecorderConfig(tmp_path, PayloadPolicy.FULL, ring_bytes=MiB, flush_interval=0.02)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    files = []
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(4):
            recorder.frames(conn, True, [ping, ping])  # two frames of one read: same t and w
            await trio.sleep(0.01)
        files.append((await recorder.snapshot(name="a")).file)
        await trio.sleep(0.3)
        for _ in range(4):
            recorder.frames(conn, False, [pong])
            await trio.sleep(0.01)
        files.append((await recorder.snapshot(name="b")).file)
        files.append((await recorder.snapshot(name="c", last=0.25)).file)
        files.append((await recorder.snapshot(name="d")).file)
        nursery.cancel_scope.cancel()
    held = [sum(r["k"] == "frame" for r in read_records(f)) for f in files]
    assert held == [8, 12, 4, 12]  # each file reads whole on its own
    assert len(load(files[1]).connections[0].frames) == 12
    recording = load(tmp_path)
    assert recording.frames == 12
    (only,) = recording.connections
    assert [f.frame.name for f in only.frames] == ["PING"] * 8 + ["PONG"] * 4
    assert [f.index for f in only.frames] == list(range(12))


def test_a_recent_and_a_whole_snapshot_read_together_hold_each_message_once(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """``--last N`` and then the whole ring, through a real proxy: the
    recording directory read as one holds each SEND once."""
    proxy, admin, record = ring_proxy(broker.url, tmp_path, "--record-ring", "8M")
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(10):
                producer.send(f"m-{i}".encode())
            started = time.monotonic()
            status, answer = http_post(admin, json.dumps({"last": 60}).encode())
            whole = snapshot_cli(admin, tmp_path, "--reason", "whole")
            assert time.monotonic() - started < 60
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert status == 201, answer
    assert whole.returncode == 0, whole.stderr
    expected = [f"m-{i}".encode() for i in range(10)]
    assert sent_payloads(Path(json.loads(answer)["path"])) == expected
    assert sent_payloads(Path(whole.stdout.strip())) == expected
    assert sent_payloads(record) == expected


async def test_snapshots_of_one_ring_are_read_in_the_order_they_were_taken(
    tmp_path: Path,
) -> None:
    """Snapshot directories are named by the time to the second, then the
    reason: two taken within one second can be listed later one first (a
    rule's snapshot and one on demand). Read as one recording, the frames
    still come in the order recorded, not the later snapshot's first."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping = decode_frame(encode(command(Type.Value("PING"))))
    pong = decode_frame(encode(command(Type.Value("PONG"))))
    config = RecorderConfig(tmp_path, PayloadPolicy.FULL, ring_bytes=MiB, flush_interval=0.02)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.frames(conn, True, [ping, ping])
        await trio.sleep(0.3)
        recorder.frames(conn, False, [pong])
        # The earlier one (the whole ring) named to list after the later one
        # (its last 0.2 s: the PONG alone), as reasons within a second can be.
        await recorder.snapshot(name="snapshot-20260101T000000-zz-rule-1a2b3c")
        await recorder.snapshot(name="snapshot-20260101T000000-aa-demand-4d5e6f", last=0.2)
        nursery.cancel_scope.cancel()
    (only,) = load(tmp_path).connections
    assert [f.frame.name for f in only.frames] == ["PING", "PING", "PONG"]
    assert [f.index for f in only.frames] == [0, 1, 2]


async def test_a_recent_snapshot_taken_before_a_whole_one_reads_in_recorded_order(
    tmp_path: Path,
) -> None:
    """`--last N`, then the whole ring: the recent one (taken first, so
    listed first) holds newer records than the whole one's first; read in
    file order, the older records only the whole one holds came after
    them (PONG, PING, PING), and the connection's close before its first
    frames. Files are read by the first ring number they hold."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping = decode_frame(encode(command(Type.Value("PING"))))
    pong = decode_frame(encode(command(Type.Value("PONG"))))
    config = RecorderConfig(tmp_path, PayloadPolicy.FULL, ring_bytes=MiB, flush_interval=0.02)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.frames(conn, True, [ping, ping])
        await trio.sleep(0.3)
        recorder.frames(conn, False, [pong])
        await recorder.snapshot(name="a-recent", last=0.2)
        await recorder.snapshot(name="b-whole")
        nursery.cancel_scope.cancel()
    (only,) = load(tmp_path).connections
    assert [f.frame.name for f in only.frames] == ["PING", "PING", "PONG"]
