"""A producer or consumer the client is closing is still open at the broker
until the broker answers the close: what comes for it meanwhile must go
through its topic's filters.

Sluice forgets the topic of a producer (consumer) as soon as the client's
CLOSE_PRODUCER (CLOSE_CONSUMER) goes by, before the broker has closed it.
A consumer that gives permits and closes at once is sent the messages
the broker dispatched before it read the close: they came after Sluice
forgot the consumer, and went to the client unfiltered (a deliver
filter's refusal skipped). A SEND right behind the client's
CLOSE_PRODUCER went to the broker unfiltered too; the broker removes the
producer only once its close completes, after the SENDs it holds.

The fix is in the core's bookkeeping (``sluice/protocols/pulsar/
correlation.py``, ``Correlator._client_frame``), not in the filters: keep
the topic of a closing producer (consumer) for filtering until the
broker's answer to the close (SUCCESS or ERROR for its request id), or
its own CLOSE_*; ``open_elsewhere`` may go on treating the id as free.
"""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _send
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand
FIX = "the core forgets a closing producer's (consumer's) topic before the broker closed it"


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


@pytest.mark.xfail(strict=True, reason=FIX)
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


@pytest.mark.xfail(strict=True, reason=FIX)
def test_a_send_behind_the_close_of_its_producer_is_still_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseProducer(producer_id=1, request_id=91)
    out = core.receive_client(frame_bytes("CLOSE_PRODUCER", close) + _send(1, LOUD), 1.0)
    sends = [a for a in out if a.to is Peer.BROKER]  # type: ignore[union-attr]
    assert _filtered(sends, 1)
