"""``sluice analyze`` of a directory holding flight-recorder snapshots that
cover the same seconds: every recorded frame counted once, not once per
snapshot that holds it (where the executors read the files themselves), or
said in one line where they cannot tell (Spark hands them the contents)."""

from __future__ import annotations

import collections
import html
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.test_analyze import analyze, rows_of
from tests.test_snapshot_repeats_inspect import overlapping_snapshots

pytestmark = pytest.mark.e2e  # (a Spark job, as a user runs it)

WARNING = "sluice analyze: warning:"
SAID = "records are in more than one flight-recorder snapshot of one capture"


async def test_overlapping_snapshots_are_analyzed_as_each_frame_once(tmp_path: Path) -> None:
    await overlapping_snapshots(tmp_path / "rec")
    result = analyze(str(tmp_path / "rec"), tmp_path / "out", "local[2]")
    frames = rows_of(tmp_path / "out" / "frames")
    assert collections.Counter(f["command"] for f in frames) == {"PING": 8, "PONG": 4}
    (connection,) = rows_of(tmp_path / "out" / "connections")
    assert connection["frames"] == 12
    assert len(rows_of(tmp_path / "out" / "files")) == 4
    assert WARNING not in result.stderr


@pytest.fixture(scope="module")
def read_by_spark(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The overlapping snapshots analysed where Spark hands the executors
    the files' contents (object stores, Spark Connect; here forced)."""
    tmp = tmp_path_factory.mktemp("read-by-spark")
    trio.run(overlapping_snapshots, tmp / "rec")
    result = analyze(str(tmp / "rec"), tmp / "out", "local[2]", env={"SLUICE_ANALYZE_IO": "spark"})
    return {"stderr": result.stderr, "out": tmp / "out"}


def test_overlapping_snapshots_read_by_spark_are_said_counted_twice(
    read_by_spark: dict[str, Any],
) -> None:
    """Each file is read whole: the records that an earlier snapshot of the
    capture held are counted again, and said so, in one line."""
    assert len(rows_of(read_by_spark["out"] / "frames")) == 36  # 8 + 12 + 4 + 12
    said = [line for line in read_by_spark["stderr"].splitlines() if line.startswith(WARNING)]
    # B repeats A's connection and 8 PINGs, C B's 4 PONGs, D all 13 of B's.
    assert len(said) == 1 and " 26 records are in more than one " in said[0], said


def test_snapshots_read_by_spark_say_their_repeats_in_the_report(
    read_by_spark: dict[str, Any],
) -> None:
    """Where the tables' numbers are read, not on the terminal alone."""
    report = html.unescape((read_by_spark["out"] / "report.html").read_text(encoding="utf-8"))
    assert f"26 {SAID}" in report


async def test_one_snapshot_is_analyzed_whole_without_a_warning(tmp_path: Path) -> None:
    files = await overlapping_snapshots(tmp_path / "rec")
    result = analyze(str(files[3].parent), tmp_path / "out", "local[2]",
                     env={"SLUICE_ANALYZE_IO": "spark"})  # fmt: skip
    assert len(rows_of(tmp_path / "out" / "frames")) == 12
    assert WARNING not in result.stderr
