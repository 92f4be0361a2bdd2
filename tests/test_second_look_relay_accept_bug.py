"""A bug in the relay thread's accept step once it has accepted a
connection (a tap's Accepted event, the connection's core being made)
hands the listener to trio's accept loop (as a failed accept does); the
connection it had accepted was left as it was: its socket never closed
(the client waiting for ever on a connection nobody reads), and its
place under --max-connections and --max-connections-per-ip held for
good. Now the socket is closed and the place freed."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from sluice.protocols.core import Accepted
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.poll import wait_until_in_trio
from tests.test_cursus_broker import in_thread
from tests.test_cursus_proxy import start_proxy
from tests.test_short_connections import one_command

pytestmark = pytest.mark.e2e


def _closed(sock: socket.socket) -> bool:
    """Whether the proxy closed ``sock``'s connection (waits up to 10 s)."""
    sock.settimeout(10)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def test_a_bug_after_the_threads_accept_closes_that_connection() -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        taps = proxy.proxy.taps
        event = taps.event
        failures: list[bool] = []

        def buggy(conn: Any, what: Any) -> None:
            if isinstance(what, Accepted) and not failures:
                failures.append(True)
                raise RuntimeError("a bug in a tap")
            event(conn, what)

        taps.event = buggy  # type: ignore[method-assign,assignment]
        host, port = proxy.address.rsplit(":", 1)
        first = socket.create_connection((host, int(port)))
        with first:
            await wait_until_in_trio(
                lambda: not proxy.proxy._accepting, 20, "the thread gave the listener up", step=0.02
            )
            assert failures
            assert await in_thread(_closed, first), "the connection met by the bug is left open"
        for _ in range(2):  # trio's accept loop serves the listener
            assert (await in_thread(one_command, proxy.address)).startswith(b"OK")
        await wait_until_in_trio(
            lambda: proxy.proxy.limits.active == 0, 20, "every place freed", step=0.02
        )
        nursery.cancel_scope.cancel()
