"""``sluice view --live``'s save: the capture it writes is kept from other
users as the recorder's captures are (in-process: no proxy)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sluice.recording.format import PayloadPolicy, header, read_records
from sluice.view.live import LiveIndex


def test_a_saved_capture_is_not_every_users(tmp_path: Path) -> None:
    """A save holds what the proxy showed (payloads under
    --record-payloads full, topics, clients' addresses); it was written
    with the umask's modes (world-readable under 022), where the recorder
    writes its files 0640 in directories 0750."""
    index = LiveIndex("127.0.0.1:9")
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
        {"k": "frame", "c": 1, "d": 0, "t": 5, "w": 0, "n": 6, "raw": b"secret",
         "s": {"cmd": "SEND", "topic": "t"}},
    ])  # fmt: skip
    was = os.umask(0o022)
    try:
        saved = index.save(tmp_path)
    finally:
        os.umask(was)
    files = list(saved.iterdir())
    assert len(files) == 1 and files[0].suffix == ".sluice", files
    assert stat.S_IMODE(saved.stat().st_mode) == 0o750
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o640
    kinds = [r["k"] for r in read_records(files[0])]
    assert kinds == ["header", "snapshot", "conn", "frame"], kinds
