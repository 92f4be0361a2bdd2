"""Lookup behaviours pulsar-lite never produces: Redirect answers, broker-side
failures, overload. The proxy runs in-process; the real client and broker are
used wherever they can be."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pulsar
import pytest
import trio

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.pulsar import FrameStream
from sluice.proxy.server import Proxy
from tests.helpers.scripted_broker import ScriptedBroker, connect_to, failed, redirect_to
from tests.helpers.support import client

LookupResponse = pb.CommandLookupTopicResponse


async def start(nursery: trio.Nursery, broker_url: str, **options: Any) -> Proxy:
    config = ProxyConfig(
        broker=parse_broker_url(broker_url), listen=Address("127.0.0.1", 0), **options
    )
    proxy: Proxy = await nursery.start(Proxy(config).run)
    return proxy


async def open_lookup_connection(proxy: Proxy) -> FrameStream:
    address = proxy.addresses["plain"]
    conn = FrameStream(await trio.open_tcp_stream(address.host, address.port))
    connect = pb.CommandConnect(client_version="tests", protocol_version=21)
    await conn.send(encode(command(Type.Value("CONNECT"), connect)))
    frame = await conn.receive_frame()
    assert frame is not None and frame.name == "CONNECTED"
    return conn


async def lookup(conn: FrameStream, topic: str, request_id: int) -> None:
    body = pb.CommandLookupTopic(topic=topic, request_id=request_id)
    await conn.send(encode(command(Type.Value("LOOKUP"), body)))


async def answer(conn: FrameStream) -> LookupResponse:
    with trio.fail_after(10):
        frame = await conn.receive_frame()
    assert frame is not None and frame.name == "LOOKUP_RESPONSE", frame
    result: LookupResponse = frame.body
    return result


def lookups(proxy: Proxy, outcome: str) -> float | None:
    return proxy.metrics.registry.get_sample_value("sluice_lookups_total", {"outcome": outcome})


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


async def test_redirect_is_followed_and_the_client_stays_on_the_proxy(
    nursery: trio.Nursery, broker: EmbeddedBroker
) -> None:
    # The service answers every lookup with "ask the real broker".
    async def script(request: pb.CommandLookupTopic) -> LookupResponse:
        return redirect_to(broker.url)

    service = ScriptedBroker(script)
    await nursery.start(service.serve)
    proxy = await start(nursery, service.url)

    conn = await open_lookup_connection(proxy)
    await lookup(conn, "persistent://public/default/redirected", 77)
    result = await answer(conn)
    assert result.request_id == 77  # the client's id, not the proxy's
    assert result.response == LookupResponse.Connect
    assert result.proxy_through_service_url and result.authoritative
    assert result.brokerServiceUrl == broker.url
    assert lookups(proxy, "redirected") == 1
    assert lookups(proxy, "answered") == 1

    # And the real client produces through it: the redirect target was learned.
    def produce() -> bytes:
        address = proxy.addresses["plain"]
        with client(f"pulsar://{address}") as c:
            topic = "persistent://public/default/redirected"
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            c.create_producer(topic).send(b"via redirect")
            data: bytes = consumer.receive(timeout_millis=10_000).data()
            return data

    assert await trio.to_thread.run_sync(produce) == b"via redirect"


async def test_broker_lookup_failure_reaches_the_client_unchanged(nursery: trio.Nursery) -> None:
    async def script(request: pb.CommandLookupTopic) -> LookupResponse:
        return failed(pb.TopicNotFound, f"no topic {request.topic} here")

    service = ScriptedBroker(script)
    await nursery.start(service.serve)
    proxy = await start(nursery, service.url)
    conn = await open_lookup_connection(proxy)
    await lookup(conn, "persistent://public/default/missing", 5)
    result = await answer(conn)
    assert result.request_id == 5
    assert result.response == LookupResponse.Failed
    assert result.error == pb.TopicNotFound
    assert result.message == "no topic persistent://public/default/missing here"
    assert lookups(proxy, "failed") == 1
    assert (
        proxy.metrics.registry.get_sample_value(
            "sluice_broker_errors_total", {"command": "LOOKUP", "error": "TopicNotFound"}
        )
        == 1
    )

    def create() -> str:
        address = proxy.addresses["plain"]
        with client(f"pulsar://{address}") as c:
            try:
                c.create_producer("persistent://public/default/missing")
            except pulsar.PulsarException as exc:
                return str(exc)
        return "no error"

    assert "TopicNotFound" in await trio.to_thread.run_sync(create)


async def test_redirect_loop_ends_with_service_not_ready(nursery: trio.Nursery) -> None:
    async def script(request: pb.CommandLookupTopic) -> LookupResponse:
        return redirect_to(service.url)  # always back to itself

    service = ScriptedBroker(script)
    await nursery.start(service.serve)
    proxy = await start(nursery, service.url, max_redirects=3)
    conn = await open_lookup_connection(proxy)
    await lookup(conn, "persistent://public/default/loop", 1)
    result = await answer(conn)
    assert result.response == LookupResponse.Failed
    assert result.error == pb.ServiceNotReady
    assert "redirected more than 3 times" in result.message
    assert len(service.lookups) == 4  # the first ask plus three redirects


async def test_lookups_over_the_limit_get_too_many_requests(
    nursery: trio.Nursery, broker: EmbeddedBroker
) -> None:
    release = trio.Event()

    async def script(request: pb.CommandLookupTopic) -> LookupResponse:
        await release.wait()
        return connect_to(broker.url)

    service = ScriptedBroker(script)
    await nursery.start(service.serve)
    proxy = await start(nursery, service.url, max_concurrent_lookups=1)
    conn = await open_lookup_connection(proxy)
    for rid in (1, 2, 3):
        await lookup(conn, f"persistent://public/default/t{rid}", rid)
    refused = [await answer(conn), await answer(conn)]
    assert {r.request_id for r in refused} == {2, 3}
    assert all(r.error == pb.TooManyRequests for r in refused)
    release.set()
    served = await answer(conn)
    assert served.request_id == 1 and served.response == LookupResponse.Connect
    assert lookups(proxy, "rejected") == 2


async def test_a_clients_tls_url_for_the_plain_broker_leaves_lookups_plain(
    nursery: trio.Nursery,
) -> None:
    """A client's CONNECT naming the configured plain broker as pulsar+ssl://
    (a client on TLS taking brokerServiceUrlTls, or anybody) fails its own
    dial and nothing else: Sluice's own connections to that broker, opened
    for lookups with other credentials, stay plain. (The first TLS dial
    made every own connection try TLS from then on: lookups failed until a
    restart.)"""

    async def script(request: Any) -> Any:
        return connect_to("pulsar://127.0.0.1:6650")

    upstream = ScriptedBroker(script)
    await nursery.start(upstream.serve)
    proxy = await start(nursery, upstream.url, connect_timeout=5.0)
    address = proxy.addresses["plain"]

    async def connected(**fields: Any) -> tuple[FrameStream, Any]:
        conn = FrameStream(await trio.open_tcp_stream(address.host, address.port))
        hello = pb.CommandConnect(client_version="tests", protocol_version=21, **fields)
        await conn.send(encode(command(Type.Value("CONNECT"), hello)))
        with trio.fail_after(20):
            return conn, await conn.receive_frame()

    conn, frame = await connected(proxy_to_broker_url=f"pulsar+ssl://127.0.0.1:{upstream.port}")
    assert frame is not None and frame.name == "ERROR", frame  # its own dial failed
    await conn.aclose()
    for token in (b"b", b"c"):  # credentials of their own: new own connections
        conn, frame = await connected(auth_method_name="token", auth_data=token)
        assert frame is not None and frame.name == "CONNECTED", frame
        await lookup(conn, "persistent://public/default/x", 1)
        result = await answer(conn)
        assert result.response == LookupResponse.Connect, result
        await conn.aclose()


async def test_unreachable_upstream_fails_the_lookup_not_the_proxy(nursery: trio.Nursery) -> None:
    from sluice.brokers.embedded import free_port

    proxy = await start(nursery, f"pulsar://127.0.0.1:{free_port()}", connect_timeout=2.0)
    conn = await open_lookup_connection(proxy)
    await lookup(conn, "persistent://public/default/x", 9)
    result = await answer(conn)
    assert result.response == LookupResponse.Failed
    assert result.error == pb.ServiceNotReady
    assert "cannot reach broker" in result.message


async def test_silent_lookup_client_is_pinged_then_dropped(
    nursery: trio.Nursery, broker: EmbeddedBroker
) -> None:
    proxy = await start(nursery, broker.url, keepalive_interval=0.2)
    conn = await open_lookup_connection(proxy)
    with trio.fail_after(5):
        frame = await conn.receive_frame()
        assert frame is not None and frame.name == "PING"
        # Never answering: the proxy hangs up.
        while (frame := await conn.receive_frame()) is not None:
            assert frame.name == "PING"
