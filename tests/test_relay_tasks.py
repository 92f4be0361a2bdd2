"""What one short connection costs the relay in trio tasks and clocks.

A Cursus client makes a connection per commit, so a proxied command is a
connection accepted, dialled, relayed and closed, and what trio does for it
is most of the proxy's CPU per connection: each task started and ended,
each sleeping clock woken by a cancellation, costs about ten microseconds.
The real ``Relay`` and ``CursusConnection`` serve one command from a raw
client over loopback sockets to the scripted broker, under a trio
instrument that names the tasks started.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import trio
from cursus.protocol.encoder import encode_message

from sluice.addresses import Address, parse_address
from sluice.protocols.core import Conn, Event, OnInvalid
from sluice.protocols.cursus.connection import CursusConnection, CursusRouting, CursusSettings
from sluice.proxy.dial import dial
from sluice.proxy.relay import Relay, Timing
from tests.helpers.cursus_broker import open_cluster

TIMING = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=30.0)


class _Quiet:
    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        pass

    def event(self, conn: Conn | None, event: Event) -> None:
        pass


class Spawned(trio.abc.Instrument):
    """The relay's tasks started while it is installed (the broker, in the
    same trio run, starts its own)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if ".Relay." in task.name:
            self.names.append(task.name.rsplit(".", 1)[-1])


async def _dial(address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
    return await dial(address, timeout=timeout)


async def _ask(address: Address, request: Any) -> Any:
    raise AssertionError("a LIST asks for nothing")


async def _frame(stream: trio.SocketStream) -> bytes:
    """One length-prefixed frame's body."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        more = await stream.receive_some(65536)
        assert more, "the proxy closed before answering"
        data += more
    return data[4:]


async def test_a_command_on_its_own_connection_takes_two_tasks_and_no_clock_after() -> None:
    async with open_cluster(1) as cluster, trio.open_nursery() as nursery:
        broker = parse_address(cluster.address)
        served: list[str] = []
        relays: list[Relay] = []
        spawned = Spawned()

        async def serve(stream: trio.SocketStream) -> None:
            conn = Conn(1, "client", "listener", "cursus")
            settings = CursusSettings(on_invalid=OnInvalid.REJECT)
            routing = CursusRouting(broker)
            core = CursusConnection(conn, settings, routing, _Quiet(), upstream=broker)
            relay = Relay(core, stream, timing=TIMING, dial=_dial, ask=_ask, tap=_Quiet())
            relays.append(relay)
            trio.lowlevel.add_instrument(spawned)
            try:
                served.append(await relay.run())
            finally:
                trio.lowlevel.remove_instrument(spawned)
                stream.socket.close()

        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(20):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            request = encode_message("", "LIST")
            await client.send_all(struct.pack(">I", len(request)) + request)
            assert (await _frame(client)).startswith(b"OK")
            # Answered: the handshake's clock is over, and a core that keeps
            # nothing alive leaves no clock running (before: a keepalive
            # task slept on to be woken by the end of the connection).
            (relay,) = relays
            assert relay._nursery is not None
            with trio.move_on_after(5):
                while len(relay._nursery.child_tasks) > 1:
                    await trio.sleep(0.01)
            names = sorted(t.name.rsplit(".", 1)[-1] for t in relay._nursery.child_tasks)
            assert names == ["_open_upstream"]  # dialled, and reads the broker now
            await client.aclose()
            while not served:
                await trio.sleep(0.01)
        assert served == ["closed"]
        # The client is read by the connection's own task; one task keeps
        # the clocks, one dials and then reads the broker. (Before: five.)
        assert sorted(spawned.names) == ["_clocks", "_open_upstream"]
        nursery.cancel_scope.cancel()
