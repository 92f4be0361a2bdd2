"""``sluice inspect``'s filters: what they keep and what they leave out."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from sluice.commands import main
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.encoder import encode_payload
from sluice.recording import format as fmt

T0 = 10**18
TOPIC = "persistent://public/default/orders"


def _inspect_json(path: Path, *extra: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(path), "--json", *extra]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _frame(d: int, second: int, raw: bytes) -> dict[str, Any]:
    return {"k": "frame", "c": 1, "d": d, "t": second, "w": T0 + second * 10**9, "n": len(raw),
            "raw": raw}  # fmt: skip


def _producing(path: Path, topic: str) -> Path:
    """A producer on ``topic`` sending one message (its SEND and receipt
    name the topic through the producer id only)."""
    head = fmt.header(capture="abc", segment=1, started_ns=T0, payloads=fmt.PayloadPolicy.FULL,
                      sluice_version="t")  # fmt: skip
    producer = pb.CommandProducer(topic=topic, producer_id=7, request_id=1)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    receipt = pb.CommandSendReceipt(producer_id=7, sequence_id=0,
                                    message_id=pb.MessageIdData(ledgerId=3, entryId=0))  # fmt: skip
    records = [
        head,
        {"k": "conn", "c": 1, "t": 0, "w": T0, "client": "127.0.0.1:5555",
         "broker": "pulsar://127.0.0.1:6650", "kind": "proxied", "listener": "plain"},
        _frame(0, 1, encode(command(Type.PRODUCER, producer))),
        _frame(1, 1, encode(command(Type.PRODUCER_SUCCESS,
                                    pb.CommandProducerSuccess(request_id=1, producer_name="p")))),
        _frame(0, 2, encode_payload(command(Type.SEND, pb.CommandSend(producer_id=7,
                                                                      sequence_id=0)), meta, b"x")),
        _frame(1, 2, encode(command(Type.SEND_RECEIPT, receipt))),
    ]  # fmt: skip
    path.write_bytes(fmt.dumps(records))
    return path


def test_a_partitioned_topic_keeps_the_frames_of_its_partitions(tmp_path: Path) -> None:
    """``--topic`` naming a partitioned topic keeps its partitions' frames
    (a client produces to each partition: no frame names the topic itself),
    as message filters' topics do; a partition named keeps that one only."""
    capture = _producing(tmp_path / "r.sluice", f"{TOPIC}-partition-1")
    kept = [(r["cmd"], r["topic"]) for r in _inspect_json(capture, "--topic", TOPIC)]
    assert kept == [(cmd, f"{TOPIC}-partition-1") for cmd in
                    ("PRODUCER", "PRODUCER_SUCCESS", "SEND", "SEND_RECEIPT")]  # fmt: skip
    assert len(_inspect_json(capture, "--topic", f"{TOPIC}-partition-1")) == 4
    assert _inspect_json(capture, "--topic", f"{TOPIC}-partition-2") == []
    assert _inspect_json(capture, "--topic", f"{TOPIC}-partition") == []
    assert _inspect_json(capture, "--topic", "persistent://public/default/order") == []


def test_a_gap_is_shown_whatever_the_filters(tmp_path: Path) -> None:
    """A gap's frames may be of any connection and topic: under --topic,
    --command or --connection it was left out, so the filtered view said
    nothing was missing where frames were."""
    capture = _producing(tmp_path / "r.sluice", TOPIC)
    records = list(fmt.read_records_from(capture.read_bytes(), capture.name))
    records.insert(4, {"k": "gap", "t": 2, "w": T0 + 2 * 10**9, "dropped": 12})
    capture.write_bytes(fmt.dumps(records))
    for extra in ([], ["--topic", TOPIC], ["--command", "SEND"], ["--connection", "1"]):
        gaps = [r for r in _inspect_json(capture, *extra) if r["kind"] == "gap"]
        assert [g["dropped"] for g in gaps] == [12], extra
    assert not [r for r in _inspect_json(capture, "--until", "1") if r["kind"] == "gap"]


def test_a_pcap_target_that_is_no_regular_file_is_written_in_place(tmp_path: Path) -> None:
    """--pcap wrote a file beside its target and moved it there: a FIFO, a
    device or /dev/stdout was replaced by a regular file (as root,
    /dev/full became one). Such a target is now written in place."""
    capture = _producing(tmp_path / "r.sluice", TOPIC)
    fifo = tmp_path / "out.pcapng"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["inspect", str(capture), "--pcap", str(fifo)]) == 0
    reader.join(10)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert got and got[0][:4] == b"\x0a\x0d\x0d\x0a"  # a pcapng section header block
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pcapng", "r.sluice"]


def test_a_topic_is_named_as_fault_rules_and_clients_name_it(tmp_path: Path) -> None:
    """``--topic`` took only a whole name: a glob (``orders-*``), a local
    name (``orders``, as ``sluice faults --topic`` takes it) or a client's
    short form (``public/default/orders``) kept nothing, with no word said."""
    capture = _producing(tmp_path / "r.sluice", f"{TOPIC}-partition-1")
    named = ("orders", "ord*", "orders-partition-1", "public/default/orders", "public/default/ord*",
             "persistent://public/*/orders", f"{TOPIC}-partition-?")  # fmt: skip
    for topic in named:
        assert len(_inspect_json(capture, "--topic", topic)) == 4, topic
    for topic in ("order", "other-*", "public/other/orders", "persistent://public/default/o"):
        assert _inspect_json(capture, "--topic", topic) == [], topic


def test_since_after_until_is_refused(tmp_path: Path) -> None:
    """``--since 20 --until 10`` showed nothing and exited 0, as if the
    capture held nothing then: now one line and exit 2."""
    capture = _producing(tmp_path / "r.sluice", TOPIC)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["inspect", str(capture), "--since", "20", "--until", "10"]) == 2
    assert (
        err.getvalue() == "sluice inspect: --since 20 is after --until 10: no time is in between\n"
    )
    assert out.getvalue() == ""
    assert [r["cmd"] for r in _inspect_json(capture, "--since", "2", "--until", "2")] == [
        "SEND", "SEND_RECEIPT"]  # fmt: skip
