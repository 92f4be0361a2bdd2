"""``sluice analyze`` of an input this user may not read says so, as the
other readers say it ('<path>: cannot be read (permission denied)', exit
2), before Spark is started: not 'no such file or directory', and not a
Spark run over what could be listed.

The suite runs as root, who may read anything: the OS call that lists a
folder (os.scandir) or looks at a path (os.stat) is made to raise
PermissionError for one path, as for another user. Spark is never
reached: the job is replaced by one that notes it was started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sluice.commands.analyze as command
from sluice.analyze.job import NoRecordings
from tests.helpers.cli import refuse

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
SEGMENT = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"


def _refuse(monkeypatch: pytest.MonkeyPatch, name: str, denied: Path) -> None:
    refuse(monkeypatch, name, denied)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The paths each Spark job would have been started on."""
    handed: list[list[str]] = []

    def job(paths: list[str], *_: Any) -> Any:
        handed.append(paths)
        raise NoRecordings(paths)

    monkeypatch.setattr(command, "analyze", job)
    return handed


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """A capture directory: a segment, and a snapshot folder with another."""
    capture = tmp_path / "rec"
    snapshot = capture / "snapshot-20260101T000000-1234"
    snapshot.mkdir(parents=True)
    for where in (capture, snapshot):
        (where / SEGMENT.name).write_bytes(SEGMENT.read_bytes())
    return capture


@pytest.mark.parametrize("where", ["the input directory", "a folder in it"])
def test_an_input_directory_that_cannot_be_read_is_said_so(
    capture: Path,
    tmp_path: Path,
    where: str,
    started: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    denied = capture if where == "the input directory" else next(capture.glob("snapshot-*"))
    _refuse(monkeypatch, "scandir", denied)
    assert command.main([str(capture), "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err == f"sluice analyze: {denied}: cannot be read (permission denied)\n"
    )
    assert started == []
    assert not (tmp_path / "out").exists()


def test_a_path_inside_a_directory_that_cannot_be_entered_is_said_so(
    capture: Path,
    tmp_path: Path,
    started: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inside = capture / "sub"
    _refuse(monkeypatch, "stat", inside)
    assert command.main([str(inside), "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err == f"sluice analyze: {inside}: cannot be read (permission denied)\n"
    )
    assert started == []


def test_a_readable_input_still_goes_to_spark(
    capture: Path, tmp_path: Path, started: list[list[str]]
) -> None:
    assert command.main([str(capture), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert started == [[str(capture)]]
