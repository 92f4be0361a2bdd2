"""``sluice inspect --command NAME`` with a name no command of the capture's
protocol has (a typo, another protocol's): one line and status 2, as
argparse answers a bad choice, not an empty listing that reads as "the
capture holds no such frames". Every name that matched before still does:
any case, HTTP and WS, and a name a recorded frame carries that the
protocol does not list (an unknown Pulsar type, a word a Cursus envelope
held)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main
from sluice.recording import format as fmt


def _capture(path: Path, protocol: str, commands: list[str]) -> Path:
    now = time.time_ns()
    records: list[dict[str, Any]] = [
        {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
         "protocol": protocol, "capture": "0123456789ab", "segment": 1, "started": now,
         "host": "h", "listen": ["127.0.0.1:6650"], "broker": "127.0.0.1:6650",
         "payloads": "none", "redaction": {"credentials": "always", "marker": "<redacted>"}},
        {"k": "conn", "c": 1, "t": 1_000, "w": now, "client": "127.0.0.1:40000",
         "broker": "127.0.0.1:6650", "kind": "lookup", "listener": "plain"},
    ]  # fmt: skip
    for i, cmd in enumerate(commands):
        records.append({"k": "frame", "c": 1, "d": 0, "t": 2_000 + i, "w": now + i, "n": 8,
                        "raw": b"", "p": [8], "s": {"cmd": cmd}})  # fmt: skip
    path.write_bytes(fmt.dumps(records))
    return path


def _inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _commands(out: str) -> list[str]:
    return [r["cmd"] for r in map(json.loads, out.splitlines()) if r["kind"] == "frame"]


def test_a_command_no_protocol_has_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = _capture(tmp_path / "p.sluice", "pulsar", ["CONNECT", "SEND"])
    code, out, err = _inspect(capsys, str(capture), "--command", "SEND", "--command", "sned")
    assert code == 2 and out == "", (out, err)
    assert err == (
        "sluice inspect: argument --command: invalid choice: 'sned' (not a command of Pulsar, "
        "nor HTTP or WS; did you mean SEND?)\n"
    ), err


def test_another_protocols_command_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PUBLISH is Cursus's: a Pulsar capture never holds one."""
    capture = _capture(tmp_path / "p.sluice", "pulsar", ["CONNECT", "SEND"])
    code, out, err = _inspect(capsys, str(capture), "--command", "PUBLISH")
    assert code == 2 and out == "", (out, err)
    assert err.startswith(
        "sluice inspect: argument --command: invalid choice: 'PUBLISH' (not a command of Pulsar"
    ), err
    assert err.count("\n") == 1, err


def test_the_names_of_a_short_list_are_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from sluice.protocols import registry

    pulsar = registry.get("pulsar")
    few = dataclasses.replace(pulsar.faults, commands=frozenset({"SEND", "CONNECT"}))
    monkeypatch.setattr(registry, "get", lambda name: dataclasses.replace(pulsar, faults=few))
    capture = _capture(tmp_path / "p.sluice", "pulsar", ["CONNECT", "SEND"])
    code, _, err = _inspect(capsys, str(capture), "--command", "PING")
    assert code == 2
    assert err == (
        "sluice inspect: argument --command: invalid choice: 'PING' "
        "(choose from CONNECT, SEND, HTTP, WS)\n"
    ), err


@pytest.mark.parametrize(
    ("protocol", "recorded", "asked"),
    [
        ("pulsar", ["CONNECT", "SEND", "SEND"], ["send"]),
        ("pulsar", ["CONNECT", "SEND"], ["Send", "http", "ws"]),
        ("pulsar", ["CONNECT", "UNKNOWN(99)"], ["unknown(99)"]),  # a type the schema lacks
        ("cursus", ["CREATE", "PUBLISH", "OK"], ["publish", "ok"]),
        ("cursus", ["CREATE", "INVALID"], ["INVALID"]),
        ("cursus", ["CREATE", "FROBNICATE"], ["FROBNICATE"]),  # a word only the broker judges
    ],
)
def test_every_name_that_matched_still_does(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    protocol: str,
    recorded: list[str],
    asked: list[str],
) -> None:
    capture = _capture(tmp_path / "c.sluice", protocol, recorded)
    argv = [str(capture), "--json"]
    for name in asked:
        argv += ["--command", name]
    code, out, err = _inspect(capsys, *argv)
    assert code == 0, err
    wanted = {name.upper() for name in asked}
    assert _commands(out) == [c for c in recorded if c in wanted], out


def test_a_command_of_the_protocol_that_the_capture_lacks_lists_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real command the capture holds none of: nothing to list, no error."""
    capture = _capture(tmp_path / "p.sluice", "pulsar", ["CONNECT", "SEND"])
    code, out, err = _inspect(capsys, str(capture), "--json", "--command", "PING")
    assert code == 0 and _commands(out) == [], err
