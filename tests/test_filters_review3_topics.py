"""A topic named in another spelling is the same topic to the broker, and
gets the same filters.

Apache Pulsar takes any spelling its ``TopicName`` parses: ``orders`` and
``public/default/orders`` (the short forms), ``Persistent://...`` (the
domain in any case), ``/orders`` (empty parts of a short name dropped).
The broker makes the producer (consumer) on
``persistent://public/default/orders`` either way; Sluice matched the
spelling as sent against the filters' patterns, so a client that named
the topic in a short form wrote past its filters (unchecked, unencrypted),
and a consumer that did read past its deliver filters.
"""

from __future__ import annotations

import pytest

from sluice.filters.chain import Filters
from sluice.filters.config import FilterSpec, load
from sluice.protocols.core import Peer
from sluice.protocols.filtering import PRODUCE, topic_of
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import messages
from tests.test_filters import TOPIC, WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _send, _success
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand

# Spellings Apache Pulsar's TopicName takes for persistent://public/default/orders.
SPELLINGS = [
    "orders",
    "public/default/orders",
    "/orders",
    "orders/",
    "Persistent://public/default/orders",
    "PERSISTENT://public/default/orders",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_producer_on_another_spelling_of_the_topic_is_filtered(spelling: str) -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50, spelling), 1.0)
    core.receive_broker(_success(50), 1.1)
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_consumer_on_another_spelling_of_the_topic_is_filtered(spelling: str) -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    subscribe = pb.CommandSubscribe(topic=spelling, subscription="t", consumer_id=6,
                                    request_id=80, subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(frame_bytes("SUBSCRIBE", subscribe), 1.0)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=80)), 1.1)
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(consumer_id=6, message_id=pb.MessageIdData(ledgerId=1, entryId=3))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.2)
    assert sent(out, Peer.CLIENT) == []  # skipped: acknowledged in its name instead
    assert [f.type for f in sent(out, Peer.BROKER)] == [T.ACK, T.FLOW]


@pytest.mark.parametrize(
    ("name", "topic"),
    [
        ("orders", "persistent://public/default/orders"),
        ("acme/shop/orders", "persistent://acme/shop/orders"),
        ("Non-Persistent://acme/shop/orders", "non-persistent://acme/shop/orders"),
        # Java's equalsIgnoreCase: the long s upper-cases to S, the dotless i to I.
        ("per\u017f\u0131stent://acme/shop/orders", "persistent://acme/shop/orders"),
        ("persistent://acme/shop/orders-partition-2", "persistent://acme/shop/orders"),
        ("acme/shop/orders-partition-2", "persistent://acme/shop/orders"),
        # Java's Integer.parseInt takes a sign: the broker reads partition 2.
        ("persistent://acme/shop/orders-partition-+2", "persistent://acme/shop/orders"),
        # Not partitions, as the broker reads them.
        ("persistent://acme/shop/orders-partition-x", "persistent://acme/shop/orders-partition-x"),
        ("persistent://acme/shop/orders-partition-", "persistent://acme/shop/orders-partition-"),
        # A name the broker refuses stays as it came.
        ("a/b", "a/b"),
        ("ftp://a/b/c", "ftp://a/b/c"),
    ],
)
def test_a_topic_name_is_read_as_the_broker_reads_it(name: str, topic: str) -> None:
    assert topic_of(name) == topic


def test_a_pattern_without_scheme_matches_a_short_name() -> None:
    (loaded,) = load([FilterSpec(WORDS, ("acme/shop/*",))])
    filters = Filters([loaded])
    assert filters.chain("acme/shop/orders", PRODUCE, None) is not None
    assert filters.chain("orders", PRODUCE, None) is None  # public/default/orders


def test_the_filtered_send_of_a_short_name_is_rebuilt_whole() -> None:
    """The message the broker gets is the filter's (the topic spelled as
    the client spelled it in the producer)."""
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50, "orders"), 1.0)
    core.receive_broker(_success(50), 1.1)
    (frame,) = sent(core.receive_client(_send(3, [b"shout"]), 1.2), Peer.BROKER)
    assert [m.payload for m in messages(frame)] == [b"SHOUT"]
