"""``sluice analyze`` of many flight-recorder snapshots of one capture (local
files, read by the executors): each snapshot passes over what the earlier
ones held, and the earlier ones are read once each, not once for every
later snapshot (N snapshots were N²/2 reads). In-process: the executor's
decoder, no Spark."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import trio

from sluice.analyze import decode
from tests.test_snapshot_repeats_inspect import PING, PONG, _recorder

SNAPSHOTS = 6


async def _growing_snapshots(directory: Path) -> list[Path]:
    """Six whole-ring snapshots of one recorder, two more frames each time:
    2, 4, … 12 frames in the files, 12 recorded."""
    recorder, conn = _recorder(directory)
    files = []
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for n in range(SNAPSHOTS):
            recorder.frames(conn, n % 2 == 0, [PING if n % 2 == 0 else PONG] * 2)
            await trio.sleep(0.05)
            files.append((await recorder.snapshot(name=f"s{n}")).file)
        nursery.cancel_scope.cancel()
    return files


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The recording files opened from here on, one entry each time."""
    seen: list[str] = []
    real = builtins.open

    def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".sluice"):
            seen.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return seen


def _decoded(listed: list[str], order: list[str]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Each file of ``order`` decoded as an executor does: (file, its
    frames, its segment row's extra)."""
    contents = {p: Path(decode.local_path(p) or p).read_bytes() for p in order}
    decode.read_among(listed)
    for path in order:
        frames = 0
        segment: dict[str, Any] = {}
        for batch in decode.decode_segment(path, contents[path]):
            rows = pa.Table.from_batches([batch]).to_pylist()
            frames += sum(r["record"] == "frame" for r in rows)
            segment.update(*(json.loads(r["extra"]) for r in rows if r["record"] == "segment"))
        yield path, frames, segment


@pytest.mark.parametrize("backwards", [False, True], ids=["in order", "backwards"])
async def test_n_snapshots_are_read_n_times_not_n_squared(
    tmp_path: Path, opened: list[str], backwards: bool
) -> None:
    files = await _growing_snapshots(tmp_path)
    listed = [f"file:{f}" for f in sorted(files)]
    order = listed[::-1] if backwards else listed
    opened.clear()
    results = {path: (frames, segment) for path, frames, segment in _decoded(listed, order)}
    # Each frame once: 2 new ones in each snapshot, the others passed over.
    in_taken_order = [results[f"file:{f}"] for f in files]
    assert [frames for frames, _ in in_taken_order] == [2] * SNAPSHOTS
    assert sum(frames for frames, _ in in_taken_order) == 12
    # (records: the connection's, then 2 frames more each time)
    repeated = [s["repeated"] for _, s in in_taken_order]
    assert repeated == [0, *(2 * n + 1 for n in range(1, SNAPSHOTS))]
    # Each file opened a bounded number of times (its order's head, the
    # runs the later ones need), whatever the number of snapshots: linear.
    assert len(opened) <= 2 * SNAPSHOTS, sorted(opened)
    assert max(opened.count(str(f)) for f in files) <= 2


async def test_another_listing_is_not_answered_from_the_last(tmp_path: Path) -> None:
    """A worker that decodes for another job (another listing) reads that
    listing's files afresh: the first two snapshots alone, then all."""
    files = await _growing_snapshots(tmp_path)
    listed = [f"file:{f}" for f in sorted(files)]
    two = [f"file:{f}" for f in sorted(files[:2])]
    assert [frames for _, frames, _ in _decoded(two, two)] == [2, 2]
    assert sum(frames for _, frames, _ in _decoded(listed, listed)) == 12
    # The last one alone: every frame it holds.
    assert [frames for _, frames, _ in _decoded(listed[-1:], listed[-1:])] == [12]
