"""Against Apache Pulsar 4.0.8 with its WebSocket service on: through
Sluice's HTTP listener, a WebSocket producer to a topic the ``schema``
filter covers is refused (its messages would reach the broker unchecked),
while one to an unfiltered topic works as before."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import websocket

from sluice.brokers.apache_pulsar import ApachePulsar
from tests.test_http import WebProxy, start_web_proxy
from tests.test_websocket import to_send, ws_url

TIMEOUT = 30
FILTERED = "persistent://public/default/ws-filtered-*"


@pytest.fixture
def filtered_web(ws_broker: ApachePulsar, tmp_path: Path) -> Iterator[WebProxy]:
    spec = "schema:" + json.dumps({"topics": [FILTERED], "direction": "produce"})
    w = start_web_proxy(ws_broker, tmp_path, ws_broker.http_url, "--filter", spec)
    yield w
    w.proxy.kill()
    assert "Traceback" not in w.proxy.log(), w.proxy.log()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_a_websocket_producer_to_a_filtered_topic_is_refused(filtered_web: WebProxy) -> None:
    tag = uuid.uuid4().hex[:8]
    refused_topic = f"persistent/public/default/ws-filtered-{tag}"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            ws_url(filtered_web, f"/ws/v2/producer/{refused_topic}"), timeout=TIMEOUT
        )
    assert refused.value.status_code == 403
    body = (refused.value.resp_body or b"").decode()
    assert f"persistent://public/default/ws-filtered-{tag}" in body and "schema" in body, body
    assert filtered_web.metric("sluice_http_refused_total", reason="filtered") == 1

    producer = websocket.create_connection(
        ws_url(filtered_web, f"/ws/v2/producer/persistent/public/default/ws-open-{tag}"),
        timeout=TIMEOUT,
    )
    try:
        producer.send(to_send("1", b"hello"))
        ack = json.loads(producer.recv())
    finally:
        producer.close()
    assert ack["result"] == "ok", ack
    assert "403" in filtered_web.proxy.log()


@pytest.fixture
def schema_web(ws_broker: ApachePulsar, tmp_path: Path) -> Iterator[WebProxy]:
    """The schema filter as users write it: no direction (it runs on produce)."""
    spec = "schema:" + json.dumps({"topics": [FILTERED]})
    w = start_web_proxy(ws_broker, tmp_path, ws_broker.http_url, "--filter", spec)
    yield w
    w.proxy.kill()
    assert "Traceback" not in w.proxy.log(), w.proxy.log()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_a_websocket_consumer_of_a_topic_only_checked_on_produce_is_served(
    schema_web: WebProxy,
) -> None:
    """The filters in force decide, not their settings alone: ``schema``
    acts on what producers send, so its topics' consumers go on (the proxy
    hands the HTTP relay its made filters)."""
    tag = uuid.uuid4().hex[:8]
    topic = f"persistent/public/default/ws-filtered-{tag}"
    consumer = websocket.create_connection(
        ws_url(schema_web, f"/ws/v2/consumer/{topic}/sub-{tag}"), timeout=TIMEOUT
    )
    consumer.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(ws_url(schema_web, f"/ws/v2/producer/{topic}"),
                                    timeout=TIMEOUT)  # fmt: skip
    assert refused.value.status_code == 403
    assert schema_web.metric("sluice_http_refused_total", reason="filtered") == 1
