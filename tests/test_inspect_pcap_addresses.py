"""``sluice inspect --pcap``: each connection's packets carry the addresses
its ``conn`` record names, IPv6 clients included, as Wireshark reads them."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode
from sluice.recording import format as fmt

pytestmark = pytest.mark.e2e  # runs tshark

T0 = 1_790_000_000 * 10**9
CAPTURE = "0123456789ab"
PING, PONG = encode(command(Type.PING)), encode(command(Type.PONG))


def _tshark() -> str:
    tshark = shutil.which("tshark")
    assert tshark, "tshark is not installed: install the Debian package tshark (./dev setup does)"
    return tshark


def _recording(directory: Path, *conns: tuple[int, str, str]) -> Path:
    """One segment: each (id, client, broker) connection opened, a PING and
    its PONG, closed."""
    directory.mkdir()
    records: list[dict[str, object]] = [
        fmt.header(
            capture=CAPTURE,
            segment=1,
            started_ns=T0,
            payloads=fmt.PayloadPolicy.FULL,
            sluice_version="t",
            broker="pulsar://127.0.0.1:6650",
        )
    ]
    for c, client, broker in conns:
        at = c * 1000
        records += [
            {
                "k": "conn",
                "c": c,
                "t": at,
                "w": T0 + at,
                "client": client,
                "broker": broker,
                "kind": "proxied",
                "listener": "plain",
            },
            {"k": "frame", "c": c, "d": 0, "t": at + 1, "w": T0 + at + 1, "n": 13, "raw": PING},
            {"k": "frame", "c": c, "d": 1, "t": at + 2, "w": T0 + at + 2, "n": 13, "raw": PONG},
            {"k": "close", "c": c, "t": at + 3, "w": T0 + at + 3},
        ]
    (directory / f"sluice-20260921T000000-{CAPTURE}-0001.sluice").write_bytes(fmt.dumps(records))
    return directory


def _fields(tshark: str, pcap: Path, *fields: str) -> list[list[str]]:
    args = [tshark, "-r", str(pcap), "-o", "tcp.check_checksum:TRUE", "-T", "fields",
            "-E", "separator=;"] + [a for f in fields for a in ("-e", f)]  # fmt: skip
    run = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
    return [line.split(";") for line in run.stdout.splitlines()]


def test_ipv6_clients_keep_their_addresses(tmp_path: Path) -> None:
    """Before: an IPv6 client was written as a made-up 10.x.y.z address.
    Now: IPv6 packets with the client's address, the broker dialled over
    IPv4 as IPv4-mapped, checksums that Wireshark verifies; IPv4 as before."""
    tshark = _tshark()
    rec = _recording(tmp_path / "rec",
                     (1, "[2001:db8::7]:41001", "127.0.0.1:6650"),
                     (2, "[2001:db8::8]:41002", "[2001:db8::1]:6651"),
                     (3, "10.1.2.3:41003", "pulsar://10.9.8.7:6650"),
                     (4, "[::ffff:10.1.2.4]:41004", "10.9.8.7:6650"))  # fmt: skip
    out = tmp_path / "out.pcapng"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["inspect", str(rec), "--pcap", str(out)]) == 0
    rows = _fields(tshark, out, "ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst",
                   "tcp.dstport", "tcp.len", "tcp.checksum.status")  # fmt: skip
    assert len(rows) == 4 * 8  # handshake, PING, PONG, FINs and the last ACK
    conversations = {
        tuple(sorted(((r[0] or r[1], r[2]), (r[3] or r[4], r[5])))) for r in rows if r[6] != "0"
    }
    assert conversations == {
        (("2001:db8::7", "41001"), ("::ffff:127.0.0.1", "6650")),
        (("2001:db8::1", "6651"), ("2001:db8::8", "41002")),
        (("10.1.2.3", "41003"), ("10.9.8.7", "6650")),
        (("10.1.2.4", "41004"), ("10.9.8.7", "6650")),  # an IPv4 client of a dual-stack listener
    }
    assert {r[7] for r in rows} == {"1"}  # every TCP checksum verified good
    warnings = subprocess.run(
        [tshark, "-r", str(out), "-Y", "_ws.expert.severity >= warning || _ws.malformed"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert warnings.strip() == ""
