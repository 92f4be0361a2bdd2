"""``sluice view --live`` after the proxy dropped records: an answer cut at
the batch limit names the connections open as of its last record, so the
view closes none that is still sending, and a save holds no frame after a
connection's close nor two closes for one connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.core import Closed
from sluice.proxy import live as live_module
from sluice.recording.format import read_records, recording_files
from sluice.view.index import Index
from sluice.view.live import LiveIndex
from tests.test_view_live import open_conn, restartable_proxy, send_on, unpack


def saved_records(index: LiveIndex, tmp_path: Path) -> list[dict[str, Any]]:
    """The records of a save of ``index`` (one proxy process), but its header."""
    saved = index.save(tmp_path)
    (path,) = recording_files(saved)
    return [r for r in read_records(path) if r["k"] != "header"]


def well_formed(records: list[dict[str, Any]]) -> None:
    """Each connection closed at most once, and nothing of it after its close."""
    closed: set[int] = set()
    for r in records:
        if "c" in r:
            assert r["c"] not in closed, (r, records)
            if r["k"] == "close":
                closed.add(r["c"])


def test_an_answer_cut_by_the_batch_closes_nothing_still_sending(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The ring dropped records and holds more than one answer takes (an
    answer a record, as 2 MiB of a full 8 MiB ring): the connection that
    sends on and closes in the part not yet read stays open in the view
    until its own close comes, and ends once, after its frames."""
    index = LiveIndex("127.0.0.1:9")
    taps, tap = restartable_proxy()
    conn = open_conn(taps, 1, "10.0.0.1:5001")
    taken = tap.take(None)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    monkeypatch.setattr(live_module, "MAX_RECORDS", 6)
    monkeypatch.setattr(live_module, "BATCH_BYTES", 1)
    for _ in range(8):
        send_on(tap, 1, "t")  # 3 of them lost
    taps.event(conn, Closed("client closed"))
    shown = []
    while taken.next < tap.newest:
        taken = tap.take(taken.next)
        index.feed(unpack(taken), taken.dropped, str(taken.next))
        shown.append(index.connections[0].closed)
    assert shown == [""] * 5 + ["client closed"], shown
    records = saved_records(index, tmp_path)
    assert [(r["k"], r.get("reason")) for r in records if r["k"] != "snapshot"] == [
        ("conn", None), *[("frame", None)] * 5, ("close", "client closed")]  # fmt: skip
    well_formed(records)


def test_connections_opened_or_closed_past_a_cut_answer_end_right(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """After a drop, answers cut at the batch limit: a held connection that
    closed in the dropped records is closed unseen (once); one that closes
    past the first answer ends with its own close (once); one opened past
    the first answer is read as opened, with its frames, and stays open.
    The page and a save (read again) agree."""
    index = LiveIndex("127.0.0.1:9")
    taps, tap = restartable_proxy()
    gone, spills = open_conn(taps, 1, "10.0.0.1:5001"), open_conn(taps, 2, "10.0.0.2:5002")
    taken = tap.take(None)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    monkeypatch.setattr(live_module, "MAX_RECORDS", 8)
    monkeypatch.setattr(live_module, "BATCH_BYTES", 1)
    taps.event(gone, Closed("client closed"))  # lost: the ring keeps the 8 after it
    for _ in range(4):
        send_on(tap, 2, "spills")  # the first answer ends at the first of these
    open_conn(taps, 3, "10.0.0.3:5003")  # opened in what the first answer leaves
    send_on(tap, 3, "later")
    taps.event(spills, Closed("broker closed"))
    send_on(tap, 3, "later")
    taken = tap.take(taken.next)
    assert taken.dropped and len(taken.records) == 2  # (the header, one record)
    index.feed(unpack(taken), taken.dropped, str(taken.next))
    assert [(c.conn, c.closed) for c in index.connections] == [
        (1, "closed while this view was not told"), (2, "")]  # fmt: skip
    while taken.next < tap.newest:
        taken = tap.take(taken.next)
        index.feed(unpack(taken), taken.dropped, str(taken.next))
    ended = [(c.conn, c.client, c.closed) for c in index.connections]
    assert ended == [(1, "10.0.0.1:5001", "closed while this view was not told"),
                     (2, "10.0.0.2:5002", "broker closed"),
                     (3, "10.0.0.3:5003", "")], ended  # fmt: skip
    records = saved_records(index, tmp_path)
    well_formed(records)
    closes = [(r["c"], r["reason"]) for r in records if r["k"] == "close"]
    assert closes == [(1, "closed while this view was not told"), (2, "broker closed")], closes
    again = Index(index.save(tmp_path))
    again.build()
    assert [(c.client, c.closed) for c in again.connections] == [
        (client, closed) for _, client, closed in ended]  # fmt: skip
