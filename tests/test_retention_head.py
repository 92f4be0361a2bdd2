"""A new file's head (its header and the connections it restates) larger
than what a writer may write between two retention passes."""

from __future__ import annotations

from pathlib import Path

import trio

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import read_records, recording_files
from sluice.recording.retention import MIN_QUANTUM
from sluice.recording.writer import Recorder, RecorderConfig


async def test_a_head_larger_than_a_quantum_is_written_in_pieces(tmp_path: Path) -> None:
    """The smallest --record-retain-bytes (a 64 KiB quantum) and a thousand
    open connections: each new file restates more than a quantum. Files
    are still written, whole and under the bound (every frame was dropped:
    the head could never be reserved at once)."""
    retain = 4 * MIN_QUANTUM
    ping = decode_frame(encode(command(Type.Value("PING"))))
    config = RecorderConfig(tmp_path, retain_bytes=retain, flush_interval=0.01)
    recorder = Recorder(config)
    conns = []
    for c in range(1, 1001):
        client = f"127.0.0.1:{10000 + c}"
        recorder.open_connection(c, client=client, kind="proxied", listener="plain",
                                 broker=f"broker-{c:04d}.pulsar.example.internal:6650")  # fmt: skip
        conns.append(Conn(c, client, "plain", "pulsar"))
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for round_ in range(40):
            recorder.frames(conns[round_ % len(conns)], True, [ping] * 200)
            with trio.fail_after(10):  # taken by the writer before the next
                while recorder.queued:
                    await trio.sleep(0.005)
            assert sum(p.stat().st_size for p in recording_files(tmp_path)) <= retain
        nursery.cancel_scope.cancel()
    files = recording_files(tmp_path)
    assert recorder.frames_written > 0, f"{recorder.dropped_total} frames dropped"
    heads = []
    for path in files:
        records = list(read_records(path))  # whole records only
        assert records[0]["k"] == "header"
        heads.append(sum(r["k"] == "conn" for r in records))
    assert max(heads) == 1000  # a file restates every open connection
    assert sum(p.stat().st_size for p in files) <= retain
