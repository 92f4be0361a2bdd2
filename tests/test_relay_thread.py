"""The relay thread (sluice/proxy/relay_thread.py) on kernel sockets with
small buffers: what it carries arrives whole and in order, across the hand
backs that backpressure causes, and the taps see the same as without it."""

from __future__ import annotations

import socket

import trio

from sluice.addresses import Address
from sluice.protocols import registry
from sluice.protocols.core import Relayed
from sluice.protocols.pulsar import Frame
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import (
    BrokerScript,
    Harness,
    Stream,
    Wire,
    open_producer,
    open_producers,
    real_socket_pair,
    receipt,
    send_frame,
)

# Varied sizes, several far over the 4 KiB socket buffers: writes that the
# socket does not take whole, handed back to trio and finished there.
SIZES = [10, 70_000, 1_000, 5, 33_000, 200, 65_536, 1, 9_000, 130_000] * 4


class QuickDial(Harness):
    """The clock harness, dialling at once (these tests run on the real clock)."""

    async def dial(self, address: Address, tls: bool, timeout: float) -> Stream:
        assert self.broker_script is not None
        ours, theirs = self.broker_pair()
        self.dialed.append((address, trio.current_time()))
        self.nursery.start_soon(self.broker_script, Wire(theirs))
        return ours


def slow_broker(got: list[Frame]) -> BrokerScript:
    """Accepts one producer; reads SENDs with a pause now and then (so the
    relay's writes to it back up), receipting each."""

    async def broker(wire: Wire) -> None:
        while (frame := await wire.receive()) is not None:
            if not await open_producers(wire, frame) and frame.name == "SEND":
                got.append(frame)
                if len(got) % 3 == 0:
                    await trio.sleep(0.005)
                await wire.send(receipt(frame))

    return broker


async def relay_sends(thread: bool) -> tuple[list[Frame], list[int], QuickDial, int, int]:
    got: list[Frame] = []
    receipts: list[int] = []
    async with relay_thread(thread) as carrier, trio.open_nursery() as nursery:
        h = QuickDial(nursery, slow_broker(got), real_socket_pair, real_socket_pair, carrier)
        h.start()
        with trio.fail_after(30):
            await open_producer(h)

            async def send_all() -> None:
                for sequence, size in enumerate(SIZES):
                    await h.client.send(send_frame(sequence, bytes([sequence % 251]) * size))

            nursery.start_soon(send_all)
            while len(receipts) < len(SIZES):
                frame = await h.client.receive()
                assert frame is not None and frame.name == "SEND_RECEIPT", frame
                receipts.append(frame.body.sequence_id)
            await h.client.stream.aclose()
            await h.done.wait()
        steps = carrier.steps_run if carrier is not None else 0
        handed = carrier.handed_back if carrier is not None else 0
        if carrier is not None:
            assert carrier.carried() == 0
    return got, receipts, h, steps, handed


async def test_sends_cross_whole_and_in_order_through_hand_backs() -> None:
    expected = list(range(len(SIZES)))
    results = {}
    for thread in (False, True):
        got, receipts, h, steps, handed = await relay_sends(thread)
        assert [f.body.sequence_id for f in got] == expected
        assert [f.payload for f in got] == [bytes([i % 251]) * n for i, n in enumerate(SIZES)]
        assert receipts == expected
        assert h.reason == "closed"
        # Each direction's frames (how the two directions interleave is timing).
        seen = [
            [f.name for side, f in h.tap.seen if side is from_client]
            for from_client in (True, False)
        ]
        results[thread] = (seen, len(h.tap.of(Relayed)) > 0)
        if thread:
            # Carried, and handed back (for the writes that had to wait) more than once.
            assert steps > len(SIZES) and handed > 1, (steps, handed)
    # The taps saw the same frames each way, in the same order, either way.
    assert results[True] == results[False]


async def test_the_relay_threads_figures_are_exported() -> None:
    metrics = Metrics(10, registry.get("pulsar"))
    value = metrics.registry.get_sample_value
    assert value("sluice_relay_thread_carried") == 0
    left, right = socket.socketpair()
    with left, right:
        async with relay_thread() as thread:
            assert thread is not None
            metrics.watch_relay(thread)
            thread.carry(left.fileno(), lambda: None)
            thread.handed_back += 3
            assert value("sluice_relay_thread_carried") == 1
            assert value("sluice_relay_thread_handbacks_total") == 3
            thread.drop(left.fileno())
            assert value("sluice_relay_thread_carried") == 0
