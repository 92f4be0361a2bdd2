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


def test_a_topic_name_of_any_length_makes_no_label_of_that_length() -> None:
    """The topic label limit bounds how many topics get a label, not how
    long one is: a Cursus client names a batch's topic (up to 65,535 bytes,
    counted as sent whatever the broker says of it), so 100 such names made
    every scrape some 13 MB for the life of the proxy. A name longer than
    any real topic's counts as ``other``, and is not remembered."""
    metrics = Metrics(topic_limit=100)
    for i in range(150):
        metrics.topic_traffic(f"{i:03d}" + "t" * 65_000, "client_to_broker", 1, 10)
    real = "persistent://public/default/" + "orders-" * 60  # a long name still a topic's
    metrics.topic_traffic(real, "client_to_broker", 2, 20)
    text = generate_latest(metrics.exposed).decode()
    assert len(text) < 100_000, len(text)
    assert (
        'sluice_topic_messages_total{direction="client_to_broker",protocol="pulsar",topic="other"}'
        " 150.0" in text
    )
    assert f'topic="{real}"' in text
    assert len(metrics.topic_label._known) == 1


def test_a_broker_error_code_of_any_length_makes_no_label_of_that_length() -> None:
    """A Cursus broker's error code is a string off the wire, of any length."""
    from sluice.protocols.core import Answered

    metrics = Metrics()
    conn = Conn(1, "127.0.0.1:5000", "plain", "cursus")
    metrics.event(conn, Answered("PUBLISH", 0.001, "E" * 60_000, None))
    text = generate_latest(metrics.exposed).decode()
    assert len(text) < 100_000, len(text)
    assert 'error="other"' in text
