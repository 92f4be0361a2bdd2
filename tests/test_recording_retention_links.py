"""Retention (--record-retain-bytes) and what is not a recording file of its
own in the directory: links and other non-regular files named *.sluice."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sluice.recording.retention import Removed, Retention, enforce


def test_a_link_to_a_large_file_elsewhere_costs_no_recording(tmp_path: Path) -> None:
    """A symlink named like a recording, pointing at a large file outside
    the directory, takes no space in it: retention must not count the
    target's size and remove real recordings to make room for it, nor touch
    the target."""
    rec = tmp_path / "rec"
    rec.mkdir()
    now = time.time()
    kept = []
    for n in range(3):
        path = rec / f"sluice-2030010{n}T000000-aaaaaaaaaaaa-000{n + 1}.sluice"
        path.write_bytes(b"x" * 10_000)
        os.utime(path, (now - 100 + n, now - 100 + n))
        kept.append(path)
    outside = tmp_path / "large"
    outside.write_bytes(b"y" * 1_000_000)
    (rec / "link.sluice").symlink_to(outside)
    removed = enforce(rec, Retention(max_bytes=100_000), headroom=0, now=now)
    assert removed.files == 0
    assert all(path.exists() for path in kept)
    assert outside.stat().st_size == 1_000_000


def test_a_fifo_named_like_a_recording_does_not_hang_a_pass(tmp_path: Path) -> None:
    """A pass that opened a FIFO to test its lock would wait for a writer
    forever, and the recorder with it (every frame dropped from then on)."""
    rec = tmp_path / "rec"
    rec.mkdir()
    now = time.time()
    pipe = rec / "pipe.sluice"
    os.mkfifo(pipe)
    os.utime(pipe, (now - 100, now - 100))  # the oldest: a pass comes to it first
    old = rec / "sluice-20300101T000000-aaaaaaaaaaaa-0001.sluice"
    old.write_bytes(b"x" * 200_000)
    os.utime(old, (now - 50, now - 50))
    done: list[Removed] = []
    passing = threading.Thread(
        target=lambda: done.append(enforce(rec, Retention(max_bytes=100_000), headroom=0, now=now)),
        daemon=True,
    )
    passing.start()
    passing.join(5)
    if passing.is_alive():  # let it go: a writer opens the FIFO
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        passing.join(5)
    assert done and done[0].files == 1 and not old.exists()
    assert pipe.exists()
