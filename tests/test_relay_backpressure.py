"""A client that stops reading holds back what Sluice reads from it.

The relay writes a read's frames before it reads again, so a peer that
stops reading stops its other side too, and nothing piles up in Sluice.
Answers to requests Sluice asks its shared upstream connections about (a
Pulsar lookup) are written by tasks of their own, apart from the client's
reading: a client that pipelined lookups and never read their answers
made Sluice keep one waiting task and answer per lookup, without bound.
Now the relay stops reading while ANSWERS_WAITING answers wait to be
written: what it holds is those, and the lookups of its last read (at most
the process's concurrent lookups, which the core answers itself beyond).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import trio
import trio.testing

from sluice.addresses import Address
from sluice.protocols.core import Closed, Conn, OnInvalid
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.connection import (
    PulsarConnection,
    PulsarSettings,
    Routing,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy import relay as relay_module
from sluice.proxy.relay import Relay, Timing
from tests.test_pulsar_core import LookupResponse, Recording, lookup_answer
from tests.test_relay_clock import Wire, connect

T = Type.Value
TIMING = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=30.0)
LOOKUPS = 20_000
BROKER_URL = "pulsar://127.0.0.1:6650"
MAX_LOOKUPS = 1_000  # the process's concurrent lookups (the default): more than a read holds


def stalled_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """Loopback TCP: (the client's end, Sluice's end), with small buffers,
    so that what either end does not read soon fills them."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.socket()
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            peer.setsockopt(socket.SOL_SOCKET, option, 4096)
        peer.connect(listener.getsockname())
        ours, _ = listener.accept()
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        ours.setsockopt(socket.SOL_SOCKET, option, 4096)
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(peer)),
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
    )


def lookup(request_id: int) -> bytes:
    body = pb.CommandLookupTopic(topic=f"persistent://t/n/x{request_id}", request_id=request_id)
    return encode(command(T("LOOKUP"), body))


class Answers(trio.abc.Instrument):
    """How many of the relay's answering tasks were alive at once, at most."""

    def __init__(self) -> None:
        self.alive = 0
        self.most = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Relay._answer"):
            self.alive += 1
            self.most = max(self.most, self.alive)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Relay._answer"):
            self.alive -= 1


async def _dial(address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
    raise AssertionError("a lookup connection dials nothing")


async def _ask(address: Address, request: Any) -> Any:
    await trio.lowlevel.checkpoint()
    return lookup_answer(LookupResponse.Connect, BROKER_URL)


async def test_lookups_whose_answers_are_not_read_stop_the_clients_reading() -> None:
    client_end, ours = stalled_pair()
    tap = Recording()
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
        Routing(parse_broker_url(BROKER_URL), max_lookups=MAX_LOOKUPS),
        tap,
    )
    relay = Relay(core, ours, timing=TIMING, dial=_dial, ask=_ask, tap=tap)
    answers = Answers()
    trio.lowlevel.add_instrument(answers)
    sent = 0
    ended = trio.Event()

    async def run() -> None:
        await relay.run()
        ended.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            client = Wire(client_end)
            with trio.fail_after(10):
                await client.send(connect())
                connected = await client.receive()
                assert connected is not None and connected.name == "CONNECTED"

                async def pipeline() -> None:  # and never read an answer
                    nonlocal sent
                    for first in range(0, LOOKUPS, 100):
                        batch = b"".join(lookup(i) for i in range(first, first + 100))
                        await client_end.send_all(batch)
                        sent += 100

                sending = trio.CancelScope()

                async def send_while_sluice_reads() -> None:
                    with sending:
                        await pipeline()

                nursery.start_soon(send_while_sluice_reads)
                # Everything settles: the client's writes wait for Sluice to
                # read, or all were read and their answers wait to be written.
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                waiting = answers.alive
                sending.cancel()
                # The client goes away unread (a reset): the connection ends.
                client_end.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                await client_end.aclose()
                await ended.wait()
    finally:
        trio.lowlevel.remove_instrument(answers)
    total = LOOKUPS * len(lookup(0))
    assert relay.bytes_in - len(connect()) < total / 4, "Sluice read on"
    assert answers.most <= relay_module.ANSWERS_WAITING + MAX_LOOKUPS, (answers.most, sent)
    assert waiting <= relay_module.ANSWERS_WAITING + MAX_LOOKUPS
    assert relay.reason == "lost"


async def test_a_lookup_client_that_takes_nothing_in_is_closed_by_the_keepalive() -> None:
    """The keepalive pings a silent lookup client and closes it after two
    intervals of silence. A client that no longer read (a hung process: its
    window full, its host still acknowledging) held the ping's write for
    ever, and with it the clock: the connection was never closed. Now the
    writes waiting for it (the answers, the ping behind them) end it once
    they make no progress for the stall bound (two intervals)."""
    interval = 0.4
    client_end, ours = stalled_pair()
    tap = Recording()
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
        Routing(parse_broker_url(BROKER_URL), max_lookups=MAX_LOOKUPS),
        tap,
    )
    timing = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=interval)
    relay = Relay(core, ours, timing=timing, dial=_dial, ask=_ask, tap=tap)
    reason: list[str] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            reason.append(await relay.run())

        nursery.start_soon(run)
        client = Wire(client_end)
        with trio.fail_after(10):
            await client.send(connect())
            connected = await client.receive()
            assert connected is not None and connected.name == "CONNECTED"
            # Lookups until Sluice's writes to the client wait, then silence.
            sending = trio.CancelScope()

            async def pipeline() -> None:
                with sending:
                    for first in range(0, LOOKUPS, 100):
                        batch = b"".join(lookup(i) for i in range(first, first + 100))
                        await client_end.send_all(batch)

            nursery.start_soon(pipeline)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            sending.cancel()
            stalled = trio.current_time()
            # (The relay's own clock: polled, within fail_after's bound. The
            # core is told at once; the sockets close after the hang-up.)
            while not any(isinstance(event, Closed) for event in tap.events):
                await trio.sleep(0.02)
            took = trio.current_time() - stalled
            await client_end.aclose()
            while not reason:
                await trio.sleep(0.02)
    assert reason == ["idle"]
    # A stall bound without progress; the first may see the last of what
    # was in flight taken in, and count as progress.
    assert took < 3 * 2 * interval, took
