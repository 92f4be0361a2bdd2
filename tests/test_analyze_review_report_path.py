"""`sluice analyze --report FILE`: never one of the recordings being read.

The report's path was checked against the first PATH only: with several,
``--report`` naming a recording of another one (or a ``*.sluice`` in a
folder given second) was written over after the analysis, the recording
lost. Every local PATH is checked, before Spark starts."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sluice.commands.analyze import report_problem
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
FIRST = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"
SECOND = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0002.sluice"


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A folder with one recording, and a second recording beside it."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(FIRST, folder / FIRST.name)
    second = tmp_path / SECOND.name
    shutil.copy(SECOND, second)
    return folder, second


def test_a_report_over_any_recording_read_is_refused(tmp_path: Path) -> None:
    folder, second = inputs(tmp_path)
    for paths, report in (
        ([str(folder), str(second)], second),
        ([str(second), str(folder)], folder / FIRST.name),
        ([str(second), str(folder)], folder / "new.sluice"),
        ([str(folder), f"file://{second}"], second),
    ):
        problem = report_problem(str(report), paths)
        assert problem == f"--report {report}: that is the recording being read", paths


def test_a_report_elsewhere_is_taken(tmp_path: Path) -> None:
    folder, second = inputs(tmp_path)
    assert report_problem(str(tmp_path / "report.html"), [str(folder), str(second)]) is None
    assert report_problem(str(tmp_path / "r.html"), [str(folder), "s3a://b/k"]) is None


@pytest.mark.e2e
def test_the_second_recording_is_not_written_over(tmp_path: Path) -> None:
    folder, second = inputs(tmp_path)
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(folder), str(second), "--out", str(tmp_path / "out"),
         "--report", str(second), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert second.read_bytes() == SECOND.read_bytes()
    assert result.stderr == f"sluice analyze: --report {second}: that is the recording being read\n"
    assert result.returncode == 2
    assert time.monotonic() - started < 10  # no Spark started
