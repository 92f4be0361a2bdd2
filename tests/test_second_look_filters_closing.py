"""Second look at a closing producer (consumer) kept until its close is answered.

The Java client, when creating a producer (consumer) times out, sends a
CLOSE_PRODUCER (CLOSE_CONSUMER) for it "in case it was indeed created", and
does not wait for the answer: after its backoff it asks again, on the same
connection, with the same producer (consumer) id and the same topic. A slow
broker (the reason the creation timed out) answers the close after the new
PRODUCER (SUBSCRIBE) went by. The core forgot the id when that close was
answered, though the new request had made it again: the producer's SENDs
(the consumer's deliveries) then went past every filter.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pulsar
import pytest

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.helpers.support import client, start_proxy
from tests.test_filters import TOPIC, WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _send, _success
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _ok(request_id: int) -> bytes:
    return frame_bytes("SUCCESS", pb.CommandSuccess(request_id=request_id))


def _timed_out(request_id: int) -> bytes:
    error = pb.CommandError(request_id=request_id, error=pb.ServiceNotReady, message="closed")
    return frame_bytes("ERROR", error)


def _close_producer(producer_id: int, request_id: int) -> bytes:
    close = pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id)
    return frame_bytes("CLOSE_PRODUCER", close)


def _subscribe(consumer_id: int, request_id: int) -> bytes:
    subscribe = pb.CommandSubscribe(
        topic=TOPIC,
        subscription="t",
        consumer_id=consumer_id,
        request_id=request_id,
        subType=pb.CommandSubscribe.Shared,
    )
    return frame_bytes("SUBSCRIBE", subscribe)


def _skip_me(consumer_id: int) -> bytes:
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(
        consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=1, entryId=9)
    )
    return encode_payload(command(T.MESSAGE, body), meta, data)


def test_a_producer_asked_again_behind_its_unanswered_close_stays_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50), 1.0)  # times out at the client
    core.receive_client(_close_producer(3, 51), 31.0)  # "in case it was created"
    core.receive_client(_producer(3, 52), 31.1)  # asked again after the backoff
    core.receive_broker(_timed_out(50), 31.2)  # the broker, at last
    core.receive_broker(_ok(51), 31.3)
    core.receive_broker(_success(52), 31.4)
    assert _filtered(core.receive_client(_send(3, LOUD), 31.5), 3)


def test_a_producer_asked_again_stays_filtered_whatever_answer_comes_first() -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50), 1.0)
    core.receive_client(_close_producer(3, 51), 31.0)
    core.receive_client(_producer(3, 52), 31.1)
    core.receive_broker(_ok(51), 31.2)  # the close answered first
    core.receive_broker(_timed_out(50), 31.3)
    core.receive_broker(_success(52), 31.4)
    assert _filtered(core.receive_client(_send(3, LOUD), 31.5), 3)


def test_a_consumer_subscribed_again_behind_its_unanswered_close_stays_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_subscribe(6, 60), 1.0)  # times out at the client
    close = pb.CommandCloseConsumer(consumer_id=6, request_id=61)
    core.receive_client(frame_bytes("CLOSE_CONSUMER", close), 31.0)
    core.receive_client(_subscribe(6, 62), 31.1)
    core.receive_broker(_timed_out(60), 31.2)
    core.receive_broker(_ok(61), 31.3)
    core.receive_broker(_ok(62), 31.4)
    out = core.receive_broker(_skip_me(6), 31.5)
    assert sent(out, Peer.CLIENT) == []  # skipped by the deliver filter


def test_a_closed_producer_is_still_forgotten() -> None:
    """The control: a close answered with nothing asked again forgets the id."""
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50), 1.0)
    core.receive_broker(_success(50), 1.1)
    core.receive_client(_close_producer(3, 51), 2.0)
    core.receive_broker(_ok(51), 2.1)
    assert 3 not in core.correlator.producers


def _stored(producer: pulsar.Producer, payload: bytes) -> bool:
    try:
        producer.send(payload)
    except pulsar.PulsarException:
        return False
    return True


@pytest.mark.e2e
def test_the_python_client_closing_and_opening_producers_and_consumers_stays_filtered(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """The official client's closes, answered by Apache Pulsar: a producer
    (consumer) opened after another's close is filtered; a closed one's id
    is free (its close answered with success)."""
    topic = f"persistent://public/default/second-look-closing-{uuid.uuid4().hex[:8]}"
    spec = json.dumps({"topics": [topic]})
    proxy = start_proxy(
        apache_pulsar.url, tmp_path, "--filter", f"tests.helpers.filters:Words:{spec}"
    )
    try:
        with client(proxy.url) as c:
            for _ in range(3):
                consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
                producer = c.create_producer(topic, batching_enabled=False)
                assert not _stored(producer, b"a bad one")  # refused by the filter
                assert _stored(producer, b"please skip me")
                assert _stored(producer, b"kept")
                got = consumer.receive(timeout_millis=15_000)
                assert got.data() == b"kept"  # the skipped one never reached it
                consumer.acknowledge(got)
                producer.close()
                consumer.close()
    finally:
        proxy.kill()
