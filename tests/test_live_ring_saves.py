"""``sluice view --live``'s saves number their records as flight-recorder
snapshots do (``ring``), so that two saves of one view that hold the same
frames, read back together, count each frame once (in-process: no proxy)."""

from __future__ import annotations

import collections
import contextlib
import io
import json
from pathlib import Path
from typing import Any

from sluice.commands import main
from sluice.recording.format import PayloadPolicy, header, read_records
from sluice.recording.reader import load
from sluice.view.index import Filter, Index
from sluice.view.live import LiveIndex

PING = b"\x00\x00\x00\x08\x00\x00\x00\x04\x08\x12\x92\x01\x00"  # (not decoded here)


def _header(process: int = 1) -> dict[str, Any]:
    record = header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                    sluice_version="x", protocol="pulsar")  # fmt: skip
    return {**record, "process": process}


def _conn(c: int, t: int) -> dict[str, Any]:
    return {"k": "conn", "c": c, "t": t, "w": t, "client": f"10.0.0.1:{c}", "broker": "b:6650",
            "kind": "proxied", "listener": ""}  # fmt: skip


def _frame(c: int, t: int, cmd: str) -> dict[str, Any]:
    return {"k": "frame", "c": c, "d": 0 if cmd == "PING" else 1, "t": t, "w": t, "n": 13,
            "raw": PING, "s": {"cmd": cmd}}  # fmt: skip


def _frames_of(files: list[Path]) -> list[str]:
    return [r["s"]["cmd"] for f in files for r in read_records(f) if r["k"] == "frame"]


def _inspected(target: Path) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["inspect", str(target), "--json"]) == 0, err.getvalue()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    return [r["cmd"] for r in records if r["kind"] == "frame"]


def _viewed(target: Path) -> list[str]:
    index = Index(target)
    index.build()
    assert not index.error, index.error
    return [row["cmd"] for row in index.page(Filter(), 0, 1000)["rows"]]


def _loaded(target: Path) -> collections.Counter[str]:
    recording = load(target, need_payloads=False)
    return collections.Counter(f.summary["cmd"] for c in recording.connections for f in c.frames)


def test_two_overlapping_saves_read_back_count_each_frame_once(tmp_path: Path) -> None:
    index = LiveIndex("127.0.0.1:9")
    index.feed([_header(), _conn(1, 1), *(_frame(1, t, "PING") for t in range(2, 6))])
    first = index.save(tmp_path)
    index.feed([_frame(1, t, "PONG") for t in range(6, 8)])
    second = index.save(tmp_path)
    assert first != second
    files = sorted(tmp_path.glob("*/*.sluice"))
    assert len(files) == 2
    # Each reads whole on its own: 4, then 6 frames.
    assert sorted(len(_frames_of([f])) for f in files) == [4, 6]
    # Read back together, each frame once, in the order it came.
    want = ["PING"] * 4 + ["PONG"] * 2
    assert _inspected(tmp_path) == want
    assert _viewed(tmp_path) == want
    assert _loaded(tmp_path) == {"PING": 4, "PONG": 2}
    # One capture across the saves, numbered as a ring snapshot is.
    marks = [next(r for r in read_records(f) if r["k"] == "snapshot") for f in files]
    heads = [next(iter(read_records(f))) for f in files]
    assert len({h["capture"] for h in heads}) == 1
    assert sorted(m["ring"] for m in marks) == [0, 0]


def test_saves_after_frames_were_let_go_are_numbered_from_the_first_held(tmp_path: Path) -> None:
    """Past ``max_frames`` the oldest frames go: a later save starts further
    on in the numbers, and its records still line up with an earlier
    save's (the frames both hold are read once)."""
    index = LiveIndex("127.0.0.1:9", max_frames=8)
    index.feed([_header(), _conn(1, 1), *(_frame(1, t, "PING") for t in range(2, 8))])
    index.save(tmp_path)  # 6 PINGs, and the conn
    index.feed([_frame(1, t, "PONG") for t in range(8, 11)])  # 9 frames: the oldest 5 go
    assert index.let_go == 5
    index.save(tmp_path)  # the last PING, 3 PONGs
    files = sorted(tmp_path.glob("*/*.sluice"))
    assert sorted(_frames_of([f]) for f in files) == [["PING"] * 6, ["PING"] + ["PONG"] * 3]
    assert _inspected(tmp_path) == ["PING"] * 6 + ["PONG"] * 3
    assert _viewed(tmp_path) == ["PING"] * 6 + ["PONG"] * 3
    marks = sorted(next(r for r in read_records(f) if r["k"] == "snapshot")["ring"] for f in files)
    assert marks[0] == 0 and marks[1] > 0


def test_saves_of_two_proxy_processes_count_each_frame_once(tmp_path: Path) -> None:
    """After a restart the view holds two processes' records: a file each,
    a capture each, numbered each on its own."""
    index = LiveIndex("127.0.0.1:9")
    index.feed([_header(1), _conn(1, 1), _frame(1, 2, "PING")], cursor=str(1 << 40))
    index.save(tmp_path)
    index.feed([_header(2), _conn(1, 3), _frame(1, 4, "PONG")], cursor=str(2 << 40))
    index.save(tmp_path)
    index.feed([_frame(1, 5, "PONG")], cursor=str((2 << 40) + 5))
    index.save(tmp_path)
    files = sorted(tmp_path.glob("*/*.sluice"))
    assert len(files) == 5  # 1, then 2, then 2
    assert collections.Counter(_inspected(tmp_path)) == {"PING": 1, "PONG": 2}
    assert collections.Counter(_viewed(tmp_path)) == {"PING": 1, "PONG": 2}
    captures = {next(iter(read_records(f)))["capture"] for f in files}
    assert len(captures) == 2
