"""``sluice inspect`` over records whose optional parts are damaged: shown
as far as they go, never a traceback."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main
from sluice.recording import format as fmt

T0 = 10**18
HTTP = {"k": "http", "h": 1, "x": 1, "t": 0, "w": T0, "te": 5_000_000, "status": 200,
        "client": "127.0.0.1:5", "method": "GET", "path": "/admin/v2/clusters",
        "kind": "admin"}  # fmt: skip


@pytest.mark.parametrize(
    "record",
    [
        HTTP,  # no req, no res
        {**HTTP, "req": "not a map", "res": {"h": [["a"], 7], "n": 3, "raw": "text"}},
        {"k": "snapshot", "t": 0, "w": T0, "seconds": "sixty", "reason": "r"},
        {"k": "trigger", "c": 1, "t": 0, "w": T0},
    ],
)
@pytest.mark.parametrize("mode", [[], ["--json", "--with-bytes"], ["--summary"]])
def test_a_damaged_annotation_is_shown_not_a_traceback(
    tmp_path: Path, record: dict[str, Any], mode: list[str]
) -> None:
    head = fmt.header(capture="abc", segment=1, started_ns=T0, payloads=fmt.PayloadPolicy.FULL,
                      sluice_version="t")  # fmt: skip
    path = tmp_path / "r.sluice"
    path.write_bytes(fmt.dumps([head, record]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(path), *mode]) == 0
    if not mode and record["k"] == "http":
        assert "GET /admin/v2/clusters → 200 admin  5.0 ms  req ?B" in out.getvalue()
