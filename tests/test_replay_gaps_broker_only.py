"""`sluice replay` of a recording holding connections with broker frames only
(recorded from mid-stream: their client's CONNECT and requests came before
the recording starts): nothing can be sent on them, and the report says so,
rather than leaving them out as if they had been compared."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import free_port, wait_for_port
from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.recording import format as fmt
from tests.helpers.support import SLUICE

T = Type.Value
TOPIC = "persistent://public/default/pushed"


def _header(now: int) -> dict[str, Any]:
    return {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
            "protocol": "pulsar", "capture": "0123456789ab", "segment": 1, "started": now,
            "host": "h", "listen": ["127.0.0.1:6650"], "broker": "pulsar://127.0.0.1:6650",
            "payloads": "full",
            "redaction": {"credentials": "always", "marker": "<redacted>"}}  # fmt: skip


def _conn(c: int, now: int) -> dict[str, Any]:
    return {"k": "conn", "c": c, "t": 1_000, "w": now, "client": f"127.0.0.1:{40000 + c}",
            "broker": "pulsar://127.0.0.1:6650", "kind": "proxied",
            "listener": "plain"}  # fmt: skip


def _frame(c: int, from_client: bool, raw: bytes, t: int, now: int) -> dict[str, Any]:
    size = int.from_bytes(raw[4:8], "big")
    name = pb.BaseCommand.Type.Name(pb.BaseCommand.FromString(raw[8 : 8 + size]).type)
    return {"k": "frame", "c": c, "d": 0 if from_client else 1, "t": t, "w": now,
            "n": len(raw), "raw": raw, "s": {"cmd": name}}  # fmt: skip


def _snapshot(directory: Path, *, with_client: bool = True) -> Path:
    """A snapshot taken while c1 (a client's handshake follows) and c2 (a
    consumer's connection, pushed a message and then told its consumer is
    closed) were open. ``with_client=False``: c2 alone."""
    now = time.time_ns()
    hello = pb.CommandConnect(client_version="c", protocol_version=21)
    connect = encode(command(T("CONNECT"), hello))
    welcome = pb.CommandConnected(server_version="b", protocol_version=21)
    connected = encode(command(T("CONNECTED"), welcome))
    message = pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=5, entryId=0))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    pushed = encode_payload(command(T("MESSAGE"), message), meta, b"hello")
    close = pb.CommandCloseConsumer(consumer_id=1, request_id=9)
    closed = encode(command(T("CLOSE_CONSUMER"), close))
    records = [_header(now), _conn(2, now)]
    if with_client:
        records.append(_conn(1, now))
    records.append({"k": "snapshot", "t": 1_500, "w": now, "reason": "test", "seconds": 3})
    if with_client:
        records += [_frame(1, True, connect, 2_000, now), _frame(1, False, connected, 3_000, now)]
    records += [_frame(2, False, pushed, 4_000, now), _frame(2, False, closed, 5_000, now)]
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The snapshot, and ``sluice serve`` of it: a broker that answers c1's
    CONNECT as recorded."""
    recording = _snapshot(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        [*SLUICE, "serve", str(recording), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, 20, process)
        yield recording, f"pulsar://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.e2e
def test_a_connection_of_broker_frames_only_is_reported_not_replayed(
    serving: tuple[Path, str], tmp_path: Path
) -> None:
    recording, broker = serving
    transcript = tmp_path / "transcript.txt"
    done = subprocess.run(
        [*SLUICE, "replay", str(recording), "--broker", broker, "--timeout", "5",
         "--transcript", str(transcript), "--quiet"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    notes = [line for line in out.splitlines() if "only broker frames" in line]
    assert len(notes) == 1, out
    assert notes[0].startswith("note: c2 holds"), notes
    assert "not replayed" in notes[0], notes
    assert "recorded from mid-stream" in notes[0], notes
    assert "2 broker frames" in notes[0], notes
    summary = out.strip().splitlines()[-1]
    assert "1 connection not replayable" in summary, summary
    lines = transcript.read_text().splitlines()
    c2 = [line for line in lines if line.startswith("c2 ")]
    assert len(c2) == 3, lines  # the note, then its two frames
    assert "NOT REPLAYABLE" in c2[0]
    assert all("NOT REPLAYED" in line for line in c2[1:]), c2
    assert "MESSAGE" in c2[1] and "CLOSE_CONSUMER" in c2[2], c2


def test_a_recording_of_broker_frames_only_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to replay at all: the usage error names the connections
    left out, and why."""
    recording = _snapshot(tmp_path, with_client=False)
    assert main(["replay", str(recording), "--broker", "pulsar://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sluice replay: ") and "nothing to replay" in err, err
    assert "c2 holds only broker frames (recorded from mid-stream)" in err, err
    assert "\n" not in err
