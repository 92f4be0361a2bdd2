"""``sluice inspect --pcap`` of one segment of a capture: the connections it
carries frames of, opened in an earlier segment, are written all the same
(their addresses from that segment, or placeholders, said once)."""

from __future__ import annotations

import collections
import contextlib
import io
import ipaddress
import shutil
import struct
from pathlib import Path

from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode
from sluice.recording import format as fmt

T0 = 10**18
CAPTURE = "0123456789ab"
PING, PONG = encode(command(Type.PING)), encode(command(Type.PONG))
BROKER = "pulsar://10.9.8.7:6650"


def _segment(directory: Path, number: int, *records: dict[str, object]) -> Path:
    head = fmt.header(capture=CAPTURE, segment=number, started_ns=T0 + number * 10**9,
                      payloads=fmt.PayloadPolicy.FULL, sluice_version="t",
                      broker=BROKER)  # fmt: skip
    path = directory / f"sluice-20260101T00000{number}-{CAPTURE}-{number:04d}.sluice"
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def _conn(c: int, client: str) -> dict[str, object]:
    return {"k": "conn", "c": c, "t": c, "w": T0 + c, "client": client, "broker": BROKER,
            "kind": "proxied", "listener": "plain"}  # fmt: skip


def _frame(c: int, d: int, at: int) -> dict[str, object]:
    raw = PING if d == 0 else PONG
    return {"k": "frame", "c": c, "d": d, "t": at, "w": T0 + at, "n": len(raw), "raw": raw}


def _capture(directory: Path) -> tuple[Path, Path]:
    """Connection 1 opened in segment 1, talking in both; connection 2
    opened and talking in segment 2 only."""
    directory.mkdir()
    first = _segment(directory, 1, _conn(1, "10.1.1.1:41001"), _frame(1, 0, 10), _frame(1, 1, 11))
    second = _segment(directory, 2, _frame(1, 0, 20), _frame(1, 1, 21),
                      _conn(2, "10.2.2.2:42002"), _frame(2, 0, 22), _frame(2, 1, 23),
                      {"k": "close", "c": 1, "t": 30, "w": T0 + 30})  # fmt: skip
    return first, second


def _pcap(target: Path, out: Path) -> str:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["inspect", str(target), "--pcap", str(out)]) == 0, err.getvalue()
    return err.getvalue()


def _streams(path: Path) -> dict[tuple[str, str], bytes]:
    """The TCP payload each (source, destination) of a pcapng file sent."""
    data = path.read_bytes()
    streams: dict[tuple[str, str], bytes] = collections.defaultdict(bytes)
    at = 0
    while at < len(data):
        kind, length = struct.unpack_from("<II", data, at)
        if kind == 6:  # an enhanced packet block
            captured = struct.unpack_from("<I", data, at + 20)[0]
            ip = data[at + 28 : at + 28 + captured]
            tcp = ip[20:]
            src = f"{ipaddress.IPv4Address(ip[12:16])}:{struct.unpack('!H', tcp[:2])[0]}"
            dst = f"{ipaddress.IPv4Address(ip[16:20])}:{struct.unpack('!H', tcp[2:4])[0]}"
            streams[(src, dst)] += tcp[(tcp[12] >> 4) * 4 :]
        at += length
    return dict(streams)


def test_a_later_segment_alone_finds_its_connections_in_the_earlier_one(tmp_path: Path) -> None:
    _, second = _capture(tmp_path / "rec")
    out = tmp_path / "second.pcapng"
    said = _pcap(second, out)
    assert "placeholder" not in said, said
    assert _streams(out) == {
        ("10.1.1.1:41001", "10.9.8.7:6650"): PING,
        ("10.9.8.7:6650", "10.1.1.1:41001"): PONG,
        ("10.2.2.2:42002", "10.9.8.7:6650"): PING,
        ("10.9.8.7:6650", "10.2.2.2:42002"): PONG,
    }
    # The whole capture: each connection one conversation, as before.
    whole = tmp_path / "whole.pcapng"
    _pcap(tmp_path / "rec", whole)
    assert _streams(whole)[("10.1.1.1:41001", "10.9.8.7:6650")] == PING * 2


def test_a_segment_whose_earlier_ones_are_gone_has_placeholder_addresses(
    tmp_path: Path,
) -> None:
    _, second = _capture(tmp_path / "rec")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(second, alone / second.name)
    out = tmp_path / "alone.pcapng"
    said = _pcap(alone / second.name, out)
    notes = [line for line in said.splitlines() if "placeholder" in line]
    assert len(notes) == 1 and "1 connection(s)" in notes[0] and "(c1)" in notes[0], said
    streams = _streams(out)
    # Connection 1's frames are there, from a placeholder client to the
    # recording's broker; connection 2 has its own addresses.
    placeholder = [
        src for src, dst in streams if dst == "10.9.8.7:6650" and src.startswith("192.0.2.")
    ]
    assert len(placeholder) == 1
    assert streams[(placeholder[0], "10.9.8.7:6650")] == PING
    assert streams[("10.9.8.7:6650", placeholder[0])] == PONG
    assert streams[("10.2.2.2:42002", "10.9.8.7:6650")] == PING
