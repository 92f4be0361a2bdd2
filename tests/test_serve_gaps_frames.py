"""`sluice serve` bounds the frames a client may send it, as the proxy and a
broker do: a length prefix past the limit closes the connection with a log
line, instead of buffering up to 2 GiB of whatever the client sends."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import free_port, wait_for_port
from sluice.protocols.pulsar import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Type,
    command,
    encode,
    encode_payload,
    max_frame_size,
    pb,
)
from sluice.recording import format as fmt
from tests.helpers.support import SLUICE, RawClient

T = Type.Value
pytestmark = pytest.mark.e2e


def _header(now: int) -> dict[str, Any]:
    return {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
            "protocol": "pulsar", "capture": "0123456789ab", "segment": 1, "started": now,
            "host": "h", "listen": ["127.0.0.1:6650"], "broker": "pulsar://127.0.0.1:6650",
            "payloads": "full",
            "redaction": {"credentials": "always", "marker": "<redacted>"}}  # fmt: skip


def _frame(c: int, from_client: bool, raw: bytes, t: int, now: int) -> dict[str, Any]:
    name = pb.BaseCommand.Type.Name(pb.BaseCommand.FromString(raw[8:]).type)
    return {"k": "frame", "c": c, "d": 0 if from_client else 1, "t": t, "w": now,
            "n": len(raw), "raw": raw, "s": {"cmd": name}}  # fmt: skip


def _recording(directory: Path, broker_limit: int | None = None) -> Path:
    """A capture of one handshake; the broker's CONNECTED names
    ``broker_limit`` as its max message size when given."""
    now = time.time_ns()
    connect = encode(command(T("CONNECT"), pb.CommandConnect(client_version="c",
                                                             protocol_version=21)))  # fmt: skip
    connected = pb.CommandConnected(server_version="b", protocol_version=21)
    if broker_limit is not None:
        connected.max_message_size = broker_limit
    records = [
        _header(now),
        {"k": "conn", "c": 1, "t": 1_000, "w": now, "client": "127.0.0.1:40000",
         "broker": "pulsar://127.0.0.1:6650", "kind": "proxied", "listener": "plain"},
        _frame(1, True, connect, 2_000, now),
        _frame(1, False, encode(command(T("CONNECTED"), connected)), 3_000, now),
    ]  # fmt: skip
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


@pytest.fixture
def serving(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[int, Any]]:
    """``sluice serve`` of the recording ``request.param`` makes, and a
    function that stops it and gives its stderr."""
    recording = _recording(tmp_path, getattr(request, "param", None))
    port = free_port()
    process = subprocess.Popen(
        [*SLUICE, "serve", str(recording), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def stop() -> str:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
        return err

    try:
        wait_for_port("127.0.0.1", port, 20, process)  # type: ignore[arg-type]
        yield port, stop
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_frame_over_the_limit_closes_the_connection_with_a_log_line(
    serving: tuple[int, Any],
) -> None:
    port, stop = serving
    limit = max_frame_size(DEFAULT_MAX_MESSAGE_SIZE)
    with RawClient(port) as raw:
        assert raw.connect().name == "CONNECTED"
        # A length prefix of 2 GiB, then a little of the promised frame.
        raw.send((2**31 - 1).to_bytes(4, "big") + b"\0" * 1024)
        assert raw.receive(timeout=10) is None, "serve kept reading a 2 GiB frame"
    with RawClient(port) as other:  # the others are served on
        assert other.connect().name == "CONNECTED"
    err = stop()
    said = [line for line in err.splitlines() if "exceeds the limit" in line]
    assert len(said) == 1, err
    assert f"frame of {2**31 + 3} bytes exceeds the limit of {limit}" in said[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("serving", [8 * 1024 * 1024], indirect=True)
def test_the_recorded_brokers_larger_limit_is_served_and_said(serving: tuple[int, Any]) -> None:
    """The broker recorded took messages of up to 8 MiB: serve says so in its
    CONNECTED (clients size their messages by it) and takes such frames."""
    port, stop = serving
    with RawClient(port) as raw:
        connected = raw.connect()
        assert connected.name == "CONNECTED"
        assert connected.body.max_message_size == 8 * 1024 * 1024
        send = pb.CommandSend(producer_id=1, sequence_id=0)
        meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        big = encode_payload(command(T("SEND"), send), meta, b"x" * (6 * 1024 * 1024),
                             max_message_size=8 * 1024 * 1024)  # fmt: skip
        raw.send(big)
        answer = raw.receive(timeout=10)
        assert answer is not None, "a 6 MiB frame under the recorded limit was refused"
        assert answer.name in ("SEND_ERROR", "ERROR")  # no producer of that id was recorded
    assert "exceeds the limit" not in stop()
