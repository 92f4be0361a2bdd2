"""``sluice view``: each request joined to its answer, and the latency
shown, for frames encoded as a Pulsar client and broker send them and
summarized as a capture is read (in-process: no server, no browser)."""

from __future__ import annotations

import time
from pathlib import Path

from sluice.protocols.pulsar import encode, encode_payload, pb
from sluice.recording import format as fmt
from sluice.view.index import Filter, Index

TOPIC = "persistent://public/default/pairs"
BC = pb.BaseCommand


def test_a_producers_requests_are_joined_to_their_answers(tmp_path: Path) -> None:
    """PRODUCER and CLOSE_PRODUCER name a producer id; their answers
    (PRODUCER_SUCCESS, SUCCESS) name only the request id: the view looked
    for the answer under the producer's id and never joined them, so
    producer creation had no latency, no histogram, no 'answered by'."""
    frames = [
        (0, BC(type=BC.PRODUCER, producer=pb.CommandProducer(
            topic=TOPIC, producer_id=7, request_id=1))),
        (1, BC(type=BC.PRODUCER_SUCCESS, producer_success=pb.CommandProducerSuccess(
            request_id=1, producer_name="p"))),
        (0, BC(type=BC.SEND, send=pb.CommandSend(producer_id=7, sequence_id=1))),
        (1, BC(type=BC.SEND_RECEIPT, send_receipt=pb.CommandSendReceipt(
            producer_id=7, sequence_id=1))),
        (0, BC(type=BC.CLOSE_PRODUCER, close_producer=pb.CommandCloseProducer(
            producer_id=7, request_id=2))),
        (1, BC(type=BC.SUCCESS, success=pb.CommandSuccess(request_id=2))),
    ]  # fmt: skip
    t0, w0 = time.monotonic_ns(), time.time_ns()
    records: list[fmt.Record] = [
        fmt.header(capture="c1", segment=1, started_ns=w0, payloads=fmt.PayloadPolicy.HASH,
                   sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": t0, "w": w0, "client": "10.0.0.1:5000",
         "broker": "b:6650", "kind": "proxied", "listener": "plain"},
    ]  # fmt: skip
    for n, (direction, command) in enumerate(frames):
        if command.type == BC.SEND:
            meta = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
            raw = encode_payload(command, meta, b"m")
        else:
            raw = encode(command)
        records.append({"k": "frame", "c": 1, "d": direction, "t": t0 + (n + 1) * 2_000_000,
                        "w": w0, "n": len(raw), "raw": raw})  # fmt: skip
    (tmp_path / "a.sluice").write_bytes(fmt.dumps(records))
    index = Index(tmp_path)
    index.build()
    assert not index.error, index.error
    rows = index.page(Filter(), 0, 10)["rows"]
    assert [(r["cmd"], r["pair"]) for r in rows] == [
        ("PRODUCER", 1), ("PRODUCER_SUCCESS", 0), ("SEND", 3), ("SEND_RECEIPT", 2),
        ("CLOSE_PRODUCER", 5), ("SUCCESS", 4),
    ]  # fmt: skip
    assert [r["latency"] for r in rows[1::2]] == [0.002, 0.002, 0.002]
    timed = index.summary()["latency"]["by_command"]
    assert sorted(timed) == ["CLOSE_PRODUCER", "PRODUCER", "SEND"]
    assert all(sum(counts) == 1 for counts in timed.values())
    assert index.detail(0)["pair"] == 1
