"""When what the recorder took reaches the operating system: within one
--record-flush-interval, as docs/recording-format.md promises of ``kill
-9`` ("loses the frames of at most the last flush interval"), however
often records that are not frames wake the writer in between."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import trio

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import RecordingError, read_records, recording_files
from sluice.recording.writer import Recorder, RecorderConfig

CONN = Conn(1, "127.0.0.1:1", "plain", "pulsar")
PING = decode_frame(encode(command(Type.Value("PING"))))
INTERVAL = 0.4


def frames_on_disk(directory: Path) -> int:
    """Frame records readable from the files now (what a kill would leave)."""
    count = 0
    for path in recording_files(directory):
        with contextlib.suppress(RecordingError):  # a file not flushed yet
            count += sum(record["k"] == "frame" for record in read_records(path))
    return count


async def test_every_frame_is_flushed_within_one_interval_when_records_wake_the_writer(
    tmp_path: Path,
) -> None:
    """A connection opens a little more often than the flush interval (its
    record wakes the writer) while frames, which do not wake it, trickle in:
    each frame must be readable from the file no later than one interval
    (plus scheduling slack) after it was taken. The writer used to start
    its wait for the next flush afresh at every wake, so such a frame
    waited up to two intervals: twice what a kill was said to lose."""
    directory = tmp_path / "rec"
    recorder = Recorder(RecorderConfig(directory, flush_interval=INTERVAL))
    taken: list[float] = []
    worst = 0.0
    seen = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
        start = time.monotonic()
        wake_at, conn = start + INTERVAL * 0.9, 2
        while time.monotonic() - start < 6 * INTERVAL:
            now = time.monotonic()
            recorder.frames(CONN, True, [PING])
            taken.append(now)
            if now >= wake_at:  # a record that is not a frame: wakes the writer
                recorder.open_connection(conn, client="127.0.0.1:2", kind="proxied",
                                         listener="plain")  # fmt: skip
                conn += 1
                wake_at += INTERVAL * 0.9
            await trio.sleep(0.02)
            on_disk = frames_on_disk(directory) if directory.exists() else 0
            checked = time.monotonic()
            for at in range(seen, on_disk):
                worst = max(worst, checked - taken[at])
            seen = max(seen, on_disk)
        nursery.cancel_scope.cancel()
    assert seen > len(taken) / 2, (seen, len(taken))
    assert worst < INTERVAL * 1.5, f"a frame reached the file {worst:.2f} s after it was taken"
