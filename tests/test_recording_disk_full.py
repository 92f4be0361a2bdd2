"""A disk that takes new files but not their bytes (full, over a quota or
a file-size limit) for a long while: the recorder tries a new file every
little while. The trouble is to be said once, not once per try, and the
tries must not leave the directory strewn with files that hold nothing
readable. Run in a subprocess under a file-size limit (RLIMIT_FSIZE), the
recorder's own retry delay shortened so that several tries fit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sluice.recording.format import read_records, recording_files

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import logging, resource, sys, time
    from pathlib import Path

    import trio

    from sluice.protocols.core import Conn
    from sluice.protocols.pulsar import Type, command, decode_frame, encode
    from sluice.recording import writer
    from sluice.recording.writer import Recorder, RecorderConfig, ignore_file_size_signal

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    writer.RETRY_SECONDS = 0.1
    CONN = Conn(1, "127.0.0.1:1", "plain", "pulsar")
    PING = decode_frame(encode(command(Type.Value("PING"))))

    async def main() -> None:
        recorder = Recorder(RecorderConfig(Path(sys.argv[1]), flush_interval=0.02))
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
            recorder.frames(CONN, True, [PING])
            while not (recorder.files and recorder.files[0].stat().st_size > 0):
                await trio.sleep(0.01)  # the first file flushed
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (40, hard))  # the disk "fills"
            stop = time.monotonic() + 1.0
            while time.monotonic() < stop or recorder.failures_total == 0:
                recorder.frames(CONN, True, [PING])
                await trio.sleep(0.01)
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again
            dropped = recorder.dropped_total
            while recorder.frames_written < 5 + dropped or recorder._failing:
                recorder.frames(CONN, True, [PING])
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    ignore_file_size_signal()
    trio.run(main)
    """
)


def test_a_long_outage_is_said_once_and_leaves_no_file_without_a_record(tmp_path: Path) -> None:
    directory = tmp_path / "rec"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    failed = [n for n, line in enumerate(lines) if line.startswith("recording failed")]
    resumed = [n for n, line in enumerate(lines) if line.startswith("recording resumed")]
    assert len(failed) == 1 and len(resumed) == 1, done.stdout
    # Between the two, the tries are not said at the level the log is read at.
    assert not any(line.startswith("recording to") for line in lines[failed[0] : resumed[0]]), (
        done.stdout
    )
    files = recording_files(directory)
    assert len(files) == 2, [(f.name, f.stat().st_size) for f in files]  # before, after
    for path in files:
        assert next(iter(read_records(path)))["k"] == "header"  # each readable
