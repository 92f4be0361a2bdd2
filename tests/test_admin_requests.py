"""The admin endpoint's request reader: what it refuses before any handler
sees the request."""

from __future__ import annotations

import functools

import pytest
import trio.testing
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.proxy.admin import AdminRequest, Refused, _read_request, bound, open_admin, serve_admin
from sluice.proxy.inbound import ProxyProtocolIn, parse_sources


async def _read(raw: bytes) -> AdminRequest | None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(raw)
    return await _read_request(server)  # type: ignore[arg-type]


async def test_a_chunked_body_is_refused_not_taken_for_none() -> None:
    # Its body was read as empty: POST /recording/snapshot with a chunked
    # {"last": 30} wrote the whole ring, the caller's fields ignored.
    body = b'{"last": 30}'
    raw = (
        b"POST /recording/snapshot HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    with pytest.raises(Refused) as info:
        await _read(raw)
    assert info.value.status == 400 and "Content-Length" in info.value.message


async def test_a_body_with_content_length_is_read() -> None:
    request = await _read(b"POST /faults HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert request is not None and request.body == b"{}"


async def _status(stream: trio.abc.Stream) -> str:
    """The status line answered on ``stream``, or "closed"."""
    data = b""
    while b"\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode() if data else "closed"


async def test_connections_awaited_for_a_proxy_header_hold_places() -> None:
    """With --proxy-protocol-in, a connection was let in only once its
    first bytes showed whether a PROXY header came: silent ones held
    descriptors, uncounted, for the header's whole timeout. Now each holds
    a place from the start, and the oldest idle one makes room."""
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    inbound = ProxyProtocolIn(parse_sources(["10.9.9.9"]), 30.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(
            serve_admin, listeners, CollectorRegistry(), list, max_connections=2, inbound=inbound,
        ))  # fmt: skip
        silent = [await trio.open_tcp_stream(address.host, address.port) for _ in range(2)]
        probe = await trio.open_tcp_stream(address.host, address.port)
        await probe.send_all(f"GET /healthz HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        with trio.fail_after(5):  # not after the 30 s header timeout
            assert await _status(silent[0]) == "HTTP/1.1 503 Service Unavailable"
            assert await _status(probe) == "HTTP/1.1 200 OK"
        for stream in (*silent, probe):
            await stream.aclose()
        nursery.cancel_scope.cancel()
