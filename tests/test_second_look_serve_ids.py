"""Second look at `sluice serve` handing out a topic's message ids in order.

A recording made with ``--workers N`` is one file per worker, each its own
capture: two producers of one topic served by two workers are in two files.
Serve queued a topic's receipts in the order the files were read, one
capture after the other, so two live producers taking turns got the ids out
of order again (0, 2, 1, 3). Across captures the receipts now go in the
order they were recorded (wall clock), each capture's in its own order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.recording import format as fmt
from sluice.recording.reader import load
from sluice.replay.pulsar import Answers

T = Type.Value
TOPIC = "persistent://public/default/two-workers"


def _header(capture: str, now: int) -> dict[str, Any]:
    return {"k": "header", "format": "sluice-recording", "version": 2, "sluice": "0.1.0",
            "protocol": "pulsar", "capture": capture, "segment": 1, "started": now,
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


def _worker(directory: Path, capture: str, producer: int, entries: list[int], now: int) -> None:
    """One worker's file: a producer whose two sends the broker gave
    ``entries``, recorded at the wall-clock times those entries say."""
    records: list[dict[str, Any]] = [_header(capture, now)]
    t = 1_000

    def frame(from_client: bool, raw: bytes, wall: int) -> None:
        nonlocal t
        t += 1_000
        size = int.from_bytes(raw[4:8], "big")
        name = pb.BaseCommand.Type.Name(pb.BaseCommand.FromString(raw[8 : 8 + size]).type)
        records.append({"k": "frame", "c": 1, "d": 0 if from_client else 1, "t": t, "w": wall,
                        "n": len(raw), "raw": raw, "s": {"cmd": name}})  # fmt: skip

    client = f"127.0.0.1:{40000 + producer}"
    records.append({"k": "conn", "c": 1, "t": t, "w": now, "client": client,
                    "broker": "pulsar://127.0.0.1:6650", "kind": "proxied",
                    "listener": "plain"})  # fmt: skip
    hello = pb.CommandConnect(client_version="c", protocol_version=21)
    frame(True, encode(command(T("CONNECT"), hello)), now)
    welcome = pb.CommandConnected(server_version="b", protocol_version=21)
    frame(False, encode(command(T("CONNECTED"), welcome)), now)
    asked = pb.CommandProducer(topic=TOPIC, producer_id=producer, request_id=1)
    frame(True, encode(command(T("PRODUCER"), asked)), now)
    made = pb.CommandProducerSuccess(request_id=1, producer_name=f"p{producer}")
    frame(False, encode(command(T("PRODUCER_SUCCESS"), made)), now)
    for seq, entry in enumerate(entries):
        at = now + (1 + entry) * 1_000_000
        frame(True, _send(producer, seq), at)
        frame(False, _receipt(producer, seq, entry), at + 500_000)
    name = f"sluice-20261207T000000-{capture}-0001.sluice"
    (directory / name).write_bytes(fmt.dumps(records))


def _entries(answers: Answers) -> list[int]:
    return [frame.body.message_id.entryId for frame in answers.receipts[TOPIC]]


def test_two_workers_files_give_a_topics_ids_in_recorded_order(tmp_path: Path) -> None:
    now = time.time_ns()
    _worker(tmp_path, "aaaaaaaaaaaa", 1, [0, 2], now)  # worker 1's producer: entries 0 and 2
    _worker(tmp_path, "bbbbbbbbbbbb", 2, [1, 3], now)  # worker 2's: 1 and 3
    assert _entries(Answers.of(load(tmp_path))) == [0, 1, 2, 3]


def test_one_capture_keeps_its_recorded_order_whatever_its_clock_says(tmp_path: Path) -> None:
    """Within one capture the order of its records is the truth (a wall
    clock stepped back must not reorder them)."""
    now = time.time_ns()
    _worker(tmp_path, "aaaaaaaaaaaa", 1, [3, 2, 1, 0], now)  # entries written with falling clocks
    assert _entries(Answers.of(load(tmp_path))) == [3, 2, 1, 0]
