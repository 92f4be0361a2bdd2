"""`sluice replay` on the command line, run in-process against a real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.recording import format as fmt

T = Type.Value


def connect_only(directory: Path) -> Path:
    """A recording of one client that connects and goes away, payloads kept."""
    now = time.time_ns()
    hello = encode(command(T("CONNECT"), pb.CommandConnect(client_version="t",
                                                            protocol_version=20)))  # fmt: skip
    answer = encode(command(T("CONNECTED"), pb.CommandConnected(server_version="b",
                                                                 protocol_version=20)))  # fmt: skip
    records: list[dict[str, object]] = [
        {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
         "protocol": "pulsar", "capture": "0123456789ab", "segment": 1, "started": now,
         "host": "h", "listen": ["127.0.0.1:6650"], "broker": "pulsar://127.0.0.1:6650",
         "payloads": "full", "redaction": {"credentials": "always", "marker": "<redacted>"}},
        {"k": "conn", "c": 1, "t": 1_000, "w": now, "client": "127.0.0.1:40000",
         "broker": "pulsar://127.0.0.1:6650", "kind": "lookup", "listener": "plain"},
        {"k": "frame", "c": 1, "d": 0, "t": 2_000, "w": now, "n": len(hello), "raw": hello,
         "s": {"cmd": "CONNECT"}},
        {"k": "frame", "c": 1, "d": 1, "t": 3_000, "w": now, "n": len(answer), "raw": answer,
         "s": {"cmd": "CONNECTED"}},
        {"k": "close", "c": 1, "t": 4_000, "w": now, "reason": "closed"},
    ]  # fmt: skip
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


def test_a_transcript_that_cannot_be_written_keeps_the_report(
    broker: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay ran, then its transcript could not be written (here a
    full device): the report still comes, then one line, status 2. It used
    to be dropped with the transcript."""
    recording = connect_only(tmp_path)
    argv = ["replay", str(recording), "--broker", broker.url, "--timeout", "2", "--quiet"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    assert "equivalent" in alone, alone
    assert main([*argv, "--transcript", "/dev/full"]) == 2
    said = capsys.readouterr()
    assert said.out == alone
    assert said.err == ("sluice replay: --transcript /dev/full: No space left on device "
                        "(the report above is the replay's)\n")  # fmt: skip
