"""What a connection's correlator keeps, and when it lets go of it: the
producers, consumers, SENDs in flight and requests waiting for answers, fed
frames as bytes (both send tables: the Python reference and the compiled one)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message

from sluice.protocols.pulsar import Type, command, decode_frame, encode, encode_payload, pb
from sluice.protocols.pulsar.correlation import (
    MAX_PENDING_REQUEST_BYTES,
    MAX_PENDING_REQUESTS,
    SEND_TABLE,
    Correlator,
    Sends,
    SendTable,
)

T = Type.Value
NO_REQUEST = 2**64 - 1
TOPIC = "persistent://t/n/orders"
TABLES = sorted({SendTable, SEND_TABLE}, key=lambda table: table.__module__)


def frame(name: str, body: Message) -> Any:
    return decode_frame(encode(command(T(name), body)))


def send(producer_id: int, sequence_id: int) -> Any:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    return decode_frame(encode_payload(cmd, meta, b"hello"))


def receipt(producer_id: int, sequence_id: int) -> Any:
    body = pb.CommandSendReceipt(producer_id=producer_id, sequence_id=sequence_id)
    return frame("SEND_RECEIPT", body)


def with_producer(table: type[Sends], producer_id: int = 1) -> Correlator:
    c = Correlator(sends=table())
    body = pb.CommandProducer(topic=TOPIC, producer_id=producer_id, request_id=100 + producer_id)
    c.observe(frame("PRODUCER", body), True, 0.0)
    ok = pb.CommandProducerSuccess(request_id=100 + producer_id, producer_name="p")
    assert c.observe(frame("PRODUCER_SUCCESS", ok), False, 0.1) is not None
    assert c.producers == {producer_id: TOPIC}
    return c


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.__module__)
def test_a_producer_the_broker_closes_leaves_no_send_in_flight(table: type[Sends]) -> None:
    # A broker unloading a topic closes its producers and sends no receipt,
    # nor error, for their SENDs in flight ("the client will retry"): the
    # client sends them again after it re-creates the producer, here or on
    # another connection. Kept, they would hold the drain until its timeout
    # and time the resent SENDs from the first try.
    c = with_producer(table)
    body = pb.CommandProducer(topic="persistent://t/n/other", producer_id=2, request_id=7)
    c.observe(frame("PRODUCER", body), True, 0.0)
    c.observe(frame("PRODUCER_SUCCESS", pb.CommandProducerSuccess(request_id=7, producer_name="q")),
              False, 0.1)  # fmt: skip
    for seq in (5, 6, 6):  # 6 twice: two chunks of one message
        c.observe(send(1, seq), True, 1.0)
    c.observe(send(2, 5), True, 1.0)
    assert c.in_flight_sends == 4
    close = pb.CommandCloseProducer(producer_id=1, request_id=NO_REQUEST)
    assert c.observe(frame("CLOSE_PRODUCER", close), False, 2.0) is None
    assert c.producers == {2: "persistent://t/n/other"}
    assert c.in_flight_sends == 1  # producer 2's SEND only
    assert [w[:2] for w in c.sends.waiting()] == [(2, 5)]
    # The client re-creates producer 1 and sends 5 and 6 again: timed from now.
    body = pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=8)
    c.observe(frame("PRODUCER", body), True, 3.0)
    c.observe(frame("PRODUCER_SUCCESS", pb.CommandProducerSuccess(request_id=8, producer_name="p")),
              False, 3.1)  # fmt: skip
    c.observe(send(1, 5), True, 4.0)
    c.observe(send(1, 6), True, 4.0)
    done = [c.observe(receipt(1, seq), False, 4.5) for seq in (5, 6)]
    assert [d.seconds if d else None for d in done] == [pytest.approx(0.5)] * 2
    assert c.in_flight_sends == 1


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.__module__)
def test_a_producer_the_client_closed_leaves_no_send_in_flight_once_answered(
    table: type[Sends],
) -> None:
    # A broker answers CLOSE_PRODUCER once the producer's SENDs in flight
    # are answered; one that it failed meanwhile is never answered.
    c = with_producer(table)
    for seq in (5, 6):
        c.observe(send(1, seq), True, 1.0)
    close = pb.CommandCloseProducer(producer_id=1, request_id=9)
    c.observe(frame("CLOSE_PRODUCER", close), True, 2.0)
    assert c.in_flight_sends == 2  # receipts may still come, before the answer
    done = c.observe(receipt(1, 5), False, 2.5)
    assert done is not None and done.topic == TOPIC
    answer = c.observe(frame("SUCCESS", pb.CommandSuccess(request_id=9)), False, 3.0)
    assert answer is not None and answer.request_type == T("CLOSE_PRODUCER")
    assert c.in_flight_sends == 0
    assert c.sends.waiting() == []


def get_schema(request_id: int, topic: str = TOPIC) -> Any:
    return frame("GET_SCHEMA", pb.CommandGetSchema(request_id=request_id, topic=topic))


def test_requests_never_answered_are_kept_up_to_a_bound() -> None:
    # pulsar-lite never answers GET_SCHEMA, a hung broker nothing: a client
    # that keeps asking (a new request id each time, as clients do after a
    # timeout) must not grow the connection's memory without end.
    c = Correlator()
    asked = MAX_PENDING_REQUESTS + 500
    for rid in range(asked):
        c.observe(get_schema(rid), True, float(rid))
    assert len(c.requests) == MAX_PENDING_REQUESTS
    # The oldest went first; the latest are still answered and timed.
    assert 0 not in c.requests and asked - 1 in c.requests
    answer = pb.CommandGetSchemaResponse(request_id=asked - 1)
    done = c.observe(frame("GET_SCHEMA_RESPONSE", answer), False, asked + 1.0)
    assert done is not None and done.seconds == pytest.approx(2.0) and done.topic == TOPIC


def test_requests_holding_large_frames_are_kept_up_to_a_size() -> None:
    c = Correlator()
    topic = "persistent://t/n/" + "x" * 100_000  # about 100 kB per request
    count = MAX_PENDING_REQUEST_BYTES // 100_000 + 50
    for rid in range(count):
        c.observe(get_schema(rid, topic), True, 0.0)
    held = sum(len(p.request.raw) for p in c.requests.values() if p.request is not None)
    assert held <= MAX_PENDING_REQUEST_BYTES
    assert count - 1 in c.requests and 0 not in c.requests


def test_a_request_id_used_again_replaces_the_request_and_is_kept_as_new() -> None:
    c = Correlator()
    c.observe(get_schema(1, "persistent://t/n/first"), True, 0.0)
    for rid in range(2, MAX_PENDING_REQUESTS + 1):
        c.observe(get_schema(rid), True, 1.0)
    c.observe(get_schema(1, "persistent://t/n/again"), True, 2.0)  # the newest now
    c.observe(get_schema(MAX_PENDING_REQUESTS + 1), True, 3.0)  # evicts rid 2, not 1
    assert 1 in c.requests and 2 not in c.requests
    answer = pb.CommandGetSchemaResponse(request_id=1)
    done = c.observe(frame("GET_SCHEMA_RESPONSE", answer), False, 4.0)
    assert done is not None and done.topic == "persistent://t/n/again"


def subscribe(c: Correlator, consumer_id: int, request_id: int) -> None:
    body = pb.CommandSubscribe(
        topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Shared,
        consumer_id=consumer_id, request_id=request_id,
    )  # fmt: skip
    c.observe(frame("SUBSCRIBE", body), True, 0.0)
    c.observe(frame("SUCCESS", pb.CommandSuccess(request_id=request_id)), False, 0.1)


def test_a_consumer_unsubscribed_is_gone() -> None:
    # A consumer that unsubscribed is closed with its subscription: the
    # client sends no CLOSE_CONSUMER for it, and a drain must not close it.
    c = Correlator()
    subscribe(c, 3, 1)
    subscribe(c, 4, 2)
    unsubscribe = pb.CommandUnsubscribe(consumer_id=3, request_id=5)
    c.observe(frame("UNSUBSCRIBE", unsubscribe), True, 1.0)
    assert 3 in c.consumers  # until the broker says so
    done = c.observe(frame("SUCCESS", pb.CommandSuccess(request_id=5)), False, 1.5)
    assert done is not None and done.topic == TOPIC
    assert c.consumers == {4: TOPIC}
    # One the broker refused to unsubscribe stays.
    c.observe(frame("UNSUBSCRIBE", pb.CommandUnsubscribe(consumer_id=4, request_id=6)), True, 2.0)
    refused = pb.CommandError(request_id=6, error=pb.MetadataError, message="no")
    c.observe(frame("ERROR", refused), False, 2.5)
    assert c.consumers == {4: TOPIC}
