"""A producer or consumer the client is closing is still open at the broker
until the broker answers the close: what comes for it meanwhile must go
through its topic's filters.

A consumer that gives permits and closes at once is sent the messages the
broker dispatched before it read the close, and a SEND right behind the
client's CLOSE_PRODUCER reaches the broker before its close completes:
both go through the topic's filters, since the core keeps the topic of a
closing producer (consumer) until the broker agrees to the close
(``Correlator._client_frame``, ``_closed``).
"""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _send
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _skip_me(consumer_id: int = 2) -> bytes:
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(
        consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=1, entryId=9)
    )
    return encode_payload(command(T.MESSAGE, body), meta, data)


def test_a_delivery_to_an_open_consumer_is_skipped() -> None:
    """The filter at work: the delivery is refused (the control)."""
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_broker(_skip_me(), 1.0)
    assert sent(out, Peer.CLIENT) == []


def test_a_delivery_dispatched_before_the_close_is_still_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseConsumer(consumer_id=2, request_id=90)
    core.receive_client(frame_bytes("CLOSE_CONSUMER", close), 1.0)
    # The broker dispatched it before it read the close.
    out = core.receive_broker(_skip_me(), 1.1)
    assert sent(out, Peer.CLIENT) == []


def test_a_send_of_an_open_producer_is_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    assert _filtered(core.receive_client(_send(1, LOUD), 1.0), 1)


def test_a_send_behind_the_close_of_its_producer_is_still_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseProducer(producer_id=1, request_id=91)
    out = core.receive_client(frame_bytes("CLOSE_PRODUCER", close) + _send(1, LOUD), 1.0)
    sends = [a for a in out if a.to is Peer.BROKER]  # type: ignore[union-attr]
    assert _filtered(sends, 1)


def test_a_close_the_broker_agreed_to_frees_the_id() -> None:
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseProducer(producer_id=1, request_id=91)
    core.receive_client(frame_bytes("CLOSE_PRODUCER", close), 1.0)
    assert core.correlator.producers.get(1) is not None  # closing: still the broker's
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=91)), 1.1)
    assert 1 not in core.correlator.producers
    # Free again: a producer of another topic may have it (not refused as open elsewhere).
    producer = pb.CommandProducer(topic="persistent://public/default/other", producer_id=1,
                                  request_id=92)  # fmt: skip
    out = core.receive_client(frame_bytes("PRODUCER", producer), 1.2)
    assert [a for a in out if a.to is Peer.BROKER]  # type: ignore[union-attr]
    assert sent(out, Peer.CLIENT) == []


def test_a_close_the_broker_refused_keeps_the_consumer_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseConsumer(consumer_id=2, request_id=93)
    core.receive_client(frame_bytes("CLOSE_CONSUMER", close), 1.0)
    error = pb.CommandError(request_id=93, error=pb.UnknownError, message="no")
    core.receive_broker(frame_bytes("ERROR", error), 1.1)
    out = core.receive_broker(_skip_me(), 1.2)  # still open at the broker
    assert sent(out, Peer.CLIENT) == []
    core.receive_client(frame_bytes("CLOSE_CONSUMER", close), 1.3)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=93)), 1.4)
    assert 2 not in core.correlator.consumers


def test_a_close_of_a_producer_or_consumer_sluice_does_not_know_is_answered() -> None:
    """A close for an id Sluice never knew (refused, or opened before the
    recording began), agreed to by the broker, is passed on like any."""
    core, _ = _core(FilterSpec(WORDS))
    for name, body in (
        ("CLOSE_PRODUCER", pb.CommandCloseProducer(producer_id=7, request_id=95)),
        ("CLOSE_CONSUMER", pb.CommandCloseConsumer(consumer_id=8, request_id=96)),
    ):
        core.receive_client(frame_bytes(name, body), 1.0)
        ok = pb.CommandSuccess(request_id=body.request_id)
        out = core.receive_broker(frame_bytes("SUCCESS", ok), 1.1)
        assert [f.type for f in sent(out, Peer.CLIENT)] == [T.SUCCESS]
