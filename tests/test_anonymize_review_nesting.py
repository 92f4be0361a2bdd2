"""``sluice record anonymize`` of a capture holding a record whose value
nests deeper than Python recurses (msgpack allows 1,024 levels): one line,
never a traceback."""

from __future__ import annotations

from pathlib import Path

from sluice.recording import format as recording
from tests.helpers.cli import run_main
from tests.test_analyze import SMALL


def test_a_value_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    records = list(recording.read_records(SMALL))
    deep: list[object] = []
    for _ in range(900):
        deep = [deep]
    capture = tmp_path / "in"
    capture.mkdir()
    (capture / SMALL.name).write_bytes(
        recording.dumps([*records[:3], {"k": "later-kind", "t": records[2]["t"], "v": deep}])
    )
    code, _, err = run_main(["record", "anonymize", str(capture), str(tmp_path / "out")])
    assert "Traceback" not in err, err[-2000:]
    assert code != 0, err
    assert err.count("\n") == 1 and "nested more than 100 deep" in err, err
