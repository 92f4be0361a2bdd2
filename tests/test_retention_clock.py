"""Retention after the wall clock was set back: a capture's files go in the
order their writer wrote them (their segment numbers), not in that of their
last-write times, which the step made lie."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sluice.recording.retention import Retention, enforce

CAPTURE = "0123456789ab"


def _segments(directory: Path, mtimes: list[float], capture: str = CAPTURE) -> list[Path]:
    paths = []
    for number, mtime in enumerate(mtimes, 1):
        path = directory / f"sluice-20261201T000000-{capture}-{number:04d}.sluice"
        path.write_bytes(b"x" * 100)
        os.utime(path, (mtime, mtime))
        paths.append(path)
    return paths


def test_under_a_size_bound_a_captures_oldest_segment_goes_first(tmp_path: Path) -> None:
    now = time.time()
    # Segment 1 was written before the clock went back an hour; 2 and 3 since.
    first, second, third = _segments(tmp_path, [now + 3600, now - 20, now - 10])
    removed = enforce(tmp_path, Retention(max_bytes=200), headroom=0, now=now)
    assert removed.files == 1 and not first.exists()
    assert second.exists() and third.exists()


def test_under_an_age_bound_a_segment_dated_ahead_goes_with_the_older(tmp_path: Path) -> None:
    now = time.time()
    first, _, third = _segments(tmp_path, [now + 3600, now - 100, now - 10])
    enforce(tmp_path, Retention(max_age=60), headroom=0, now=now)
    assert not first.exists() and third.exists()


def test_other_captures_and_files_keep_their_last_write_order(tmp_path: Path) -> None:
    now = time.time()
    ours = _segments(tmp_path, [now - 50, now - 40])
    theirs = _segments(tmp_path, [now - 45], capture="ba9876543210")
    other = tmp_path / "notes.sluice"  # not a segment's name: by its last write
    other.write_bytes(b"x" * 100)
    os.utime(other, (now - 60, now - 60))
    enforce(tmp_path, Retention(max_bytes=200), headroom=0, now=now)
    assert not other.exists() and not ours[0].exists() and theirs[0].exists() and ours[1].exists()
