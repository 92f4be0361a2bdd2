"""Review: captures made by someone else, shaped to break the readers. A
record whose fields readers rely on are of the wrong shape must be said as
damage (one line, exit 2), not met as a traceback in whichever command
reads it (``sluice inspect``, ``replay`` and ``serve`` through ``load``)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main
from sluice.recording.format import PayloadPolicy, RecordingError, dumps, header, read_records
from sluice.recording.reader import load

HEADER = header(capture="c0ffee", segment=1, started_ns=1, payloads=PayloadPolicy.FULL,
                sluice_version="test")  # fmt: skip
CONN = {"k": "conn", "c": 1, "t": 1, "w": 1, "client": "127.0.0.1:1",
        "broker": "127.0.0.1:2", "kind": "proxied", "listener": "l"}  # fmt: skip


def _filter(**extra: Any) -> dict[str, Any]:
    return {"k": "filter", "c": 1, "d": 0, "t": 2, "w": 2, "filter": "f",
            "action": "replaced", "n": 1, **extra}  # fmt: skip


def _capture(tmp_path: Path, record: dict[str, Any]) -> Path:
    path = tmp_path / "hostile.sluice"
    path.write_bytes(dumps([HEADER, CONN, record]))
    return path


def _inspect(path: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(["inspect", str(path)])
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


HOSTILE_FILTERS = {
    "sent an int": _filter(sent=5),
    "sent a string": _filter(sent="x"),
    "sent without n": _filter(sent={"raw": b"x"}),
    "sent raw a number": _filter(sent={"n": 1, "raw": 50_000_000}),
    "sent raw text": _filter(sent={"n": 1, "raw": "abc"}),
    "reason a map": _filter(reason={"a": 1}),
}


@pytest.mark.parametrize("name", HOSTILE_FILTERS)
def test_a_filter_record_of_the_wrong_shape_is_damage(tmp_path: Path, name: str) -> None:
    path = _capture(tmp_path, HOSTILE_FILTERS[name])
    with pytest.raises(RecordingError, match="damaged after 2 records"):
        list(read_records(path))
    with pytest.raises(RecordingError, match="damaged"):
        load(path)
    code, err = _inspect(path)
    assert (code, "Traceback" in err) == (2, False), err


def _frame(**extra: Any) -> dict[str, Any]:
    return {"k": "frame", "c": 1, "d": 0, "t": 2, "w": 2, "n": 0, "raw": b"",
            "s": {"cmd": "SEND"}, **extra}  # fmt: skip


@pytest.mark.parametrize("payload", [{}, {"size": "x"}], ids=["no size", "size text"])
def test_a_summary_payload_without_its_size_is_damage(tmp_path: Path, payload: Any) -> None:
    path = _capture(tmp_path, _frame(s={"cmd": "SEND", "payload": payload}))
    with pytest.raises(RecordingError, match="damaged after 2 records"):
        list(read_records(path))
    code, err = _inspect(path)
    assert (code, "Traceback" in err) == (2, False), err


def test_a_frame_without_its_bytes_is_damage_to_replay(tmp_path: Path) -> None:
    record = _frame()
    del record["raw"]
    with pytest.raises(RecordingError, match="damaged"):
        load(_capture(tmp_path, record))
