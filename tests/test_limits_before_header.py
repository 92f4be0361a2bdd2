"""Connection limits with ``--proxy-protocol-in``: a client that is not a
listed balancer is counted from the moment it connects, not only once its
first bytes show it sends no PROXY header (which it may never send: its
place was free for the whole header timeout)."""

from __future__ import annotations

import functools

import trio

from sluice.commands.proxy import settings_again
from sluice.proxy.server import Proxy
from tests.helpers.poll import wait_until_in_trio


def _proxy() -> Proxy:
    return Proxy(settings_again([
        "proxy", "--broker", "127.0.0.1:1", "--listen", "127.0.0.1:0",
        "--http-listen", "127.0.0.1:0", "--broker-http", "http://127.0.0.1:1",
        "--proxy-protocol-in", "--proxy-protocol-from", "10.9.9.9",
        "--max-connections-per-ip", "1", "--http-max-connections", "1",
        "--handshake-timeout", "30",
    ]))  # fmt: skip


async def test_a_silent_unlisted_client_holds_its_place_from_the_start() -> None:
    proxy = _proxy()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    handle = functools.partial(proxy.handle, kind="plain")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        silent = await trio.open_tcp_stream("127.0.0.1", port)  # sends nothing
        await wait_until_in_trio(lambda: proxy.limits.active == 1, 5, "the silent client counted")
        second = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):  # closed at once, not after the 30 s header timeout
            assert await second.receive_some(100) == b""
        assert proxy.limits.active == 1
        await silent.aclose()
        await wait_until_in_trio(lambda: proxy.limits.active == 0, 5, "its place freed")
        nursery.cancel_scope.cancel()


async def test_the_http_listener_counts_a_silent_client_from_the_start() -> None:
    proxy = _proxy()
    http = proxy.http
    assert http is not None
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, http.handle, listeners)
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        await wait_until_in_trio(lambda: http.limits.active == 1, 5, "the silent client counted")
        second = await trio.open_tcp_stream("127.0.0.1", port)
        answer = b""
        with trio.fail_after(5):
            while chunk := await second.receive_some(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
        await silent.aclose()
        await wait_until_in_trio(lambda: http.limits.active == 0, 5, "its place freed")
        nursery.cancel_scope.cancel()
