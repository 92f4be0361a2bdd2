"""Drains of connections the relay thread carries, while a write waits.

A drain during a write the relay thread finishes itself (a slow reader:
``Relay._write_later``): once the write is done, the client's reads are
not taken up again, so the thread carries nothing of the connection after
it ends (``sluice_relay_thread_carried``).

A drain right after the relay thread handed back a frame it wrote in part
(its Python read step), before trio took it up: the drain's CLOSE_PRODUCER
goes after the rest of that frame, never into it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from sluice.protocols.core import Taps
from sluice.protocols.pulsar import Frame, command, encode_payload, pb
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import (
    BrokerScript,
    Wire,
    open_producer,
    open_producers,
    real_socket_pair,
    receipt,
    send_frame,
)
from tests.test_relay_thread import QuickDial, needs_the_compiled_step, sends_one_at_a_time

WARM = 8  # SENDs one at a time first: past relay.LEAVE_AFTER, on the relay thread


def pausing_broker(got: list[Frame], reading: trio.Event) -> BrokerScript:
    """Accepts a producer and receipts each SEND; after WARM of them, reads
    nothing more until ``reading`` is set."""

    async def broker(wire: Wire) -> None:
        while (frame := await wire.receive()) is not None:
            if not await open_producers(wire, frame) and frame.name == "SEND":
                got.append(frame)
                await wire.send(receipt(frame))
                if len(got) == WARM:
                    await reading.wait()

    return broker


async def draining_in_a_write(
    h: QuickDial, carrier: Any, nursery: trio.Nursery, seconds: float
) -> None:
    """A producer WARM sends in, then one SEND far over the broker's 4 KiB
    socket buffers, which it does not read now (the relay thread waits to
    write the rest itself), and a drain of ``seconds`` begun meanwhile:
    once it has stopped reading the client."""
    await open_producer(h)
    await sends_one_at_a_time(h, WARM)
    nursery.start_soon(h.client.send, send_frame(WARM, b"y" * 200_000))
    while carrier.write_waits == 0:
        await trio.sleep(0.01)
    nursery.start_soon(h.relay.drain, trio.current_time() + seconds)
    while h.relay._reading is not None:  # the drain stops reading the client
        await trio.sleep(0.01)


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_a_drain_during_a_write_the_thread_waits_on_leaves_nothing_carried(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_the_compiled_step()
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    got: list[Frame] = []
    reading = trio.Event()
    async with relay_thread(True) as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        h = QuickDial(nursery, pausing_broker(got, reading), real_socket_pair, real_socket_pair,
                      carrier, Taps([Metrics()]))  # fmt: skip
        h.start()
        with trio.fail_after(30):
            await draining_in_a_write(h, carrier, nursery, 20)
            reading.set()  # the write ends: its receipt, then the drain's CLOSE_PRODUCER
            names = []
            while (frame := await h.client.receive()) is not None:
                names.append(frame.name)
            await h.done.wait()
        assert names == ["SEND_RECEIPT", "CLOSE_PRODUCER"]
        assert h.reason == "drained" and len(got) == WARM + 1
        assert carrier.carried() == 0


BIG = 100_000  # a delivery far over the client's 4 KiB socket buffers


async def message_once(wire: Wire, deliver: trio.Event, size: int) -> None:
    """A MESSAGE of ``size`` bytes to consumer 1 once ``deliver`` is set."""
    await deliver.wait()
    entry = pb.MessageIdData(ledgerId=1, entryId=1)
    body = pb.CommandMessage(consumer_id=1, message_id=entry)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    await wire.send(encode_payload(command(pb.BaseCommand.MESSAGE, body), meta, b"m" * size))


def delivering_broker(deliver: trio.Event) -> BrokerScript:
    """Accepts a producer and receipts each SEND; once ``deliver`` is set,
    sends the client a MESSAGE of BIG bytes."""

    async def broker(wire: Wire) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(message_once, wire, deliver, BIG)
            while (frame := await wire.receive()) is not None:
                if not await open_producers(wire, frame) and frame.name == "SEND":
                    await wire.send(receipt(frame))
            nursery.cancel_scope.cancel()

    return broker


async def test_a_drain_never_writes_into_a_frame_the_thread_handed_back_half_written() -> None:
    deliver = trio.Event()
    async with relay_thread(True) as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        # No compiled step (a tap other than the metrics): the broker's
        # reads go through the thread's Python read step.
        h = QuickDial(nursery, delivering_broker(deliver), real_socket_pair, real_socket_pair,
                      carrier)  # fmt: skip
        h.start()
        with trio.fail_after(30):
            await open_producer(h)
            for sequence in range(WARM):  # both directions go to the relay thread
                await h.client.send(send_frame(sequence, b"x" * 100))
                answer = await h.client.receive()
                assert answer is not None and answer.name == "SEND_RECEIPT", answer
            handed = carrier.handed_back
            deliver.set()
            # The thread writes what the client's socket takes of the MESSAGE
            # and hands the rest back to trio; the drain starts before trio
            # has taken it up (no scheduling point in between).
            while carrier.handed_back == handed:
                await trio.lowlevel.checkpoint()
            frames: list[Frame | str] = []
            read = trio.Event()

            async def read_all() -> None:
                try:
                    while (frame := await h.client.receive()) is not None:
                        frames.append(frame)
                except RemoteProtocolError as exc:  # what a client's decoder makes of it
                    frames.append(str(exc))
                read.set()

            nursery.start_soon(read_all)
            await h.relay.drain(trio.current_time() + 20)
            await h.done.wait()
            await read.wait()
        assert [f if isinstance(f, str) else f.name for f in frames] == [
            "MESSAGE", "CLOSE_PRODUCER",
        ]  # fmt: skip
        message = frames[0]
        assert isinstance(message, Frame) and message.error is None
        assert message.payload == b"m" * BIG
        assert h.reason == "drained"


async def test_a_stopping_proxy_ends_a_drain_stuck_in_a_shielded_write() -> None:
    """A drain shields the write under way, so as not to cut a frame in
    half; a second SIGTERM (``Proxy.stop``) only cancelled the handlers'
    scope, and such a relay went on until --drain-timeout. ``abort``,
    which ``Proxy.stop`` calls on every relay, lifts the shield."""
    needs_the_compiled_step()
    got: list[Frame] = []
    reading = trio.Event()  # never set: the broker reads nothing more
    async with relay_thread(True) as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        h = QuickDial(nursery, pausing_broker(got, reading), real_socket_pair, real_socket_pair,
                      carrier, Taps([Metrics()]))  # fmt: skip
        h.start()
        with trio.fail_after(30):
            await draining_in_a_write(h, carrier, nursery, 60)
        with trio.fail_after(5):  # not the drain's 60 s
            h.relay.abort()
            await h.done.wait()
        assert h.reason == "drained"
        nursery.cancel_scope.cancel()
