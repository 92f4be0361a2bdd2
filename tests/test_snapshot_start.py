"""A snapshot's start (its header's ``started``, from which ``sluice inspect``
counts offsets) is the earliest time of any record it holds."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import read_records
from sluice.recording.writer import Recorder, RecorderConfig

MiB = 1024 * 1024


async def test_an_exchange_begun_before_the_oldest_part_starts_the_snapshot(
    tmp_path: Path,
) -> None:
    """An HTTP exchange is written when it ends, with the time it began: its
    record can be in a later part of the ring than frames recorded after it
    began. The snapshot starts at it, not at the oldest part's records."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=MiB, flush_interval=0.02))
    began_mono, began_wall = time.monotonic_ns(), time.time_ns()
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        # The exchange is under way while a connection opens and sends a frame.
        with trio.fail_after(10):
            while time.time_ns() == began_wall:
                await trio.sleep(0.001)
        recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                                 broker="127.0.0.1:6650")  # fmt: skip
        recorder.frames(conn, True, [ping])
        with trio.fail_after(10):  # the frame's part is in the ring
            while recorder.ring_bytes == 0:
                await trio.sleep(0.005)
        in_ring = recorder.ring_bytes
        exchange = {"k": "http", "h": 1, "x": 1, "client": "127.0.0.1:5556", "t": began_mono,
                    "w": began_wall, "te": time.monotonic_ns(), "method": "GET",
                    "path": "/admin/v2/clusters", "kind": "admin", "status": 200,
                    "req": {"h": [], "n": 0}, "res": {"h": [], "n": 0}}  # fmt: skip
        recorder.note(exchange)
        with trio.fail_after(10):  # a later part
            while recorder.ring_bytes == in_ring:
                await trio.sleep(0.005)
        snap = await recorder.snapshot(reason="test")
        nursery.cancel_scope.cancel()
    records = list(read_records(snap.file))
    started = records[0]["started"]
    walls = {r["k"]: r["w"] for r in records if r["k"] in ("conn", "frame", "http")}
    assert walls["http"] < min(walls["conn"], walls["frame"])
    assert started <= walls["http"], f"the exchange reads {(walls['http'] - started) / 1e9} s in"
