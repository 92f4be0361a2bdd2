"""Labels a client chooses stay bounded: what is on the wire never makes a
series of its own beyond a fixed, small set."""

from __future__ import annotations

import struct

from prometheus_client import generate_latest

from sluice.protocols.core import Conn
from sluice.protocols.pulsar import decode_frame
from sluice.protocols.pulsar.frame import COMMAND_NAMES
from sluice.proxy.metrics import Metrics


def frame_of_type(type_: int) -> bytes:
    """A Pulsar frame whose BaseCommand says only ``type_`` (a varint)."""
    varint = bytearray()
    value = type_
    while True:
        byte, value = value & 0x7F, value >> 7
        varint.append(byte | (0x80 if value else 0))
        if not value:
            break
    body = b"\x08" + bytes(varint)
    return struct.pack(">II", 4 + len(body), len(body)) + body


def test_command_types_no_schema_knows_share_one_label() -> None:
    """sluice_frames_total and sluice_bytes_total count every frame a client
    sends, before validation; a command type Pulsar does not have was its
    own label (``UNKNOWN(99)``), so one client sending each type Pulsar does
    not have (a frame each, on as many connections as it likes) added some
    400 series to every scrape of the proxy for good."""
    metrics = Metrics()
    conn = Conn(1, "127.0.0.1:5000", "plain", "pulsar")
    unknown = [t for t in range(1, 256) if t not in COMMAND_NAMES]
    assert len(unknown) > 150
    frames = [decode_frame(frame_of_type(t)) for t in unknown]
    metrics.frames(conn, True, frames)
    send = decode_frame(frame_of_type(6))  # SEND: no body, still named
    metrics.frames(conn, True, [send])
    text = generate_latest(metrics.exposed).decode()
    commands = {
        line.split('command="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("sluice_frames_total{")
    }
    assert commands == {"UNKNOWN", "SEND"}, sorted(commands)
    assert (
        'sluice_frames_total{command="UNKNOWN",direction="client_to_broker",protocol="pulsar"} '
        f"{len(unknown)}.0" in text
    )
