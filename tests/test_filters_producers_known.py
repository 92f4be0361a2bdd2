"""A producer's (consumer's) topic is known from the client's own request
on: the filters of that topic cannot be got round by keeping Sluice from
pairing the broker's answer with the request."""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Action, Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.correlation import MAX_PENDING_REQUESTS
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import messages
from tests.test_filters import TOPIC, WORDS, _batch, _core
from tests.test_pulsar_core import frame_bytes, names, sent

T = pb.BaseCommand
OTHER = "persistent://public/default/elsewhere"  # no filter: the gate passes it
LOUD = [b"shout it"]


def _producer(producer_id: int, request_id: int, topic: str = TOPIC) -> bytes:
    body = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=request_id)
    return frame_bytes("PRODUCER", body)


def _lookup(request_id: int) -> bytes:
    return frame_bytes("LOOKUP", pb.CommandLookupTopic(topic=OTHER, request_id=request_id))


def _send(producer_id: int, payloads: list[bytes]) -> bytes:
    meta, data = _batch(payloads)
    body = pb.CommandSend(producer_id=producer_id, sequence_id=0, num_messages=len(payloads))
    return encode_payload(command(T.SEND, body), meta, data)


def _filtered(out: list[Action], producer_id: int) -> bool:
    """Whether the SEND the broker got went through the filter (upper-cased)."""
    (frame,) = [f for f in sent(out, Peer.BROKER) if f.type == T.SEND]
    assert frame.body.producer_id == producer_id
    return [m.payload for m in messages(frame)] == [b"SHOUT IT"]


def _success(request_id: int) -> bytes:
    ok = pb.CommandProducerSuccess(request_id=request_id, producer_name="q")
    return frame_bytes("PRODUCER_SUCCESS", ok)


def test_a_request_id_used_again_does_not_unfilter_the_producer() -> None:
    """The PRODUCER's request id used again by a LOOKUP sent before the
    answer: the broker's PRODUCER_SUCCESS was paired with the LOOKUP, and
    the producer's SENDs went on unfiltered (in plaintext, on a topic that
    encrypts)."""
    core, _ = _core(FilterSpec(WORDS))
    core.receive_client(_producer(3, 50) + _lookup(50), 1.0)
    core.receive_broker(_success(50), 1.1)
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


def test_a_producer_pushed_out_of_the_pending_requests_stays_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    lookups = b"".join(_lookup(100 + i) for i in range(MAX_PENDING_REQUESTS + 1))
    core.receive_client(_producer(3, 50) + lookups, 1.0)
    assert 50 not in core.correlator.requests  # the PRODUCER's answer pairs with nothing
    core.receive_broker(_success(50), 1.1)
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


def test_an_id_open_on_a_filtered_topic_is_not_made_again_elsewhere() -> None:
    """A PRODUCER for an id open on another topic is answered by Sluice: a
    broker that had not made the first (its refusal unseen) would make
    this one, and its SENDs would be filtered as the first topic's."""
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_client(_producer(1, 60, OTHER), 1.0)
    assert names(out, Peer.BROKER) == []
    (error,) = sent(out, Peer.CLIENT)
    assert (error.type, error.body.request_id, error.body.error) == (
        T.ERROR,
        60,
        pb.NotAllowedError,
    )
    assert "producer id 1 is open on 'persistent://public/default/orders'" in error.body.message
    # The same topic again (a client repeating its PRODUCER) goes on.
    assert names(core.receive_client(_producer(1, 61), 1.1), Peer.BROKER) == ["PRODUCER"]
    # Closed, the id may be used for another topic: once the broker agrees
    # (until then it is still open there; official clients never reuse ids).
    close = pb.CommandCloseProducer(producer_id=1, request_id=62)
    core.receive_client(frame_bytes("CLOSE_PRODUCER", close), 1.2)
    assert names(core.receive_client(_producer(1, 63, OTHER), 1.3), Peer.BROKER) == []
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=62)), 1.4)
    assert names(core.receive_client(_producer(1, 64, OTHER), 1.5), Peer.BROKER) == ["PRODUCER"]


def test_a_refused_producer_is_forgotten_unless_the_broker_made_it() -> None:
    core, _ = _core(FilterSpec(WORDS))
    refused = pb.CommandError(request_id=70, error=pb.TopicNotFound, message="no")
    core.receive_client(_producer(4, 70), 1.0)
    core.receive_broker(frame_bytes("ERROR", refused), 1.1)
    assert 4 not in core.correlator.producers
    # Asked twice; the second answered first, made; the first refused after.
    core.receive_client(_producer(5, 71) + _producer(5, 72), 1.2)
    core.receive_broker(_success(72), 1.3)
    busy = pb.CommandError(request_id=71, error=pb.ServiceNotReady, message="being created")
    core.receive_broker(frame_bytes("ERROR", busy), 1.4)
    assert core.correlator.producers[5] == TOPIC
    assert _filtered(core.receive_client(_send(5, LOUD), 1.5), 5)


def test_a_consumer_whose_answer_went_unpaired_gets_filtered_deliveries() -> None:
    core, _ = _core(FilterSpec(WORDS))
    subscribe = pb.CommandSubscribe(topic=TOPIC, subscription="t", consumer_id=6, request_id=80,
                                    subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(frame_bytes("SUBSCRIBE", subscribe) + _lookup(80), 1.0)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=80)), 1.1)
    meta, data = _batch([b"hello"])
    body = pb.CommandMessage(consumer_id=6, message_id=pb.MessageIdData(ledgerId=1, entryId=3))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.2)
    (frame,) = sent(out, Peer.CLIENT)
    (message,) = messages(frame)
    assert message.metadata is not None
    assert {p.key: p.value for p in message.metadata.properties} == {"seen-by": "sluice"}


def test_a_busy_refusal_does_not_forget_a_producer_made_unseen() -> None:
    """PRODUCER 50 and again 51 for one id, then a LOOKUP reusing 50: the
    broker refuses 51 (busy) and makes 50, whose answer pairs with the
    LOOKUP. The refusal made the id forgotten, its SENDs unfiltered."""
    core, _ = _core(FilterSpec(WORDS))
    core.receive_client(_producer(3, 50) + _producer(3, 51) + _lookup(50), 1.0)
    busy = pb.CommandError(request_id=51, error=pb.ServiceNotReady,
                           message="Producer is already present on the connection")  # fmt: skip
    core.receive_broker(frame_bytes("ERROR", busy), 1.1)
    core.receive_broker(_success(50), 1.2)  # made: paired with the LOOKUP
    assert _filtered(core.receive_client(_send(3, LOUD), 1.3), 3)
