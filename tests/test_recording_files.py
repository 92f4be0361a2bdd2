"""The files the recorder writes: their names, their modes, where they go."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import read_records, recording_files
from sluice.recording.writer import Recorder, RecorderConfig

CONN = Conn(1, "127.0.0.1:1", "plain", "pulsar")
PING = decode_frame(encode(command(Type.Value("PING"))))


async def _write(recorder: Recorder, frames: int) -> None:
    """Queue ``frames`` PINGs and write them, as the writer task does."""
    recorder.frames(CONN, True, [PING] * frames)
    recorder._take_queued()
    await recorder._write_packed()


async def test_segments_read_in_order_after_the_wall_clock_steps_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock is set back an hour (NTP, an operator) while a capture
    is written: its later segments must still come after its earlier ones
    in the order readers list files (by name), or inspect, replay and serve
    read the capture's traffic out of order."""
    real = time.gmtime
    behind = 0.0
    monkeypatch.setattr(time, "gmtime", lambda *_: real(time.time() - behind))
    recorder = Recorder(RecorderConfig(tmp_path, max_file_bytes=4096))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    for _ in range(3):
        await _write(recorder, 200)
    behind = 3600.0
    for _ in range(3):
        await _write(recorder, 200)
    await recorder._close_file()
    segments = [next(iter(read_records(p)))["segment"] for p in recording_files(tmp_path)]
    assert len(segments) > 3
    assert segments == sorted(segments)


async def test_recordings_are_not_readable_by_other_users(tmp_path: Path) -> None:
    """Recordings hold payloads, topics and clients' addresses: neither a
    segment, a snapshot nor the directories Sluice makes for them are open
    to every user of the host (the usual umask 022 would let them read)."""
    old = os.umask(0o022)
    try:
        recorder = Recorder(RecorderConfig(tmp_path / "rec"))
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
            await _write(recorder, 10)
            nursery.cancel_scope.cancel()
        ring = Recorder(RecorderConfig(tmp_path / "rec", ring_bytes=1 << 20))
        ring.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
        ring.frames(CONN, True, [PING] * 10)
        snapshot = await ring.snapshot(reason="bug")
    finally:
        os.umask(old)
    files = recording_files(tmp_path / "rec")
    assert snapshot.file in files and len(files) == 2
    for path in [*files, tmp_path / "rec", snapshot.directory]:
        assert path.stat().st_mode & 0o007 == 0, f"{path}: {oct(path.stat().st_mode)}"
