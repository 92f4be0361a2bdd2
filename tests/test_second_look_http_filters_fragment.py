"""A request target with a ``#`` in it: h11 takes it, Sluice passes it on,
and the broker's web server (Jetty) reads what follows ``#`` as a fragment,
routing by the path before it. The filters' refusal reads it the same way."""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.filtering import DELIVER, PRODUCE
from sluice.protocols.http import origin_form
from sluice.protocols.http.filtered import message_traffic
from tests.test_http_filters_relay import get, relay, status
from tests.test_http_relay import Upstream, exchange, ok

ORDERS = "persistent://public/default/orders"


@pytest.mark.parametrize(
    ("method", "target", "direction"),
    [
        (b"GET", b"/ws/v2/producer/persistent/public/default/orders#x", PRODUCE),
        (b"GET", b"/ws/v2/consumer/persistent/public/default/orders/sub#", DELIVER),
        (b"POST", b"/topics/persistent/public/default/orders#x", PRODUCE),
        (b"GET", b"/admin/v2/persistent/public/default/orders/examinemessage#x", DELIVER),
        (b"GET", b"/admin/v2/persistent/public/default/orders/subscription/s/position/1#",
         DELIVER),
        (b"GET", b"/ws/v3/consumer/sub?topics=orders#x", DELIVER),
    ],
)  # fmt: skip
def test_a_fragment_is_no_part_of_the_topic(method: bytes, target: bytes, direction: str) -> None:
    traffic = message_traffic(method, origin_form(target))
    assert traffic is not None, target
    assert traffic.direction == direction
    assert ORDERS in traffic.topics, traffic


async def test_a_websocket_producer_with_a_fragment_is_refused() -> None:
    upstream = Upstream(ok())
    spec = FilterSpec("schema", topics=(ORDERS,))
    async with relay(upstream, (spec,)) as (_, port, _m):
        answer = await exchange(port, get(b"/ws/v2/producer/persistent/public/default/orders#"))
    assert status(answer) == 403, answer
    assert upstream.heads == []
