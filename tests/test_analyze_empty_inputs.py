"""``sluice analyze`` of inputs none of whose files holds a whole record
(every writer killed before its first flush) refuses them as inspect,
view and replay do ('DIR: all N files are empty, not a Sluice recording',
exit 2), before Spark is started: not a run that counts each file as a
truncated, bad segment. Spark is never reached: the job is replaced by one
that notes it was started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sluice.commands.analyze as command
from sluice.analyze.job import NoRecordings

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
SEGMENT = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The paths each Spark job would have been started on."""
    handed: list[list[str]] = []

    def job(paths: list[str], *_: Any) -> Any:
        handed.append(paths)
        raise NoRecordings(paths)

    monkeypatch.setattr(command, "analyze", job)
    return handed


def test_a_directory_of_empty_files_is_refused_before_spark(
    tmp_path: Path, started: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "rec"
    (capture / "snapshot-20260101T000000-1234").mkdir(parents=True)
    for name in ("a.sluice", "b.sluice", "snapshot-20260101T000000-1234/c.sluice"):
        (capture / name).write_bytes(b"")
    assert command.main([str(capture), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"sluice analyze: {capture}: all 3 files are empty, not a Sluice recording\n"
    assert started == []
    assert not (tmp_path / "out").exists()


def test_a_lone_empty_file_is_refused_as_inspect_refuses_it(
    tmp_path: Path, started: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "a.sluice"
    empty.write_bytes(b"")
    assert command.main([str(empty), "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err == f"sluice analyze: {empty}: empty file, not a Sluice recording\n"
    )
    assert started == []


def test_an_empty_file_beside_a_recording_is_analyzed(
    tmp_path: Path, started: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """One file that holds records is enough: the job starts (and says of
    the empty one what it says of any truncated segment)."""
    capture = tmp_path / "rec"
    capture.mkdir()
    (capture / SEGMENT.name).write_bytes(SEGMENT.read_bytes())
    (capture / "z.sluice").write_bytes(b"")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "y.sluice").write_bytes(b"")
    command.main([str(capture), str(empty), "--out", str(tmp_path / "out")])
    assert len(started) == 1
