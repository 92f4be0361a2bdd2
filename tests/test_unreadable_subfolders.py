"""A folder inside a capture directory that this user may not read, beside
readable segments: every reader refuses the capture in one line naming it
(exit 2), as it refuses an unreadable segment file, rather than reading
the rest as if it were the whole capture.

The suite runs as root, who may read anything: the listing is made to fail
as it does for another user, by the OS call os.walk lists with
(os.scandir) raising PermissionError for that one folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.recording.format import RecordingError, protocol_of, recording_files
from sluice.recording.reader import load
from sluice.recording.retention import Retention, enforce
from sluice.view.index import Index
from tests.helpers.cli import refuse, run_main

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
SEGMENT = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"


def _refuse(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    refuse(monkeypatch, "scandir", denied)


@pytest.fixture
def denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A capture directory with a readable segment, and a snapshot folder
    (holding one too) that cannot be read."""
    capture = tmp_path / "rec"
    snapshot = capture / "snapshot-20260101T000000-1234"
    snapshot.mkdir(parents=True)
    for where in (capture, snapshot):
        (where / SEGMENT.name).write_bytes(SEGMENT.read_bytes())
    _refuse(monkeypatch, snapshot)
    return snapshot


COMMANDS = {
    "inspect": ["inspect", "{target}"],
    "inspect --summary": ["inspect", "{target}", "--summary"],
    "inspect --pcap": ["inspect", "{target}", "--pcap", "{out}/x.pcapng"],
    "view --export": ["view", "{target}", "--export", "{out}/x.html"],
    "replay": ["replay", "{target}", "--broker", "pulsar://127.0.0.1:1"],
    "serve": ["serve", "{target}", "--listen", "127.0.0.1:0"],
    "record anonymize": ["record", "anonymize", "{target}", "{out}/anon"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_unreadable_folder_among_readable_segments_is_refused(
    denied: Path, tmp_path: Path, name: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = [a.format(target=denied.parent, out=out) for a in COMMANDS[name]]
    code, stdout, stderr = run_main(argv)
    command = " ".join(COMMANDS[name][:2]) if name == "record anonymize" else COMMANDS[name][0]
    assert code == 2, (stdout, stderr)
    assert (
        stderr.splitlines()[-1] == f"sluice {command}: {denied}: cannot be read (permission denied)"
    )
    assert "frames" not in stdout
    assert list(out.iterdir()) == []


def test_the_readers_say_it_too(denied: Path) -> None:
    expected = f"{denied}: cannot be read (permission denied)"
    for read in (recording_files, protocol_of, load):
        with pytest.raises(RecordingError) as raised:
            read(denied.parent)
        assert str(raised.value) == expected, read
    index = Index(denied.parent)
    index.build()
    assert index.error == expected


def test_retention_still_passes_over_it(denied: Path) -> None:
    """The proxy's retention pass, in the same directory, is no reader: it
    removes what it can see and passes over what it cannot (and cannot
    remove from anyway), without stopping the recorder."""
    enforce(denied.parent, Retention(max_bytes=1), headroom=0, now=time.time())
    assert not (denied.parent / SEGMENT.name).exists()
