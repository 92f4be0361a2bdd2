"""`sluice replay` of a capture that also holds what the HTTP listener
recorded (``http`` exchanges, ``ws`` frames): replay covers the binary
protocol, and its report says what it left out, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.commands import main
from sluice.recording import format as fmt
from sluice.recording.reader import load
from tests.test_replay_cli import connect_only


def with_web_traffic(directory: Path) -> Path:
    """``connect_only``'s recording, with 2 HTTP exchanges (one an upgrade to
    WebSocket) and 3 WebSocket frames recorded beside it."""
    path = connect_only(directory)
    records = list(fmt.read_records(path))
    now = records[0]["started"]
    web: list[dict[str, Any]] = [
        {"k": "http", "h": 1, "x": 1, "t": 5_000, "w": now, "te": 6_000, "status": 200,
         "client": "127.0.0.1:40001", "method": "GET", "path": "/admin/v2/clusters",
         "kind": "admin"},
        {"k": "http", "h": 2, "x": 1, "t": 7_000, "w": now, "te": 8_000, "status": 101,
         "client": "127.0.0.1:40002", "method": "GET", "path": "/ws/v2/producer/t",
         "kind": "websocket"},
        {"k": "ws", "h": 2, "d": 0, "t": 9_000, "w": now, "n": 5, "op": "text"},
        {"k": "ws", "h": 2, "d": 1, "t": 9_500, "w": now, "n": 7, "op": "text"},
        {"k": "ws", "h": 2, "d": 0, "t": 9_900, "w": now, "n": 2, "op": "close"},
    ]  # fmt: skip
    path.write_bytes(fmt.dumps(records + web))
    return path


def test_http_and_websocket_records_are_said_not_replayed(
    broker: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = with_web_traffic(tmp_path)
    loaded = load(recording)
    assert (loaded.http, loaded.ws) == (2, 3)
    argv = ["replay", str(recording), "--broker", broker.url, "--timeout", "2", "--quiet"]
    assert main(argv) == 0
    report = capsys.readouterr().out
    note = ("note: 2 HTTP exchanges and 3 WebSocket frames in the capture were not replayed: "
            "replay covers the binary protocol (Pulsar's or Cursus's), not the HTTP listener's "
            "traffic\n")  # fmt: skip
    assert report.count(note) == 1, report
    assert "equivalent" in report, report


def test_a_capture_without_web_traffic_has_no_such_note(
    broker: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = connect_only(tmp_path)
    assert main(["replay", str(recording), "--broker", broker.url, "--timeout", "2"]) == 0
    assert "not replayed" not in capsys.readouterr().out
