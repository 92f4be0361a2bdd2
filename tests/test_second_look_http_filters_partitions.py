"""REST produce to ``…/TOPIC/partitions/N`` is refused where the broker
would write to a filtered topic: Apache Pulsar writes to the topic itself
for ``N`` = -1 (``TopicName.getPartition(-1)``, as for a name already a
partition's), and reads ``N`` as a Java int (``02`` and ``+2`` are 2)."""

from __future__ import annotations

import pytest

from sluice.filters.chain import covering, make_filters
from sluice.filters.config import FilterSpec
from sluice.protocols import registry
from sluice.protocols.filtering import PRODUCE
from sluice.protocols.http import origin_form
from sluice.protocols.http.filtered import message_traffic
from tests.test_http_filters_relay import relay, status
from tests.test_http_relay import Upstream, exchange, ok

ORDERS = "persistent://public/default/orders"


def covered_by(spec: FilterSpec, target: bytes) -> list[str]:
    traffic = message_traffic(b"POST", origin_form(target))
    assert traffic is not None and traffic.direction == PRODUCE
    made = make_filters([spec], registry.get("pulsar"))
    return sorted({n for t in traffic.topics for n in covering(made.loaded, t, PRODUCE, None)})


@pytest.mark.parametrize(
    ("target", "topic"),
    [
        (b"/topics/persistent/public/default/orders/partitions/-1", ORDERS),
        # A name that is a partition's already: the broker writes to it.
        (b"/topics/persistent/public/default/orders-partition-1/partitions/0",
         ORDERS + "-partition-1"),
        (b"/topics/persistent/public/default/orders/partitions/02", ORDERS + "-partition-2"),
        (b"/topics/persistent/public/default/orders/partitions/+2", ORDERS + "-partition-2"),
        (b"/topics/persistent/public/default/orders/partitions/%2B2", ORDERS + "-partition-2"),
        (b"/topics/non-persistent/public/default/orders/partitions/-1",
         "non-persistent://public/default/orders"),
    ],
)  # fmt: skip
def test_the_topic_the_broker_writes_to_is_named(target: bytes, topic: str) -> None:
    spec = FilterSpec("schema", topics=(topic,))
    assert covered_by(spec, target) == ["schema"], message_traffic(b"POST", origin_form(target))


def test_other_partitions_of_a_filtered_partition_still_relay() -> None:
    spec = FilterSpec("schema", topics=(ORDERS + "-partition-2",))
    assert covered_by(spec, b"/topics/persistent/public/default/orders/partitions/3") == []
    assert covered_by(spec, b"/topics/persistent/public/default/orders/partitions/2") == ["schema"]


async def test_rest_produce_to_partition_minus_one_of_a_filtered_topic_is_refused() -> None:
    upstream = Upstream(ok())
    spec = FilterSpec("schema", topics=(ORDERS,))
    async with relay(upstream, (spec,)) as (_, port, _m):
        answer = await exchange(
            port,
            b"POST /topics/persistent/public/default/orders/partitions/-1 HTTP/1.1\r\n"
            b"Host: s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        )
    assert status(answer) == 403, answer
    assert upstream.heads == []
