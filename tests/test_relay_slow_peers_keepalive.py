"""What the keepalive writes (a lookup client's PING, the AUTH_CHALLENGE of
a credential refresh) waits behind what is being written to the same
peer. A peer that takes a long write in slowly but steadily (a consumer
reading a large MESSAGE at a slow link's pace) is alive: before, the
keepalive gave its own write half an interval and then closed the
connection as ``idle``, however steadily the write ahead of it went. Now
only a write that makes no progress for the stall bound (two intervals,
measured by what the peer takes in) ends the connection; a peer that
takes nothing in is still closed as ``idle``.

A ``Relay`` over loopback TCP with small buffers (so that the peer's
reading paces the write), driven by a core that writes a large block when
the client asks and a PING at every keepalive tick."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from sluice.addresses import Address
from sluice.protocols.core import Action, Close, Conn, Peer, Send
from sluice.proxy.relay import Relay, Timing
from tests.test_pulsar_core import Recording
from tests.test_relay_backpressure import stalled_pair

pytestmark = pytest.mark.e2e

INTERVAL = 0.4  # --keepalive-interval: ticks every 0.2 s, stall bound 0.8 s
BIG = 16 * 1024 * 1024  # far more than the slow reader takes in during the test
READING = 5 * INTERVAL  # how long the slow reader reads: ten times the old half interval
BOUND = 10.0  # what a test waits for at most


class Core:
    """Writes BIG bytes to the client when it sends anything, and a PING at
    every keepalive tick once established."""

    keeps_alive = True
    established = True
    in_flight_sends = 0
    upstream_pending = False

    def __init__(self) -> None:
        self.conn = Conn(1, "127.0.0.1:5000", "plain", "test")
        self.pings = 0
        self.reason: str | None = None

    def receive_client(self, data: bytes, now: float) -> list[Action]:
        if not data:
            return [Close("closed")]
        return [Send(Peer.CLIENT, b"m" * BIG)]

    def receive_broker(self, data: bytes, now: float) -> list[Action]:
        raise AssertionError("no broker")

    def upstream_failed(self, message: str, now: float) -> list[Action]:
        raise AssertionError("no broker")

    def upstream_ready(self, now: float) -> list[Action]:
        raise AssertionError("no broker")

    def answered(self, token: int, answer: Any, now: float) -> list[Action]:
        raise AssertionError("no asks")

    def keepalive(self, now: float, interval: float) -> list[Action]:
        self.pings += 1
        return [Send(Peer.CLIENT, b"PING")]

    def drain(self) -> list[Action]:
        return []

    def closed(self, reason: str) -> None:
        self.reason = reason


async def _dial(address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
    raise AssertionError("no broker")


async def _ask(address: Address, request: Any) -> Any:
    raise AssertionError("no asks")


def _relay(core: Core, ours: trio.SocketStream) -> Relay:
    timing = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=INTERVAL)
    return Relay(core, ours, timing=timing, dial=_dial, ask=_ask, tap=Recording())


async def test_a_keepalive_behind_a_slow_but_steady_write_keeps_the_connection() -> None:
    client_end, ours = stalled_pair()
    core = Core()
    relay = _relay(core, ours)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        with trio.fail_after(BOUND):
            await client_end.send_all(b"go")
            # About 200 KB/s, taken in every 20 ms: the write ahead of the
            # keepalive's PING never goes 0.1 s without progress.
            started = trio.current_time()
            taken = 0
            while trio.current_time() - started < READING:
                data = await client_end.receive_some(4096)
                assert data, (
                    f"closed as {core.reason!r} after {trio.current_time() - started:.2f}s, "
                    f"{taken} bytes taken in"
                )
                taken += len(data)
                await trio.sleep(0.02)
            assert core.reason is None, core.reason
            # The keepalive ticked once, and its PING waits behind the write
            # (its next tick comes after it).
            assert core.pings == 1
            assert taken > 64 * 1024  # the write went on all along
            await client_end.aclose()
            nursery.cancel_scope.cancel()


async def test_a_peer_that_takes_nothing_in_is_still_closed_as_idle() -> None:
    client_end, ours = stalled_pair()
    core = Core()
    relay = _relay(core, ours)
    reason: list[str] = []

    async def run() -> None:
        reason.append(await relay.run())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(BOUND):
            await client_end.send_all(b"go")
            started = trio.current_time()
            while not reason:  # the relay's own clock: polled, within BOUND
                await trio.sleep(0.02)
            took = trio.current_time() - started
        await client_end.aclose()
    assert reason == ["idle"]
    assert core.reason == "idle"
    assert core.pings >= 1
    # A stall bound (two intervals) without progress; the first may see the
    # last of what was in flight taken in, and count as progress.
    assert took < 3 * 2 * INTERVAL, took
