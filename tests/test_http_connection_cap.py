"""Connections held open to the HTTP listener, sending nothing (or a head
that never ends), do not keep other clients out: at
``--http-max-connections`` a new connection takes the place of the oldest
one that has sent no whole request yet (silent since it connected, or its
head still coming). They used to hold every place for
``--http-idle-timeout`` (60 s), again and again: one client shut every
other out of the web port."""

from __future__ import annotations

import trio

from tests.test_http_relay import Upstream, ok, relay


async def _answer(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(5):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def test_held_connections_give_their_place_to_a_new_client() -> None:
    upstream = Upstream(ok(b"served"))
    async with relay(upstream, http_max_connections=4) as (web, port):
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
        trickling = await trio.open_tcp_stream("127.0.0.1", port)
        await trickling.send_all(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n")
        with trio.fail_after(5):
            while web.limits.active < 4:  # all four places taken
                await trio.sleep(0.01)
        served = []
        for _ in range(4):  # one newcomer after another, each served and kept open
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await _answer(client)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            served.append(client)
        # The oldest ones waiting went: the silent ones quietly, the one
        # whose head had begun with a 503.
        assert (await _answer(trickling)).startswith(b"HTTP/1.1 503")
        for stream in held:
            with trio.fail_after(5):
                assert await stream.receive_some(10) == b""
        # The newcomers, served, keep their places: a fifth is answered 503.
        fifth = await trio.open_tcp_stream("127.0.0.1", port)
        await fifth.send_all(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await _answer(fifth)).startswith(b"HTTP/1.1 503")
        assert web.limits.active == 4
