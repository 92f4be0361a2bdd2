"""A recording directory this user may not read is said to be unreadable
(permission denied, with its path), not found to hold no recordings.

The suite runs as root, who may read anything: the listing is made to fail
as it does for another user, by the OS call the reader lists with
(os.scandir, which os.walk calls) raising PermissionError for that path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.recording.format import RecordingError
from sluice.recording.reader import load
from sluice.view.index import Index
from tests.helpers.cli import refuse, run_main

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SEGMENT = GOLDEN / "sluice-20261128T172608-f2b453b65503-0001.sluice"


def _refuse(monkeypatch: pytest.MonkeyPatch, name: str, denied: Path) -> None:
    refuse(monkeypatch, name, denied)


def _run(argv: list[str]) -> tuple[int, str]:
    code, _, err = run_main(argv)
    return code, err


COMMANDS = {
    "inspect": ["inspect", "{target}"],
    "inspect --pcap": ["inspect", "{target}", "--pcap", "{out}/x.pcapng"],
    "view --export": ["view", "{target}", "--export", "{out}/x.html"],
}


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """A directory holding a snapshot directory holding a segment."""
    snapshot = tmp_path / "rec" / "snapshot-20260101T000000-1234"
    snapshot.mkdir(parents=True)
    (snapshot / SEGMENT.name).write_bytes(SEGMENT.read_bytes())
    return tmp_path / "rec"


@pytest.mark.parametrize("where", ["the directory", "a directory in it"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_directory_that_cannot_be_listed_is_said_so(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, where: str
) -> None:
    denied = capture if where == "the directory" else next(capture.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    _refuse(monkeypatch, "scandir", denied)
    code, err = _run([a.format(target=capture, out=out) for a in COMMANDS[name]])
    command = COMMANDS[name][0]
    assert code == 2, err
    assert err.splitlines() == [f"sluice {command}: {denied}: cannot be read (permission denied)"]
    assert list(out.iterdir()) == []


def test_replay_and_the_view_index_say_it_too(
    capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse(monkeypatch, "scandir", capture)
    with pytest.raises(RecordingError) as raised:
        load(capture)
    assert str(raised.value) == f"{capture}: cannot be read (permission denied)"
    index = Index(capture)
    index.build()
    assert index.error == f"{capture}: cannot be read (permission denied)"


def test_a_path_inside_a_directory_that_cannot_be_entered_is_said_so(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the right to search its directory, a path cannot even be
    looked at: not "no such file", not a traceback."""
    inside = capture / "sub"
    _refuse(monkeypatch, "stat", inside)
    code, err = _run(["inspect", str(inside)])
    assert code == 2
    assert err.splitlines() == [f"sluice inspect: {inside}: cannot be read (permission denied)"]


def test_a_readable_empty_directory_still_holds_no_recordings(tmp_path: Path) -> None:
    code, err = _run(["inspect", str(tmp_path)])
    assert code == 2 and err.strip() == f"sluice inspect: no recordings (*.sluice) in {tmp_path}"
