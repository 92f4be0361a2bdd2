"""What Sluice's HTTP listener makes of a request's framing: in process
(no process started), in front of a web service of the test's own on
loopback (raw bytes both ways).
"""

from __future__ import annotations

from tests.test_http_relay import Upstream, exchange, ok, relay


async def test_an_unknown_transfer_coding_is_501_and_reaches_no_broker() -> None:
    """RFC 9112 6.1: a transfer coding the server does not understand is a
    501, not a client's malformed request."""
    upstream = Upstream(ok())
    async with relay(upstream) as (_, port):
        got = await exchange(
            port,
            b"POST /admin/v2/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
            b"0\r\n\r\n",
        )
    assert got.startswith(b"HTTP/1.1 501 "), got
    assert b"Transfer-Encoding" in got and b"connection: close" in got
    assert upstream.heads == []


async def test_a_malformed_request_is_still_400() -> None:
    upstream = Upstream(ok())
    async with relay(upstream) as (_, port):
        got = await exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 "), got
    assert upstream.heads == []


async def test_an_answer_framed_both_ways_reaches_the_client_by_its_chunks() -> None:
    """A broker's answer with Transfer-Encoding and Content-Length is read
    by its chunks (RFC 9112 6.3), and its Content-Length, which does not
    say what was read, does not go on: the client gets the chunks' bytes,
    framed as they are, and the connection serves on."""
    upstream = Upstream(
        lambda head: (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n"
        )
    )
    async with relay(upstream) as (_, port):
        got = await exchange(
            port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        )
    assert b"content-length" not in got.lower(), got
    assert (
        got.count(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        == 2
    ), got
