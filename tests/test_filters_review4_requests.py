"""A request id the client uses twice, the older request first: a refusal
of the older one pairs with the PRODUCER (SUBSCRIBE) that took its id, and
Sluice forgets a producer (consumer) the broker then makes.

The client sends a request the broker refuses at once (a LOOKUP of a name
it cannot parse, an UNSUBSCRIBE of a consumer it does not have: "Consumer
not found") and, with the same request id, a PRODUCER for a filtered
topic. The correlator keeps the newer request under the id, and the broker's
quick refusal of the older one is paired with the PRODUCER. It was
forgotten as refused, while the broker made it: its SENDs passed every
filter (in plaintext to a topic that encrypts), and a consumer's
deliveries the deliver filters. A request whose id was in use is now
answered ambiguously (``Correlator._unpaired``): a PRODUCER (SUBSCRIBE)
is kept as possibly made, and a close or UNSUBSCRIBE forgets nothing.

The last review covered the other order (the PRODUCER first, the LOOKUP
reusing its id: ``test_filters_producers_known``), where the replaced
PRODUCER is kept as possibly made (``_unpaired``).
"""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import TOPIC, WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _send, _success
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _bad_lookup(request_id: int) -> tuple[bytes, bytes]:
    """A LOOKUP and the broker's quick refusal of it."""
    ask = pb.CommandLookupTopic(topic="no/such", request_id=request_id)
    no = pb.CommandLookupTopicResponse(request_id=request_id, error=pb.InvalidTopicName,
                                       response=pb.CommandLookupTopicResponse.Failed)  # fmt: skip
    return frame_bytes("LOOKUP", ask), frame_bytes("LOOKUP_RESPONSE", no)


def _bad_unsubscribe(request_id: int) -> tuple[bytes, bytes]:
    """An UNSUBSCRIBE of a consumer there is none of, and the broker's refusal."""
    ask = pb.CommandUnsubscribe(consumer_id=99, request_id=request_id)
    no = pb.CommandError(request_id=request_id, error=pb.MetadataError,
                         message="Consumer not found")  # fmt: skip
    return frame_bytes("UNSUBSCRIBE", ask), frame_bytes("ERROR", no)


@pytest.mark.parametrize("older", [_bad_lookup, _bad_unsubscribe])
def test_a_refusal_of_an_older_request_with_the_id_does_not_unfilter_a_producer(
    older: object,
) -> None:
    core, _ = _core(FilterSpec(WORDS))
    ask, refusal = older(50)  # type: ignore[operator]
    core.receive_client(ask + _producer(3, 50), 1.0)
    core.receive_broker(refusal, 1.05)  # the broker answers the older request first
    core.receive_broker(_success(50), 1.1)  # and makes the producer
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


def test_a_refusal_of_an_older_request_with_the_id_does_not_unfilter_a_consumer() -> None:
    core, _ = _core(FilterSpec(WORDS))
    ask, refusal = _bad_unsubscribe(80)
    subscribe = pb.CommandSubscribe(topic=TOPIC, subscription="t", consumer_id=6, request_id=80,
                                    subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(ask + frame_bytes("SUBSCRIBE", subscribe), 1.0)
    core.receive_broker(refusal, 1.05)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=80)), 1.1)
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(consumer_id=6, message_id=pb.MessageIdData(ledgerId=1, entryId=3))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.2)
    assert sent(out, Peer.CLIENT) == []  # skipped, as on any filtered consumer


def test_a_success_of_an_older_request_with_the_id_does_not_forget_a_consumer() -> None:
    """The other way: an UNSUBSCRIBE (or close) taking the id of a request
    the broker answers SUCCESS at once, then refusing the UNSUBSCRIBE: the
    consumer is still subscribed, and its deliveries still filtered."""
    core, _ = _core(FilterSpec(WORDS))
    close = pb.CommandCloseProducer(producer_id=99, request_id=81)  # (none such: SUCCESS)
    unsubscribe = pb.CommandUnsubscribe(consumer_id=2, request_id=81)
    core.receive_client(frame_bytes("CLOSE_PRODUCER", close)
                        + frame_bytes("UNSUBSCRIBE", unsubscribe), 1.0)  # fmt: skip
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=81)), 1.05)
    refused = pb.CommandError(request_id=81, error=pb.MetadataError, message="other consumers")
    core.receive_broker(frame_bytes("ERROR", refused), 1.1)
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=4))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.2)
    assert sent(out, Peer.CLIENT) == []
