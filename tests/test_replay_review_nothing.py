"""`sluice replay` of a recording that holds nothing to replay: a usage error
in one line (exit 2), not a vacuous "equivalent" (exit 0) that a CI check
would take for a broker that behaves as recorded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.recording import format as fmt

T = Type.Value
NOWHERE = "pulsar://127.0.0.1:1"  # nothing listens: replay must not get as far as dialing


def _header(now: int) -> dict[str, Any]:
    return {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
            "protocol": "pulsar", "capture": "0123456789ab", "segment": 1, "started": now,
            "host": "h", "listen": ["127.0.0.1:6650"], "broker": "pulsar://127.0.0.1:6650",
            "payloads": "full",
            "redaction": {"credentials": "always", "marker": "<redacted>"}}  # fmt: skip


def _write(directory: Path, records: list[dict[str, Any]]) -> Path:
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


def _conn(now: int, c: int, kind: str = "proxied") -> dict[str, Any]:
    return {"k": "conn", "c": c, "t": 1_000, "w": now, "client": "127.0.0.1:40000",
            "broker": "pulsar://127.0.0.1:6650", "kind": kind, "listener": "plain"}  # fmt: skip


def headers_only(directory: Path) -> Path:
    """A proxy that recorded and stopped before any client came."""
    return _write(directory, [_header(time.time_ns())])


def web_only(directory: Path) -> Path:
    """Only the HTTP listener was used: an admin request."""
    now = time.time_ns()
    web = {"k": "http", "h": 1, "x": 1, "t": 5_000, "w": now, "te": 6_000, "status": 200,
           "client": "127.0.0.1:40001", "method": "GET", "path": "/admin/v2/clusters",
           "kind": "admin"}  # fmt: skip
    return _write(directory, [_header(now), web])


def refused_only(directory: Path) -> Path:
    """One client, refused by the recording proxy at the handshake (a PING first)."""
    now = time.time_ns()
    ping = encode(command(T("PING")))
    refusal = pb.CommandError(request_id=2**64 - 1, error=pb.NotAllowedError,
                              message="expected CONNECT, got PING")  # fmt: skip
    error = encode(command(T("ERROR"), refusal))
    return _write(directory, [
        _header(now), _conn(now, 7, "invalid"),
        {"k": "frame", "c": 7, "d": 0, "t": 2_000, "w": now, "n": len(ping), "raw": ping,
         "s": {"cmd": "PING"}},
        {"k": "frame", "c": 7, "d": 1, "t": 3_000, "w": now, "n": len(error), "raw": error,
         "s": {"cmd": "ERROR"}},
        {"k": "close", "c": 7, "t": 4_000, "w": now, "reason": "handshake"},
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (headers_only, "no client frames of the binary protocol"),
        (web_only, "1 HTTP exchange in the capture"),
        (refused_only, "c7 refused by the recording proxy at the handshake"),
    ],
)
def test_a_recording_with_nothing_to_replay_is_a_usage_error(
    make: Any, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = make(tmp_path)
    code = main(["replay", str(recording), "--broker", NOWHERE, "--timeout", "2", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "equivalent" not in out, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sluice replay: "), err
    assert "nothing to replay" in lines[0] and said in lines[0], err
