"""Whom the broker is told a request is from (``X-Forwarded-For``) on the
HTTP listener: a client's own forwarding headers never reach the broker
ahead of the address Sluice served, since a broker with
``webServiceTrustXForwardedFor`` believes the leftmost one; only a source
``--proxy-protocol-from`` lists (a proxy of the operator's) has its chain
kept."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.protocols.http import forwarded_for, parse_http_url
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.http import HttpRelay
from sluice.proxy.inbound import ProxyProtocolIn
from sluice.proxy.metrics import HttpMetrics
from tests.test_http_relay import Upstream, exchange, ok

SPOOFING = (
    b"X-Forwarded-For: 1.2.3.4\r\nx-forwarded-for: 5.6.7.8, 9.9.9.9\r\n"
    b"Forwarded: for=1.2.3.4;proto=https\r\nX-Real-IP: 1.2.3.4\r\n"
    b"X-Forwarded-Proto: https\r\nX-Forwarded-Host: admin.example\r\n"
)


def request(extra: bytes = SPOOFING) -> bytes:
    return b"GET /admin/v2/clusters HTTP/1.1\r\nHost: s\r\n" + extra + b"Connection: close\r\n\r\n"


def forwarding(sent: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    names = (b"forwarded", b"x-real-ip")
    return [(n, v) for n, v in sent if n in names or n.startswith(b"x-forwarded-")]


def test_an_untrusted_clients_chain_is_replaced_by_its_address() -> None:
    sent = [(b"X-Forwarded-For", b"1.2.3.4"), (b"Accept", b"*/*"), (b"Forwarded", b"for=1.2.3.4"),
            (b"X-Real-IP", b"1.2.3.4"), (b"X-Forwarded-Proto", b"https")]  # fmt: skip
    assert forwarded_for(sent, "10.1.1.1") == [
        (b"Accept", b"*/*"),
        (b"x-forwarded-for", b"10.1.1.1"),
    ]
    assert forwarded_for([], "::1") == [(b"x-forwarded-for", b"::1")]


def test_a_trusted_sources_chain_is_kept_and_the_address_added() -> None:
    sent = [(b"X-Forwarded-For", b"1.2.3.4"), (b"Accept", b"*/*"), (b"Forwarded", b"for=1.2.3.4")]
    assert forwarded_for(sent, "10.1.1.1", trusted=True) == [
        (b"Accept", b"*/*"), (b"Forwarded", b"for=1.2.3.4"),
        (b"x-forwarded-for", b"1.2.3.4, 10.1.1.1"),
    ]  # fmt: skip


@asynccontextmanager
async def listener(upstream: Upstream, balancers: tuple[str, ...] = ()) -> AsyncIterator[int]:
    """Sluice's HTTP listener in front of ``upstream`` (``balancers``:
    --proxy-protocol-in from those sources); its port."""
    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.serve)
        config = ProxyConfig(
            broker=parse_broker_url("pulsar://127.0.0.1:6650"),
            http_listen=Address("127.0.0.1", 0),
            broker_http=parse_http_url(f"http://127.0.0.1:{upstream.port}"),
        )

        async def no_listeners(urls: object) -> dict[str, str]:
            return {}

        inbound = (
            ProxyProtocolIn(tuple(ipaddress.ip_network(b) for b in balancers), 5.0)
            if balancers
            else None
        )
        web = HttpRelay(config, HttpMetrics(CollectorRegistry()), no_listeners, inbound=inbound)
        addresses = await web.open()
        nursery.start_soon(web.serve)
        yield addresses["http"].port
        nursery.cancel_scope.cancel()


async def test_a_client_cannot_name_its_own_address() -> None:
    """Before: the client's 1.2.3.4 went first and 127.0.0.1 after it, and
    Forwarded / X-Real-IP went on as written."""
    upstream = Upstream(ok())
    async with listener(upstream) as port:
        answer = await exchange(port, request())
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert forwarding(upstream.headers()) == [(b"x-forwarded-for", b"127.0.0.1")]


async def test_behind_a_balancer_the_client_it_names_cannot_either() -> None:
    """A listed balancer (loopback here) names client 203.0.113.9, whose own
    headers, carried through the balancer untouched, are not believed."""
    upstream = Upstream(ok())
    async with listener(upstream, ("127.0.0.0/8",)) as port:
        header = b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 8080\r\n"
        answer = await exchange(port, header + request())
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert forwarding(upstream.headers()) == [(b"x-forwarded-for", b"203.0.113.9")]


async def test_a_listed_proxy_keeps_its_chain() -> None:
    """The client a balancer names is itself listed (a proxy of the
    operator's in front of the balancer): what it wrote goes on, the
    address added after it; and so does a listed source's own request (a
    LOCAL header: the balancer's health check)."""
    upstream = Upstream(ok())
    chain = b"X-Forwarded-For: 198.51.100.7\r\nX-Forwarded-Proto: https\r\n"
    async with listener(upstream, ("127.0.0.0/8", "10.0.0.0/24")) as port:
        header = b"PROXY TCP4 10.0.0.5 127.0.0.1 5000 8080\r\n"
        answer = await exchange(port, header + request(chain))
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        local = b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"  # v2, LOCAL, no addresses
        answer = await exchange(port, local + request(chain))
        assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert forwarding(upstream.headers(0)) == [
        (b"x-forwarded-proto", b"https"), (b"x-forwarded-for", b"198.51.100.7, 10.0.0.5")
    ]  # fmt: skip
    assert forwarding(upstream.headers(1)) == [
        (b"x-forwarded-proto", b"https"), (b"x-forwarded-for", b"198.51.100.7, 127.0.0.1")
    ]  # fmt: skip
