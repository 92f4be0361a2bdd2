"""The HTTP listener, in process, refuses the web requests that would carry
messages past a configured filter (the WebSocket API, REST produce, admin
peeks), and relays the rest as before. The upstream is the test's own small
web service (``tests/test_http_relay.py``): what it was asked shows what
went through."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.filters.chain import Filters, make_filters
from sluice.filters.config import FilterSpec
from sluice.protocols import registry
from sluice.protocols.http import parse_http_url
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.http import HttpRelay
from sluice.proxy.metrics import HttpMetrics
from tests.test_http_relay import Credentials, Upstream, exchange, ok, proxy_auth

SCHEMA = FilterSpec("schema", topics=("persistent://public/default/orders*",))
UPGRADE = b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" \
          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"  # fmt: skip


@asynccontextmanager
async def relay(
    upstream: Upstream,
    specs: tuple[FilterSpec, ...],
    credentials: Credentials | None = None,
    made: Callable[[], Filters | None] | None = None,
) -> AsyncIterator[tuple[HttpRelay, int, CollectorRegistry]]:
    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.serve)
        config = ProxyConfig(
            broker=parse_broker_url("pulsar://127.0.0.1:6650"),
            http_listen=Address("127.0.0.1", 0),
            broker_http=parse_http_url(f"http://127.0.0.1:{upstream.port}"),
            filters=specs,
        )

        async def listener_urls(urls: object) -> dict[str, str]:
            return {}

        registry_ = CollectorRegistry()
        extra: dict[str, Any] = {} if made is None else {"filters": made}
        web = HttpRelay(config, HttpMetrics(registry_), listener_urls, credentials, **extra)
        addresses = await web.open()
        nursery.start_soon(web.serve)
        yield web, addresses["http"].port, registry_
        nursery.cancel_scope.cancel()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def get(path: bytes, extra: bytes = b"") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: sluice\r\n" + extra + b"\r\n"


async def test_a_websocket_producer_to_a_filtered_topic_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = Upstream(ok())
    async with relay(upstream, (SCHEMA,)) as (_, port, metrics):
        with caplog.at_level(logging.INFO, "sluice.http"):
            answer = await exchange(
                port, get(b"/ws/v2/producer/persistent/public/default/orders", UPGRADE)
            )
            again = await exchange(
                port, get(b"/ws/v2/producer/persistent/public/default/orders-2", UPGRADE)
            )
        refused = metrics.get_sample_value("sluice_http_refused_total", {"reason": "filtered"})
        counted = metrics.get_sample_value(
            "sluice_http_requests_total", {"kind": "websocket", "status": "4xx"}
        )
    assert status(answer) == 403, answer
    assert status(again) == 403, again
    body = answer.partition(b"\r\n\r\n")[2]
    assert b"persistent://public/default/orders" in body and b"'schema'" in body, body
    assert upstream.heads == []  # nothing reached the broker
    assert refused == 2 and counted == 2
    infos = [r for r in caplog.records if r.levelno == logging.INFO and "403" in r.getMessage()]
    assert len(infos) == 1, [r.getMessage() for r in caplog.records]  # once, then debug


async def test_requests_on_unfiltered_topics_relay_as_before() -> None:
    upstream = Upstream(ok())
    async with relay(upstream, (SCHEMA,)) as (_, port, _m):
        answers = [
            await exchange(port, get(b"/ws/v2/producer/persistent/public/default/payments")),
            await exchange(port, get(b"/admin/v2/persistent/public/default/orders/stats")),
            await exchange(
                port,
                b"POST /topics/persistent/public/default/payments HTTP/1.1\r\nHost: s\r\n"
                b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            ),
        ]
    assert [status(a) for a in answers] == [200, 200, 200], answers
    assert len(upstream.heads) == 3


async def test_rest_produce_to_a_filtered_topic_is_refused() -> None:
    upstream = Upstream(ok())
    async with relay(upstream, (SCHEMA,)) as (_, port, _m):
        answer = await exchange(
            port,
            b"POST /topics/persistent/public/default/orders/partitions/1 HTTP/1.1\r\n"
            b"Host: s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        )
    assert status(answer) == 403, answer
    assert upstream.heads == []


async def test_with_the_filters_made_a_consumer_of_a_schema_topic_goes_through() -> None:
    """With the proxy's own ``Filters`` (what the binary side runs), a filter
    counts only in the directions it acts in: ``schema`` checks what is
    produced, so consumers and admin peeks of its topics relay."""
    made = make_filters([SCHEMA], registry.get("pulsar"))
    upstream = Upstream(ok())
    async with relay(upstream, (SCHEMA,), made=lambda: made) as (_, port, _m):
        consumer = await exchange(
            port, get(b"/ws/v2/consumer/persistent/public/default/orders/sub")
        )
        peek = await exchange(
            port, get(b"/admin/v2/persistent/public/default/orders/examinemessage")
        )
        producer = await exchange(port, get(b"/ws/v2/producer/persistent/public/default/orders"))
    assert [status(consumer), status(peek), status(producer)] == [200, 200, 403]
    assert len(upstream.heads) == 2


async def test_a_deliver_filter_refuses_consumers_readers_and_peeks() -> None:
    deliver = FilterSpec("schema", topics=("public/default/orders",), direction="deliver")
    upstream = Upstream(ok())
    async with relay(upstream, (deliver,)) as (_, port, _m):
        answers = [
            await exchange(port, get(b"/ws/v2/consumer/persistent/public/default/orders/s")),
            await exchange(port, get(b"/ws/v2/reader/persistent/public/default/orders")),
            await exchange(port, get(b"/ws/v3/consumer/s?topicsPattern=persistent://x/y/.*")),
            await exchange(
                port, get(b"/admin/v2/persistent/public/default/orders/subscription/s/position/1")
            ),
            await exchange(port, get(b"/ws/v2/producer/persistent/public/default/orders")),
        ]
    assert [status(a) for a in answers] == [403, 403, 403, 403, 200], answers


async def test_roles_decide_in_proxy_mode_and_fail_closed_when_unknown(tmp_path: Path) -> None:
    roled = FilterSpec("schema", topics=("*/*/orders",), roles=("billing-*",), label="roled")
    made = make_filters([roled], registry.get("pulsar"))
    credentials, token = proxy_auth(tmp_path)  # the token's role: "app"

    async def unknown_role(authorization: str | None, role: str | None) -> None:
        return None  # credentials passed on as they are: Sluice knows no role

    upstream = Upstream(ok())
    path = b"/ws/v2/producer/persistent/public/default/orders"
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n"
    async with relay(upstream, (), credentials, made=lambda: made) as (_, port, _m):
        app = await exchange(port, get(path, auth))
    async with relay(upstream, (), unknown_role, made=lambda: made) as (_, port, _m):
        unknown = await exchange(port, get(path, auth))
    billing = make_filters([dataclasses.replace(roled, roles=("app",))], registry.get("pulsar"))
    async with relay(upstream, (), credentials, made=lambda: billing) as (_, port, _m):
        matched = await exchange(port, get(path, auth))
    assert status(app) == 200, app  # "app" is no billing-* role: the filter is not its
    assert status(unknown) == 403, unknown
    assert status(matched) == 403, matched


async def test_filters_a_reload_brings_apply_to_the_next_request() -> None:
    made: list[Filters | None] = [None]
    upstream = Upstream(ok())
    path = b"/ws/v2/producer/persistent/public/default/orders"
    async with relay(upstream, (), made=lambda: made[0]) as (_, port, _m):
        before = await exchange(port, get(path))
        made[0] = make_filters([SCHEMA], registry.get("pulsar"))
        after = await exchange(port, get(path))
    assert (status(before), status(after)) == (200, 403)


async def test_without_filters_no_request_is_read_for_its_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy with no message filter pays nothing per request for them."""
    from sluice.proxy import http as http_module

    def never(method: bytes, target: bytes) -> None:
        raise AssertionError(f"read for its topics: {target!r}")

    monkeypatch.setattr(http_module, "message_traffic", never)
    upstream = Upstream(ok())
    async with relay(upstream, ()) as (_, port, _m):
        answer = await exchange(port, get(b"/ws/v2/producer/persistent/public/default/orders"))
    assert status(answer) == 200, answer
