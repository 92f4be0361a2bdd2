"""``sluice analyze``'s decoder (``decode_segment``), in-process: no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from sluice.analyze.decode import parse_file

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"


def _segment_row(content: bytes) -> dict[str, Any]:
    rows = [values for tag, values in parse_file("/r/x.sluice", content) if tag == "S"]
    assert len(rows) == 1
    extra: dict[str, Any] = rows[0][4]
    return extra


def _recording() -> bytes:
    return sorted(INPUTS.glob("sluice-*.sluice"))[0].read_bytes()


def test_dropped_frames_that_do_not_fit_a_bigint_are_damage() -> None:
    """Two gap records near 2**63 summed past what the files table's bigint
    ``dropped_frames`` holds (Spark reads such a number as null, or fails
    the cast); a negative count said frames were un-dropped. Both are a
    damaged record now, the count kept to what came before it."""
    gap = {"k": "gap", "t": 1, "w": 1, "dropped": 2**63 - 1}
    huge = _segment_row(_recording() + msgpack.packb(gap) + msgpack.packb(gap))
    assert huge["damaged"] is True
    assert "'dropped' out of range" in huge["why"]
    assert huge["dropped_frames"] == 2**63 - 1
    negative = _segment_row(_recording() + msgpack.packb({**gap, "dropped": -3}))
    assert negative["damaged"] is True and negative["dropped_frames"] == 0


def test_dropped_frames_are_summed() -> None:
    gap = {"k": "gap", "t": 1, "w": 1, "dropped": 5}
    row = _segment_row(_recording() + msgpack.packb(gap) + msgpack.packb(gap))
    assert row["damaged"] is False and row["dropped_frames"] == 10
