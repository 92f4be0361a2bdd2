"""The Cursus connection core driven by a few lines of trio, with the real
client and the test broker: every connection the client makes lands on a
proxy listener, including after a leader and a coordinator move.

The glue here is the test's own, so that the core's contract is tested
apart from the proxy's I/O (``tests/test_cursus_proxy.py`` tests the two
together): one listener per upstream broker, opened when the core asks for
it, and one upstream connection per client connection.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio
from cursus import ConsumerMode

from sluice.addresses import Address
from sluice.protocols.core import (
    Action,
    Ask,
    Close,
    Conn,
    Event,
    OnInvalid,
    OpenUpstream,
    Peer,
    Send,
)
from sluice.protocols.cursus.connection import (
    CursusConnection,
    CursusRouting,
    CursusSettings,
    ListenerRequest,
)
from tests.helpers.cursus_broker import Cluster, open_cluster
from tests.helpers.poll import wait_until_in_trio
from tests.test_cursus_broker import Collector, in_thread, produce


class _Quiet:
    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        pass

    def event(self, conn: Conn | None, event: Event) -> None:
        pass


class MiniProxy:
    """Listeners per upstream broker, each connection driven by a CursusConnection."""

    def __init__(self, nursery: trio.Nursery, broker: Address) -> None:
        self.nursery = nursery
        self.routing = CursusRouting(broker)
        self.settings = CursusSettings(on_invalid=OnInvalid.REJECT)
        self.upstream_ports: set[int] = set()  # our side of every broker connection
        self.accepted = 0
        self._ids = itertools.count(1)

    async def listen(self, upstream: Address) -> Address:
        existing = self.routing.listener_for(upstream)
        if existing is not None:
            return existing
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy = Address("127.0.0.1", listener.socket.getsockname()[1])
        self.routing.add_listener(upstream, proxy)

        async def handle(stream: trio.SocketStream) -> None:
            await self._connection(stream, upstream)

        self.nursery.start_soon(trio.serve_listeners, handle, [listener])
        return proxy

    async def _connection(self, client: trio.SocketStream, upstream: Address) -> None:
        self.accepted += 1
        conn = Conn(next(self._ids), "client", "listener", "cursus")
        core = CursusConnection(conn, self.settings, self.routing, _Quiet(), upstream=upstream)
        broker: list[trio.SocketStream] = []
        async with trio.open_nursery() as nursery:

            async def act(actions: list[Action]) -> None:
                for action in actions:
                    now = trio.current_time()
                    if isinstance(action, Send):
                        target = client if action.to is Peer.CLIENT else broker[0]
                        await target.send_all(action.data)
                    elif isinstance(action, OpenUpstream):
                        stream = await trio.open_tcp_stream(
                            action.address.host, action.address.port
                        )
                        self.upstream_ports.add(stream.socket.getsockname()[1])
                        broker.append(stream)
                        nursery.start_soon(pump, stream, False)
                        await act(core.upstream_ready(now))
                    elif isinstance(action, Ask):
                        assert isinstance(action.request, ListenerRequest)
                        proxy = await self.listen(action.request.upstream)
                        await act(core.answered(action.token, proxy, now))
                    elif isinstance(action, Close):
                        nursery.cancel_scope.cancel()
                        return

            async def pump(stream: trio.SocketStream, from_client: bool) -> None:
                receive = core.receive_client if from_client else core.receive_broker
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    await act(receive(data, trio.current_time()))
                    if not data:
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(pump, client, True)
        core.closed("done")
        for stream in (client, *broker):
            await trio.aclose_forcefully(stream)


@pytest.fixture
async def cluster3() -> AsyncIterator[Cluster]:
    async with open_cluster(3, keepalive=0.3) as cluster:
        yield cluster


def _direct(cluster: Cluster, proxy: MiniProxy) -> list[str]:
    """Broker connections that did not come from the proxy."""
    return [
        peer
        for _, peer in cluster.connections
        if int(peer.rsplit(":", 1)[1]) not in proxy.upstream_ports
    ]


async def test_every_client_connection_stays_on_the_proxy(cluster3: Cluster) -> None:
    host, port = cluster3.address.rsplit(":", 1)
    async with trio.open_nursery() as nursery:
        proxy = MiniProxy(nursery, Address(host, int(port)))
        entry = await proxy.listen(Address(host, int(port)))
        via = str(entry)
        payloads = [f"v{i}" for i in range(9)]
        assert await in_thread(produce, via, "routed", payloads, 3) == 9
        collector = Collector(via, "routed", "g-routed", ConsumerMode.STREAMING).start()
        try:
            await wait_until_in_trio(
                lambda: len(collector.got) >= 9, 20, "9 messages through the proxy", step=0.02
            )
            cluster3.move_leader("routed", 1)
            cluster3.move_coordinator("g-routed")
            await wait_until_in_trio(
                lambda: cluster3.sent["NOT_COORDINATOR"] >= 1, 20, "a NOT_COORDINATOR", step=0.02
            )
            assert await in_thread(produce, via, "routed", ["late-1", "late-2", "late-3"], 3) == 3
            await wait_until_in_trio(
                lambda: len(collector.got) >= 12, 20, "the late messages", step=0.02
            )
        finally:
            await in_thread(collector.close)
        nursery.cancel_scope.cancel()
    assert collector.payloads == sorted([*payloads, "late-1", "late-2", "late-3"])
    assert cluster3.sent["NOT_LEADER"] >= 1  # the stream on the old leader was moved
    # One listener per broker, and the broker never saw the client itself.
    assert len(proxy.routing.listeners) == 3
    assert {n for n, _ in cluster3.connections} == {0, 1, 2}
    assert _direct(cluster3, proxy) == []
    assert proxy.accepted == len(cluster3.connections)
    # The check can fail: a client given the broker itself is seen.
    assert await in_thread(produce, cluster3.address, "routed", ["direct"], 3) == 1
    assert _direct(cluster3, proxy) != []
