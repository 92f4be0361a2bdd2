"""`sluice serve` hands out a topic's recorded message ids in the order the
broker gave them, across connections: a broker numbers a topic's entries
in the order sends arrive, whichever connection they come on."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import free_port, wait_for_port
from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.recording import format as fmt
from tests.helpers.support import SLUICE, RawClient

T = Type.Value
TOPIC = "persistent://public/default/two-producers"
pytestmark = pytest.mark.e2e


def _header(now: int) -> dict[str, Any]:
    return {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
            "protocol": "pulsar", "capture": "0123456789ab", "segment": 1, "started": now,
            "host": "h", "listen": ["127.0.0.1:6650"], "broker": "pulsar://127.0.0.1:6650",
            "payloads": "full",
            "redaction": {"credentials": "always", "marker": "<redacted>"}}  # fmt: skip


def _send(producer: int, seq: int) -> bytes:
    meta = pb.MessageMetadata(producer_name=f"p{producer}", sequence_id=seq, publish_time=1)
    body = pb.CommandSend(producer_id=producer, sequence_id=seq)
    return encode_payload(command(T("SEND"), body), meta, f"m{producer}-{seq}".encode())


def _receipt(producer: int, seq: int, entry: int) -> bytes:
    mid = pb.MessageIdData(ledgerId=7, entryId=entry)
    body = pb.CommandSendReceipt(producer_id=producer, sequence_id=seq, message_id=mid)
    return encode(command(T("SEND_RECEIPT"), body))


def _two_producers(directory: Path) -> Path:
    """c1 and c2 each produce to TOPIC, their sends taking turns: the
    broker numbered the entries 0 (c1), 1 (c2), 2 (c1), 3 (c2)."""
    now = time.time_ns()
    records: list[dict[str, Any]] = [_header(now)]
    t = 1_000

    def frame(c: int, from_client: bool, raw: bytes) -> None:
        nonlocal t
        t += 1_000
        size = int.from_bytes(raw[4:8], "big")
        name = pb.BaseCommand.Type.Name(pb.BaseCommand.FromString(raw[8 : 8 + size]).type)
        records.append({"k": "frame", "c": c, "d": 0 if from_client else 1, "t": t, "w": now,
                        "n": len(raw), "raw": raw, "s": {"cmd": name}})  # fmt: skip

    for c in (1, 2):
        records.append({"k": "conn", "c": c, "t": t, "w": now, "client": f"127.0.0.1:{40000 + c}",
                        "broker": "pulsar://127.0.0.1:6650", "kind": "proxied",
                        "listener": "plain"})  # fmt: skip
        hello = pb.CommandConnect(client_version="c", protocol_version=21)
        frame(c, True, encode(command(T("CONNECT"), hello)))
        welcome = pb.CommandConnected(server_version="b", protocol_version=21)
        frame(c, False, encode(command(T("CONNECTED"), welcome)))
        asked = pb.CommandProducer(topic=TOPIC, producer_id=c, request_id=1)
        frame(c, True, encode(command(T("PRODUCER"), asked)))
        made = pb.CommandProducerSuccess(request_id=1, producer_name=f"p{c}")
        frame(c, False, encode(command(T("PRODUCER_SUCCESS"), made)))
    entry = 0
    for seq in (0, 1):
        for c in (1, 2):
            frame(c, True, _send(c, seq))
            frame(c, False, _receipt(c, seq, entry))
            entry += 1
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    """``sluice serve`` of the two producers' recording, listening here."""
    here = free_port()
    process = subprocess.Popen(
        [*SLUICE, "serve", str(_two_producers(tmp_path)), "--listen", f"127.0.0.1:{here}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", here, 20, process)
        yield here
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_two_producers_get_a_topics_ids_in_the_order_their_sends_arrive(port: int) -> None:
    with RawClient(port) as one, RawClient(port) as two:
        for producer_id, raw in ((1, one), (2, two)):
            assert raw.connect().name == "CONNECTED"
            asked = pb.CommandProducer(topic=TOPIC, producer_id=producer_id, request_id=1)
            raw.send(encode(command(T("PRODUCER"), asked)))
            raw.receive_type("PRODUCER_SUCCESS")
        entries = []
        for seq in (0, 1):
            for producer_id, raw in ((1, one), (2, two)):
                raw.send(_send(producer_id, seq))
                receipt = raw.receive_type("SEND_RECEIPT").body
                assert (receipt.producer_id, receipt.sequence_id) == (producer_id, seq)
                entries.append((receipt.message_id.ledgerId, receipt.message_id.entryId))
    assert entries == [(7, 0), (7, 1), (7, 2), (7, 3)]
