"""Which web requests carry messages (``sluice/protocols/http/filtered.py``),
and which configured filters cover them (``sluice.filters.chain.covering``):
what the HTTP listener refuses so that no message goes past a filter."""

from __future__ import annotations

import pytest

from sluice.filters.chain import covering, make_filters
from sluice.filters.config import FilterSpec
from sluice.protocols import registry
from sluice.protocols.filtering import DELIVER, PRODUCE
from sluice.protocols.http.filtered import message_traffic

ORDERS = "persistent://public/default/orders"


@pytest.mark.parametrize(
    ("method", "target", "direction", "topic"),
    [
        (b"GET", b"/ws/v2/producer/persistent/public/default/orders", PRODUCE, ORDERS),
        (b"GET", b"/ws/v2/consumer/persistent/public/default/orders/sub?x=1", DELIVER, ORDERS),
        (b"GET", b"/ws/v2/reader/persistent/public/default/orders?messageId=earliest",
         DELIVER, ORDERS),
        (b"GET", b"/ws/v2/producer/non-persistent/acme/shop/orders", PRODUCE,
         "non-persistent://acme/shop/orders"),
        # A topic name with a slash in it: the rest of the path.
        (b"GET", b"/ws/v2/consumer/persistent/public/default/a/b/sub", DELIVER,
         "persistent://public/default/a/b"),
        # v1: a cluster in the namespace.
        (b"GET", b"/ws/producer/persistent/acme/c1/shop/orders", PRODUCE,
         "persistent://acme/c1/shop/orders"),
        (b"GET", b"/ws/v2/producer/persistent/public/default/or%64ers", PRODUCE, ORDERS),
        (b"GET", b"/ws/v2/producer;x=1/persistent/public/default/orders", PRODUCE, ORDERS),
        (b"GET", b"/ws/v3/consumer/sub?topics=orders,other", DELIVER, ORDERS),
        (b"POST", b"/topics/persistent/public/default/orders", PRODUCE, ORDERS),
        (b"POST", b"/topics/persistent/public/default/orders/partitions/2", PRODUCE,
         ORDERS + "-partition-2"),
        (b"GET", b"/admin/v2/persistent/public/default/orders/examinemessage?x=1", DELIVER,
         ORDERS),
        (b"GET", b"/admin/v2/persistent/public/default/orders/subscription/s/position/1",
         DELIVER, ORDERS),
        (b"GET", b"/admin/v2/persistent/public/default/orders/ledger/3/entry/0", DELIVER,
         ORDERS),
    ],
)  # fmt: skip
def test_requests_that_carry_messages_are_named(
    method: bytes, target: bytes, direction: str, topic: str
) -> None:
    traffic = message_traffic(method, target)
    assert traffic is not None
    assert traffic.direction == direction
    assert topic in traffic.topics, traffic


@pytest.mark.parametrize(
    ("method", "target"),
    [
        (b"GET", b"/admin/v2/persistent/public/default/orders/stats"),
        (b"PUT", b"/admin/v2/persistent/public/default/orders"),
        (b"GET", b"/lookup/v2/topic/persistent/public/default/orders"),
        (b"GET", b"/topics/persistent/public/default/orders"),
        (b"GET", b"/ws/pong"),
        (b"GET", b"/metrics"),
    ],
)
def test_requests_that_carry_no_messages_are_not(method: bytes, target: bytes) -> None:
    assert message_traffic(method, target) is None


def test_a_topic_pattern_stands_for_any_topic() -> None:
    traffic = message_traffic(b"GET", b"/ws/v3/consumer/sub?topicsPattern=persistent://a/b/.*")
    assert traffic is not None and traffic.any_topic and traffic.direction == DELIVER


def test_a_plus_is_read_both_ways() -> None:
    traffic = message_traffic(b"GET", b"/ws/v2/producer/persistent/public/default/a+b")
    assert traffic is not None
    assert traffic.topics == {"persistent://public/default/a+b", "persistent://public/default/a b"}


def test_covering_picks_what_the_binary_chain_picks() -> None:
    specs = [
        FilterSpec("schema", topics=("persistent://public/default/orders*",)),
        FilterSpec("schema", topics=("acme/*",), roles=("shop-*",), label="roled"),
    ]
    made = make_filters(specs, registry.get("pulsar"))
    for topic in (ORDERS, ORDERS + "-partition-3", "orders", "other", "persistent://acme/x"):
        for direction in (PRODUCE, DELIVER):
            for role in ("shop-1", "guest"):
                chain = made.chain(topic, direction, role)
                got = covering(made.loaded, topic, direction, role)
                assert bool(got) == (chain is not None), (topic, direction, role)
    # The schema filter has no deliver hook: consumers are not covered.
    assert covering(made.loaded, ORDERS, DELIVER, None) == []
    assert covering(made.loaded, ORDERS, PRODUCE, None) == ["schema"]
    # An unknown role (None) fails closed on a filter that names roles.
    assert covering(made.loaded, "persistent://acme/x", PRODUCE, None) == ["roled"]
    assert covering(made.loaded, "persistent://acme/x", PRODUCE, "guest") == []
    # A pattern (None) is any topic.
    assert covering(made.loaded, None, PRODUCE, "guest") == ["schema"]
    # Specs not made count for every direction they run in.
    assert covering(specs, ORDERS, DELIVER, None) == ["schema"]
