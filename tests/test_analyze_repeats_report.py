"""The warning ``sluice analyze`` prints where Spark hands the executors the
files (``s3a://``, ``--remote``): records counted once for each of the
overlapping flight-recorder snapshots that hold them. It is in report.html
too, where the tables' numbers are read, not on the terminal alone."""

from __future__ import annotations

import html
from pathlib import Path

from sluice.analyze.report import write_report
from tests.test_analyze_report import _summary

SAID = "records are in more than one flight-recorder snapshot of one capture"


def _page(tmp_path: Path, **summary: object) -> str:
    page = tmp_path / "report.html"
    write_report({**_summary("t", "E", "SEND"), **summary}, page)
    return html.unescape(page.read_text(encoding="utf-8"))


def test_the_report_says_records_counted_in_more_than_one_snapshot(tmp_path: Path) -> None:
    text = _page(tmp_path, repeated_records=1234)
    assert f"1,234 {SAID}" in text
    assert "one snapshot directory at a time" in text


def test_the_report_says_nothing_of_repeats_where_there_are_none(tmp_path: Path) -> None:
    assert SAID not in _page(tmp_path, repeated_records=0)
    assert SAID not in _page(tmp_path)  # (a summary from before it was counted)


# Read by Spark, end to end: tests/test_snapshot_repeats_analyze.py.
