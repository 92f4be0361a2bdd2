"""How a relayed connection ends (sluice/proxy/relay.py): whatever ends it
(a side that hangs up or resets, a drain) ends it at once, its sockets
closed and nothing of it left waiting.

A ``Relay`` drives a real ``PulsarConnection``; the broker is a small
task on the far end of the stream a fake ``dial`` returns (the harness of
test_relay_clock.py), on trio's mock clock unless said otherwise.
"""

from __future__ import annotations

import trio
import trio.testing

from sluice.protocols.pulsar import Frame
from tests.test_relay_clock import (
    Harness,
    Wire,
    open_producer,
    open_producers,
    send_frame,
)


async def test_a_drain_ends_when_its_connection_is_lost_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A drain waits for the receipts of the sends in flight, but not once
    the connection is gone (its broker hung up): no receipt can come any
    more, and a drain that waited its whole deadline for each such
    connection held up the proxy's shutdown by as much."""
    send_seen = trio.Event()
    hang_up = trio.Event()
    got: list[Frame] = []

    async def broker(wire: Wire) -> None:
        while (frame := await wire.receive()) is not None:
            got.append(frame)
            if not await open_producers(wire, frame) and frame.name == "SEND":
                send_seen.set()  # never receipted
                await hang_up.wait()
                await wire.stream.aclose()
                return

    drained_at: list[float] = []
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, broker)
        h.start()
        await open_producer(h)
        await h.client.send(send_frame(1))
        await send_seen.wait()
        started = trio.current_time()

        async def drain() -> None:
            await h.relay.drain(started + 20.0)
            drained_at.append(trio.current_time() - started)

        nursery.start_soon(drain)
        await trio.sleep(1.0)
        assert not drained_at  # waiting for the receipt
        hang_up.set()
        await h.done.wait()
        with trio.fail_after(30):
            while not drained_at:
                await trio.sleep(0.01)
    assert h.reason == "broker_closed"
    assert [f.name for f in got] == ["CONNECT", "PRODUCER", "SEND"]
    assert drained_at[0] < 2.0, f"the drain waited {drained_at[0]:g}s of its 20s"
