"""`sluice replay` of a Cursus capture with no client frame, as Pulsar's:
a usage error (exit 2, said in one line), not "equivalent" without ever
reaching --broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main
from sluice.recording import format as fmt

NOWHERE = "cursus://127.0.0.1:1"


def _write(directory: Path, records: list[dict[str, Any]]) -> Path:
    head = fmt.header(capture="0123456789ab", segment=1, started_ns=time.time_ns(),
                      payloads=fmt.PayloadPolicy.FULL, sluice_version="0.1.0",
                      protocol="cursus", broker="cursus://127.0.0.1:9000")  # fmt: skip
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def headers_only(directory: Path) -> Path:
    """A proxy that recorded and stopped before any client came."""
    return _write(directory, [])


def silent_client(directory: Path) -> Path:
    """One client that connected and left without a word."""
    now = time.time_ns()
    return _write(directory, [
        {"k": "conn", "c": 1, "t": 1_000, "w": now, "client": "127.0.0.1:40000",
         "broker": "127.0.0.1:9000", "kind": "proxied", "listener": "plain"},
        {"k": "close", "c": 1, "t": 2_000, "w": now, "reason": "client"},
    ])  # fmt: skip


@pytest.mark.parametrize("make", [headers_only, silent_client])
def test_a_cursus_capture_with_no_client_frame_is_a_usage_error(
    make: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = make(tmp_path)
    code = main(["replay", str(recording), "--broker", NOWHERE, "--timeout", "2", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "equivalent" not in out, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sluice replay: "), err
    assert f"{recording}: nothing to replay: no client frames" in lines[0], err
