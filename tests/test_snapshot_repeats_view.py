"""``sluice view`` of a directory holding flight-recorder snapshots that
cover the same seconds: every recorded frame once, not once per snapshot
that holds it, in the order recorded."""

from __future__ import annotations

from pathlib import Path

from sluice.view.index import Filter, Index
from tests.test_snapshot_repeats_inspect import (
    overlapping_snapshots,
    snapshots_listed_later_one_first,
)


def _built(target: Path) -> Index:
    index = Index(target)
    index.build()
    assert not index.error, index.error
    return index


def _commands(index: Index) -> list[str]:
    return [row["cmd"] for row in index.page(Filter(), 0, 100)["rows"]]


async def test_overlapping_snapshots_are_viewed_as_each_frame_once(tmp_path: Path) -> None:
    await overlapping_snapshots(tmp_path)
    index = _built(tmp_path)
    assert index.frames == 12
    assert _commands(index) == ["PING"] * 8 + ["PONG"] * 4
    assert len(index.connections) == 1
    assert index.summary()["frames"] == 12
    # Each frame's detail is read back from the file that held it first.
    assert [index.detail(i)["cmd"] for i in range(12)] == ["PING"] * 8 + ["PONG"] * 4


async def test_snapshots_of_one_second_are_viewed_in_the_order_taken(tmp_path: Path) -> None:
    await snapshots_listed_later_one_first(tmp_path)
    index = _built(tmp_path)
    assert _commands(index) == ["PING", "PING", "PONG"]
