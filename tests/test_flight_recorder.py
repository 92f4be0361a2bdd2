"""The flight recorder: bounded recording directories, the in-memory ring,
snapshots on demand and on triggers, with the real client and broker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

from sluice.embedded import EmbeddedBroker, free_port
from sluice.recording.format import recording_files
from sluice.recording.retention import Retention, enforce, hold
from tests.support import SLUICE, client, start_proxy
from tests.test_dashboards import scrape, value

MiB = 1024 * 1024


def directory_size(directory: Path) -> int:
    total = 0
    for path in recording_files(directory) if directory.exists() else []:
        with contextlib.suppress(FileNotFoundError):  # removed since the listing
            total += path.stat().st_size
    return total


class SizeWatch:
    """The largest size a directory had, sampled every 10 ms in a thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.largest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.largest = max(self.largest, directory_size(self.directory))
            time.sleep(0.01)

    def __enter__(self) -> SizeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_the_directory_stays_under_its_cap_through_ten_times_the_traffic(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    cap = 2 * MiB
    record, admin = tmp_path / "rec", free_port()
    proxy = start_proxy(broker.url, tmp_path, "--record", str(record), "--record-payloads",
                        "full", "--record-retain-bytes", str(cap), "--record-flush-interval",
                        "0.1", "--admin", f"127.0.0.1:{admin}")  # fmt: skip
    payload = b"x" * 10_000
    try:
        with SizeWatch(record) as watch, client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for _ in range(10 * cap // len(payload)):  # SEND frames alone: 10x the cap
                producer.send(payload)
        samples = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    print(f"largest {watch.largest} of {cap} bytes")
    assert 0 < watch.largest <= cap
    assert directory_size(record) <= cap
    assert value(samples, "sluice_recorder_removed_files_total") >= 5
    assert value(samples, "sluice_recorder_removed_bytes_total") >= 8 * MiB
    # What is left reads as a recording that starts later, never an error.
    shown = subprocess.run([*SLUICE, "inspect", str(record), "--summary"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "SEND" in shown.stdout


def test_retention_by_age_and_files_being_written_are_kept(tmp_path: Path) -> None:
    (tmp_path / "snapshot-1").mkdir()
    old = [tmp_path / "a.sluice", tmp_path / "snapshot-1" / "b.sluice"]
    for path in old:
        path.write_bytes(b"x" * 100)
    now = time.time()
    for path in old:
        os.utime(path, (now - 600, now - 600))
    held = tmp_path / "c.sluice"
    held.write_bytes(b"y" * 100)
    os.utime(held, (now - 600, now - 600))
    fresh = tmp_path / "d.sluice"
    fresh.write_bytes(b"z" * 100)
    with open(held, "ab") as writer:
        hold(writer.fileno())
        removed = enforce(tmp_path, Retention(max_age=60), headroom=0, now=now)
    assert (removed.files, removed.bytes) == (2, 200)
    assert not (tmp_path / "snapshot-1").exists()  # emptied, so removed
    assert held.exists() and fresh.exists()
    # By size: the oldest go first, and never the file given as "keep".
    removed = enforce(tmp_path, Retention(max_bytes=150), headroom=0, now=now, keep=held)
    assert not fresh.exists() and held.exists() and removed.files == 1
