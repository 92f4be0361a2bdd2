"""``sluice view --live``: what the view holds is bounded in bytes as well
as in frames, in-process (no proxy, no browser): a proxy under
``--record-payloads full`` sends whole payloads."""

from __future__ import annotations

from typing import Any

from sluice.recording.format import PayloadPolicy, header
from sluice.view.index import Filter
from sluice.view.live import LiveIndex

MIB = 1024 * 1024


def big_frame(n: int, size: int) -> dict[str, Any]:
    """Frame ``n``: a SEND of ``size`` bytes, kept whole (as under
    ``--record-payloads full``), on topic ``t<n>``."""
    return {"k": "frame", "c": 1, "d": 0, "t": n * 1000, "w": 0, "n": size,
            "raw": bytes([n % 256]) * size,
            "s": {"cmd": "SEND", "topic": f"t{n}", "pid": 0, "seq": n}}  # fmt: skip


def test_a_live_view_of_large_messages_holds_a_bounded_number_of_bytes() -> None:
    """Frames of 256 KiB, far fewer than the frame bound: the view lets the
    oldest go once the records it holds pass its byte bound, keeps the
    newest whole (ids, rows and detail), and says how many it let go."""
    index = LiveIndex("127.0.0.1:9", max_frames=10_000, max_bytes=4 * MIB)
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
    ])  # fmt: skip
    size = 256 * 1024
    for n in range(1, 101):  # 25 MiB in all, 4 frames an answer
        if n % 4 == 0:
            index.feed([big_frame(m, size) for m in range(n - 3, n + 1)])
    held = sum(len(r) for r in index._records)
    assert held <= 4 * MIB + size, held
    assert index.held_bytes == held
    assert 0 < index.frames < 100 and index.let_go == 100 - index.frames
    rows = index.page(Filter(), 0, 1000)["rows"]
    assert [r["topic"] for r in rows] == [f"t{n}" for n in range(101 - index.frames, 101)]
    newest = index.detail(rows[-1]["i"])
    assert newest["topic"] == "t100" and newest["raw_size"] == size
    assert newest["raw_hex"].startswith("64 64")  # frame 100's own bytes
    status = index.status()
    assert status["let_go"] == index.let_go and status["max_mib"] == 4


def test_one_frame_larger_than_the_bound_is_still_shown() -> None:
    """A single frame over the whole byte bound: the view keeps the newest
    frame (and lets every older one go) rather than holding nothing."""
    index = LiveIndex("127.0.0.1:9", max_frames=10_000, max_bytes=1 * MIB)
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
        big_frame(1, 1000),
    ])  # fmt: skip
    index.feed([big_frame(2, 2 * MIB)])
    rows = index.page(Filter(), 0, 10)["rows"]
    assert [r["topic"] for r in rows] == ["t2"] and index.let_go == 1
    assert index.detail(rows[0]["i"])["raw_size"] == 2 * MIB
