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
from sluice.recording.writer import Recorder, RecorderConfig, SnapshotError

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


async def test_a_link_planted_at_a_files_name_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone who can write in the recording directory plants a symlink
    where the next segment will be written (its name is predictable: the
    time and the capture id of the files before it): Sluice must neither
    write the recording through it nor truncate what it points at. The
    frames that could not go there are counted and said by a gap record in
    the next file."""
    monkeypatch.setattr(time, "gmtime", lambda *_: time.struct_time((2030, 1, 1, 0, 0, 0, 1, 1, 0)))
    rec = tmp_path / "rec"
    rec.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    recorder = Recorder(RecorderConfig(rec))
    name = f"sluice-20300101T000000-{recorder.capture}-0001.sluice"
    (rec / name).symlink_to(victim)
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    await _write(recorder, 3)
    recorder._retry_at = 0.0  # as 2 s later
    await _write(recorder, 2)
    await recorder._close_file()
    assert victim.read_bytes() == b"precious"
    assert (rec / name).is_symlink()
    written = [p for p in recording_files(rec) if not p.is_symlink()]
    records = [r for p in written for r in read_records(p)]
    assert [r["dropped"] for r in records if r["k"] == "gap"] == [3]
    assert sum(r["k"] == "frame" for r in records) == 2
    assert recorder.dropped_total == 3


async def test_a_snapshot_is_not_written_through_a_planted_directory_link(
    tmp_path: Path,
) -> None:
    """A symlink where a snapshot's directory goes: refused, nothing written
    where it points."""
    rec = tmp_path / "rec"
    rec.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (rec / "snap").symlink_to(elsewhere)
    ring = Recorder(RecorderConfig(rec, ring_bytes=1 << 20))
    ring.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    ring.frames(CONN, True, [PING] * 10)
    with pytest.raises(SnapshotError, match="symbolic link"):
        await ring.snapshot(name="snap")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(("mode", "said"), [(0o755, "list its"), (0o777, "list and remove"),
                                            (0o750, "")])  # fmt: skip
async def test_a_directory_open_to_other_users_is_said(
    mode: int, said: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recording directory made before (by hand, a package, a volume)
    that other users may enter: Sluice keeps its own files from them, but
    not their names, nor (writable) their removal. Said at the start."""
    directory = tmp_path / "rec"
    directory.mkdir()
    directory.chmod(mode)
    recorder = Recorder(RecorderConfig(directory))
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "open to other users" in r.getMessage()]
    if said:
        assert len(lines) == 1 and said in lines[0] and f"{mode:04o}" in lines[0], lines
    else:
        assert lines == []
