"""The recording directory (or the file being written) removed while the
proxy records: an operator freeing space with ``rm -rf``. The frames the
removed file held are lost; that must be said and counted, and recording
must go on in a new file, not into a file nobody can reach again until it
rotates (an hour, 256 MiB)."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import read_records, recording_files
from sluice.recording.writer import Recorder, RecorderConfig

CONN = Conn(1, "127.0.0.1:1", "plain", "pulsar")
PING = decode_frame(encode(command(Type.Value("PING"))))


async def _feed_until(recorder: Recorder, done: Callable[[], bool], deadline: float) -> None:
    while not done():
        assert time.monotonic() < deadline, "recording did not go on"
        recorder.frames(CONN, True, [PING] * 10)
        await trio.sleep(0.02)


@pytest.mark.parametrize("removed", ["directory", "file"])
async def test_a_recording_removed_while_written_is_said_and_recording_goes_on(
    removed: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "rec"
    recorder = Recorder(RecorderConfig(directory, flush_interval=0.05))
    caplog.set_level(logging.INFO, logger="sluice.recorder")
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
        deadline = time.monotonic() + 3
        await _feed_until(recorder, lambda: recorder.frames_written >= 50, deadline)
        first = recorder.files[0]
        if removed == "directory":
            shutil.rmtree(directory)
        else:
            first.unlink()
        await _feed_until(recorder, lambda: len(recorder.files) >= 2, deadline)
        second = recorder.files[1]
        await _feed_until(recorder, lambda: second.exists() and second.stat().st_size > 0, deadline)
        nursery.cancel_scope.cancel()
    assert recorder.dropped_total >= 50  # what the removed file held: counted
    lines = [r.getMessage() for r in caplog.records if "was removed while" in r.getMessage()]
    assert len(lines) == 1 and str(first) in lines[0], lines  # said, once
    assert directory.stat().st_mode & 0o007 == 0  # made again as at the start (0750)
    records = list(read_records(second))
    assert [r["k"] for r in records[:3]] == ["header", "conn", "gap"]  # the loss, in place
    assert records[1]["restated"] and records[2]["dropped"] >= 50
    assert sum(r["k"] == "frame" for r in records) > 0
    assert recording_files(directory) == [second]


async def test_a_connection_opened_in_the_first_file_is_not_marked_as_joined(
    tmp_path: Path,
) -> None:
    """The first file's head re-stated every open connection, one whose
    opening was in the records it was made for included: the only record
    of a connection's real opening said `restated` (joined mid-stream),
    which replay and readers take for a connection begun elsewhere. A
    later file still re-states it."""
    recorder = Recorder(RecorderConfig(tmp_path / "rec", flush_interval=0.05))
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
        deadline = time.monotonic() + 3
        await _feed_until(recorder, lambda: recorder.frames_written >= 10, deadline)
        nursery.cancel_scope.cancel()
    records = list(read_records(recorder.files[0]))
    conns = [r for r in records if r["k"] == "conn"]
    assert len(conns) == 1 and "restated" not in conns[0], conns
    assert [r["k"] for r in records[:2]] == ["header", "conn"]
