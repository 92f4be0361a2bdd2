"""Whose PROXY headers a listener takes (sluice/proxy/inbound.py), on a
socket pair and no process: listed sources however they are written, and
the first bytes of anyone else looked at until they tell, never taken."""

from __future__ import annotations

import ipaddress
import socket

import pytest
import trio

from sluice.addresses import Address
from sluice.protocols.haproxy import HeaderError, ProxyHeader
from sluice.proxy.inbound import ProxyProtocolIn, parse_sources

BALANCER = Address("10.0.100.7", 40000)
STRANGER = Address("198.51.100.9", 40000)


def inbound(*rules: str, timeout: float = 2.0) -> ProxyProtocolIn:
    return ProxyProtocolIn(parse_sources(rules), timeout)


async def outcome(
    into: list[object], listed: ProxyProtocolIn, stream: trio.SocketStream, peer: Address
) -> None:
    """What ``read`` gives (the header, None, or the HeaderError it
    raised), added to ``into``."""
    try:
        into.append(await listed.read(stream, peer))
    except HeaderError as exc:
        into.append(exc)


def pair() -> tuple[trio.SocketStream, trio.socket.SocketType]:
    """Sluice's end of a connection (a stream, as a listener accepts it)
    and the client's end."""
    ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return trio.SocketStream(ours), theirs


@pytest.mark.parametrize(
    "rule", ["10.0.100.0/24", "::ffff:10.0.100.0/120", "::ffff:10.0.100.7", "10.0.100.7"]
)
@pytest.mark.parametrize("peer", ["10.0.100.7", "::ffff:10.0.100.7"])
def test_a_listed_ipv4_source_is_listed_however_either_side_writes_it(rule: str, peer: str) -> None:
    # A dual-stack listener's log shows the balancer as ::ffff:10.0.100.7,
    # the form an operator may well copy into --proxy-protocol-from.
    assert inbound(rule).trusts(peer)


@pytest.mark.parametrize("rule", ["10.0.100.0/24", "::ffff:10.0.100.0/120", "fd00::/8"])
def test_other_addresses_are_not_listed(rule: str) -> None:
    listed = inbound(rule)
    for peer in ("10.0.101.7", "::ffff:10.0.101.7", "fe80::1%eth0", "::1", "not an address"):
        assert not listed.trusts(peer), (rule, peer)
    assert isinstance(listed.sources[0], ipaddress.IPv4Network | ipaddress.IPv6Network)


async def test_an_unlisted_client_whose_first_byte_only_begins_like_a_header_is_served() -> None:
    # An HTTP request that arrives a byte at a time begins with "P", as
    # "PROXY " does: that is no header, and nothing of it may be taken.
    ours, theirs = pair()
    request = b"POST /admin/v2/clusters HTTP/1.1\r\n\r\n"
    async with trio.open_nursery() as nursery:
        result: list[object] = []

        nursery.start_soon(outcome, result, inbound("10.0.100.0/24"), ours, STRANGER)
        await theirs.send(request[:1])
        await trio.sleep(0.05)
        await theirs.send(request[1:])
    assert result == [None]
    assert await ours.receive_some(len(request)) == request
    theirs.close()


async def test_an_unlisted_client_sending_a_header_is_refused_however_it_is_cut() -> None:
    for header in (
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c",
    ):
        ours, theirs = pair()
        result: list[object] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outcome, result, inbound("10.0.100.0/24"), ours, STRANGER)
            for at in range(len(header)):
                await theirs.send(header[at : at + 1])
                await trio.sleep(0.005)
        refused = result[0]
        assert isinstance(refused, HeaderError) and refused.reason == "unlisted", refused
        assert "198.51.100.9" in refused.message
        theirs.close()


async def test_a_listed_source_header_in_single_bytes_is_read_to_its_end_and_no_further() -> None:
    ours, theirs = pair()
    header = b"PROXY TCP4 203.0.113.5 10.0.0.1 50000 6650\r\n"
    frame = b"\x00\x00\x00\x10the first frame"
    result: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outcome, result, inbound("10.0.100.0/24"), ours, BALANCER)
        for at in range(len(header)):
            await theirs.send(header[at : at + 1])
        await theirs.send(frame)
    read = result[0]
    assert isinstance(read, ProxyHeader) and read.source == Address("203.0.113.5", 50000)
    assert await ours.receive_some(len(frame)) == frame
    theirs.close()


async def test_a_listed_source_that_trickles_is_cut_off_at_the_timeout() -> None:
    ours, theirs = pair()
    header = b"PROXY TCP4 203.0.113.5 10.0.0.1 50000 6650\r\n"
    started = trio.current_time()
    result: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outcome, result, inbound("10.0.100.0/24", timeout=0.3), ours, BALANCER)
        for at in range(len(header)):
            if result:
                break
            await theirs.send(header[at : at + 1])
            await trio.sleep(0.05)
    assert isinstance(result[0], HeaderError) and result[0].reason == "timeout", result
    assert trio.current_time() - started < 1.5
    theirs.close()


async def test_a_v2_header_announcing_more_than_comes_is_truncated_at_the_close() -> None:
    ours, theirs = pair()
    await theirs.send(b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + b"\x01\x02\x03")
    theirs.close()
    with pytest.raises(HeaderError) as caught:
        await inbound("10.0.100.0/24").read(ours, BALANCER)
    assert caught.value.reason == "truncated"
