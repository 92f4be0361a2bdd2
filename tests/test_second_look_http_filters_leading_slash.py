"""Every reading of a path with empty segments is checked (the module's
promise, for a web server that merges ``//``): a leading ``//`` too, for
REST produce and admin reads as for the WebSocket API."""

from __future__ import annotations

import pytest

from sluice.protocols.http import origin_form
from sluice.protocols.http.filtered import message_traffic

ORDERS = "persistent://public/default/orders"


@pytest.mark.parametrize(
    ("method", "target"),
    [
        (b"GET", b"//ws/v2/producer/persistent/public/default/orders"),
        (b"POST", b"//topics/persistent/public/default/orders"),
        (b"GET", b"//admin/v2/persistent/public/default/orders/examinemessage"),
    ],
)
def test_a_leading_empty_segment_is_read_both_ways(method: bytes, target: bytes) -> None:
    traffic = message_traffic(method, origin_form(target))
    assert traffic is not None and ORDERS in traffic.topics, traffic


def test_a_leading_empty_segment_on_other_calls_is_still_nothing() -> None:
    assert message_traffic(b"GET", b"//admin/v2/persistent/public/default/orders/stats") is None
    assert message_traffic(b"GET", b"//topics/persistent/public/default/orders") is None
