"""The relay thread (sluice/proxy/relay_thread.py) on kernel sockets with
small buffers: what it carries arrives whole and in order, across the hand
backs that backpressure causes, and the taps see the same as without it."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import trio
import trio.testing

from sluice.addresses import Address
from sluice.protocols import registry
from sluice.protocols.core import Conn, OnInvalid, Relayed, Taps
from sluice.protocols.faults import FaultAction, Match, Rule
from sluice.protocols.pulsar import Frame, pb
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.decoder import COMPILED, FrameDecoder
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay import Relay
from sluice.proxy.relay_thread import RelayThread, relay_thread
from tests.helpers.poll import wait_until
from tests.test_relay_clock import (
    BROKER_URL,
    TIMING,
    TOPIC,
    BrokerScript,
    Harness,
    Stream,
    Wire,
    connect,
    frame_bytes,
    never_ask,
    open_producer,
    open_producers,
    real_socket_pair,
    receipt,
    send_frame,
)

# Varied sizes, several far over the 4 KiB socket buffers: writes that the
# socket does not take whole, handed back to trio and finished there.
SIZES = [10, 70_000, 1_000, 5, 33_000, 200, 65_536, 1, 9_000, 130_000] * 4


def needs_the_compiled_step() -> None:
    """For the tests that hold what the compiled step does: without it
    (SLUICE_FRAMES=python, or a tree nobody built) they fail saying why."""
    assert COMPILED is not None, (
        "this test needs the compiled frame path: built (pip install -e .), "
        "and not turned off by SLUICE_FRAMES=python"
    )


class QuickDial(Harness):
    """The clock harness, dialling at once (these tests run on the real clock)."""

    write_waits = 0  # the relay thread's, once the connection is over
    compiled_runs = 0  # (the same)

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


async def relay_sends(
    thread: bool, taps: Taps | None = None
) -> tuple[list[Frame], list[int], QuickDial, int, int]:
    got: list[Frame] = []
    receipts: list[int] = []
    async with relay_thread(thread) as carrier, trio.open_nursery() as nursery:
        h = QuickDial(nursery, slow_broker(got), real_socket_pair, real_socket_pair, carrier,
                      taps)  # fmt: skip
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
        h.write_waits = carrier.write_waits if carrier is not None else 0
        h.compiled_runs = carrier.compiled_runs if carrier is not None else 0
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


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_a_compiled_reads_write_that_must_wait_is_finished_on_the_thread(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the metrics the only tap, the compiled step carries the SENDs;
    a write the broker's 4 KiB socket buffer does not take whole is
    finished by the relay thread when the socket has room, the direction
    reading nothing more meanwhile, instead of going back to trio: every
    SEND arrives whole and in order, and the writes waited are counted.
    The same with the relay thread's Python loop."""
    needs_the_compiled_step()
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    expected = list(range(len(SIZES)))
    got, receipts, h, _, handed = await relay_sends(True, Taps([Metrics()]))
    assert [f.body.sequence_id for f in got] == expected
    assert [f.payload for f in got] == [bytes([i % 251]) * n for i, n in enumerate(SIZES)]
    assert receipts == expected and h.reason == "closed"
    assert h.write_waits > 1, (h.write_waits, handed)


async def sends_one_at_a_time(h: QuickDial, count: int) -> None:
    """``count`` SENDs of 100 bytes from ``h``'s client, each after the
    last one's receipt."""
    for sequence in range(count):
        await h.client.send(send_frame(sequence, b"x" * 100))
        answer = await h.client.receive()
        assert answer is not None and answer.name == "SEND_RECEIPT", answer


async def steps_for_sends_one_at_a_time(count: int) -> int:
    """The relay thread's steps over a connection that opens a producer,
    sends ``count`` messages, each after the last one's receipt (a read
    each way per message), and hangs up."""
    got: list[Frame] = []
    async with relay_thread(True) as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        h = QuickDial(nursery, slow_broker(got), real_socket_pair, real_socket_pair, carrier)
        h.start()
        with trio.fail_after(30):
            await open_producer(h)
            await sends_one_at_a_time(h, count)
            await h.client.stream.aclose()
            await h.done.wait()
        assert len(got) == count and h.reason == "closed"
        return carrier.steps_run


async def test_a_connection_that_relays_a_few_reads_stays_in_trio() -> None:
    # Handing a direction to the thread and back costs more than the few
    # reads of a short connection (relay.LEAVE_AFTER); one that keeps
    # going is carried by the thread after them.
    assert await steps_for_sends_one_at_a_time(2) == 0
    assert await steps_for_sends_one_at_a_time(12) >= 12


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


class ThreadWire:
    """Frames over a blocking socket, for a client or broker in a thread of
    its own (trio sleeps meanwhile, as it does beside a real proxy's peers)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(5 * 1024 * 1024)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float) -> Frame | None:
        """The next frame; None when none comes within ``timeout`` or the end."""
        self.sock.settimeout(timeout)
        while not isinstance(event := self.decoder.next_event(), Frame):
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                return None
            self.decoder.receive_data(data)
        return event


def wire_producer(wire: ThreadWire) -> None:
    """A client's CONNECT, then its producer 1 on TOPIC, each answered."""
    wire.send(connect(BROKER_URL))
    assert (answer := wire.receive(10)) is not None and answer.name == "CONNECTED"
    wire.send(frame_bytes("PRODUCER", pb.CommandProducer(topic=TOPIC, producer_id=1,
                                                         request_id=1)))  # fmt: skip
    assert (answer := wire.receive(10)) is not None and answer.name == "PRODUCER_SUCCESS"


def serve_broker(sock: socket.socket, got: list[Frame]) -> None:
    """A broker that accepts a producer and receipts each SEND."""
    wire = ThreadWire(sock)
    with sock:
        while (frame := wire.receive(30)) is not None:
            if frame.name == "CONNECT":
                wire.send(frame_bytes("CONNECTED", pb.CommandConnected(server_version="b")))
            elif frame.name == "PRODUCER":
                ok = pb.CommandProducerSuccess(request_id=frame.body.request_id, producer_name="p")
                wire.send(frame_bytes("PRODUCER_SUCCESS", ok))
            elif frame.name == "SEND":
                got.append(frame)
                wire.send(receipt(frame))


def plain_pair() -> tuple[trio.SocketStream, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


class OverSockets:
    """One connection over kernel socket pairs: its core (``taps`` its
    taps), the client's end for a thread of its own (``client_sock``), a
    broker in a thread that receipts each SEND (into ``got``), and the
    relay that dials it."""

    def __init__(self, taps: Taps) -> None:
        self.taps = taps
        self.client_stream, self.client_sock = plain_pair()
        self.broker_stream, broker_sock = plain_pair()
        self.got: list[Frame] = []
        self.broker = threading.Thread(target=serve_broker, args=(broker_sock, self.got),
                                       daemon=True)  # fmt: skip
        self.broker.start()
        self.core = PulsarConnection(
            Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
            PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
            Routing(parse_broker_url(BROKER_URL)),
            taps,
        )

    async def dial(self, address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
        return self.broker_stream

    def relay(self, carrier: RelayThread) -> Relay:
        return Relay(self.core, self.client_stream, timing=TIMING, dial=self.dial,
                     ask=never_ask, tap=self.taps, thread=carrier)  # fmt: skip


CYCLE = [10, 1000, 300, 70_000, 50]  # 70 KB: read in parts, the Python way


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_the_compiled_loop_carries_reads_itself_and_python_state_still_rules(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the metrics the only tap, the relay thread's compiled loop
    carries armed directions by itself; a fault rule added in trio while
    they are armed applies to the very next read, and once it is removed
    reads go through again. The Python loop (a tree without the compiled
    module, its turn two locks) relays the same."""
    if loop == "compiled":
        needs_the_compiled_step()
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    metrics = Metrics()
    c = OverSockets(Taps([metrics]))
    core = c.core

    def client() -> tuple[list[int], bool, int | None]:
        wire = ThreadWire(c.client_sock)
        with c.client_sock:
            wire_producer(wire)
            answered = []
            for sequence in range(30):
                wire.send(send_frame(sequence, bytes([sequence]) * CYCLE[sequence % 5]))
                answer = wire.receive(10)
                assert answer is not None and answer.name == "SEND_RECEIPT", answer
                answered.append(answer.body.sequence_id)
            rule = Rule(Match(command="SEND"), FaultAction.DROP, id="d")
            trio.from_thread.run_sync(core.faults.add, rule)
            wire.send(send_frame(100, b"dropped"))
            dropped = wire.receive(0.5) is None
            trio.from_thread.run_sync(core.faults.remove, "d")
            wire.send(send_frame(101, b"through"))
            answer = wire.receive(10)
            return answered, dropped, answer.body.sequence_id if answer is not None else None

    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        nursery.start_soon(c.relay(carrier).run)
        with trio.fail_after(30):
            answered, dropped, last = await trio.to_thread.run_sync(client)
        native = carrier.compiled_runs
        metrics.watch_relay(carrier)
        value = metrics.registry.get_sample_value
        exported = [
            value("sluice_relay_thread_reads_total", {"path": path})
            for path in ("compiled", "python")
        ]
    c.broker.join(10)
    assert exported[0] == native and exported[1] is not None and exported[1] > 0
    assert answered == list(range(30)) and dropped and last == 101
    assert [f.body.sequence_id for f in c.got] == [*range(30), 101]
    assert [len(f.payload) for f in c.got[:30]] == [CYCLE[i % 5] for i in range(30)]
    if loop == "compiled":
        assert native >= 20, native  # most reads, not only the first after a Python step
    else:
        assert native == 0


async def test_the_compiled_loop_reads_trios_own_clock_without_calling_it() -> None:
    clock = trio.lowlevel.current_clock()
    offset = relay_thread_module._monotonic_offset(clock)
    try:
        from sluice._frames import Carrier
    except ImportError:  # a source tree nobody built: the Python loop calls the clock
        assert offset is None
        return
    assert offset is not None
    for _ in range(3):
        before = trio.current_time()
        read = Carrier.monotonic(offset)
        after = trio.current_time()
        assert before - 1e-6 <= read <= after + 1e-6
    # Any other clock is called.
    assert relay_thread_module._monotonic_offset(trio.testing.MockClock()) is None


async def test_a_python_read_step_disarms_its_own_connections_lanes_only() -> None:
    """Two connections on one relay thread. Before each of A's SENDs, B's
    client opens a producer: a read the compiled step leaves to the Python
    way, whose code can change B's state and nothing of A's. A's lanes stay
    armed across it, so the compiled loop carries most of A's reads by
    itself (each lane counts the reads it carried alone); B's read steps
    all ran in Python."""
    needs_the_compiled_step()
    rounds = 40
    cores, relays, clients = [], [], []
    broker_threads = []
    taps = Taps([Metrics()])
    for conn_id in (1, 2):
        client_stream, client_sock = plain_pair()
        broker_stream, broker_sock = plain_pair()
        thread = threading.Thread(target=serve_broker, args=(broker_sock, []), daemon=True)
        thread.start()
        broker_threads.append(thread)
        cores.append(PulsarConnection(
            Conn(conn_id, f"127.0.0.1:{5000 + conn_id}", "plain", "pulsar"),
            PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
            Routing(parse_broker_url(BROKER_URL)),
            taps,
        ))  # fmt: skip
        clients.append((client_stream, client_sock, broker_stream))

    def client() -> int:
        wires = [ThreadWire(sock) for _, sock, _ in clients]
        for wire in wires:
            wire_producer(wire)
        a, b = wires
        for sequence in range(rounds):
            b.send(frame_bytes("PRODUCER", pb.CommandProducer(
                topic=TOPIC, producer_id=10 + sequence, request_id=10 + sequence)))  # fmt: skip
            assert (answer := b.receive(10)) is not None and answer.name == "PRODUCER_SUCCESS"
            a.send(send_frame(sequence, b"x" * 100))
            answer = a.receive(10)
            assert answer is not None and answer.name == "SEND_RECEIPT", answer
        for _, sock, _ in clients:
            sock.close()
        return rounds

    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        for core, (client_stream, _, broker_stream) in zip(cores, clients, strict=True):

            async def dial(address: Address, tls: bool, timeout: float,
                           stream: trio.abc.Stream = broker_stream) -> trio.abc.Stream:  # fmt: skip
                return stream

            relay = Relay(core, client_stream, timing=TIMING, dial=dial, ask=never_ask, tap=taps,
                          thread=carrier)  # fmt: skip
            relays.append(relay)
            nursery.start_soon(relay.run)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(client)
        runs = [
            sum(lane.runs for lane in relay._lanes.values() if lane is not None) for relay in relays
        ]
    for thread in broker_threads:
        thread.join(10)
    # A: its SENDs and receipts, 2 * rounds reads, nearly all carried alone.
    assert runs[0] >= rounds, runs
    assert runs[1] <= rounds // 4, runs


async def test_lanes_carry_with_the_step_the_core_renewed_when_the_taps_changed() -> None:
    """The taps change while a connection's lanes are armed (a live view
    begins: ``Taps.changed`` in trio), and the core builds a new compiled
    step. From the next read on, each direction carries with that step:
    a SEND whose start a carried read ends in and whose rest comes in a
    read the step gives back (with a PRODUCER) arrives whole, and the
    connection goes on. (A lane that kept the old step held that start
    where the core never looked: the rest read as a frame of 800 MB, and
    the connection was closed as unframeable.)"""
    needs_the_compiled_step()
    taps = Taps([Metrics()])
    c = OverSockets(taps)
    core, got = c.core, c.got

    def client(relay: Relay) -> tuple[list[str], list[bool], bool]:
        wire = ThreadWire(c.client_sock)
        with c.client_sock:
            wire_producer(wire)
            for sequence in range(14):
                if sequence == 10:
                    trio.from_thread.run_sync(taps.changed)  # as a live view's first poll
                wire.send(send_frame(sequence, b"x" * 100))
                answer = wire.receive(10)
                assert answer is not None and answer.name == "SEND_RECEIPT", answer
            lanes = [lane.step is core._step for lane in relay._lanes.values() if lane is not None]
            split = send_frame(15, b"z" * 100)
            wire.send(send_frame(14, b"y" * 100) + split[:10])
            # That read taken: the start of SEND 15 held.
            wait_until(lambda: len(got) == 15, 10, "15 frames at the broker", step=0.005)
            wire.send(split[10:] + frame_bytes("PRODUCER", pb.CommandProducer(
                topic=TOPIC, producer_id=2, request_id=2)))  # fmt: skip
            answers: list[str] = []
            while len(answers) < 3 and (answer := wire.receive(10)) is not None:
                answers.append(answer.name)
            return answers, lanes, relay._closing

    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        relay = c.relay(carrier)
        nursery.start_soon(relay.run)
        with trio.fail_after(30):
            answers, lanes, closing = await trio.to_thread.run_sync(client, relay)
        nursery.cancel_scope.cancel()
    c.broker.join(10)
    assert answers == ["SEND_RECEIPT", "SEND_RECEIPT", "PRODUCER_SUCCESS"]
    assert [f.body.sequence_id for f in got] == list(range(16))
    assert got[15].payload == b"z" * 100
    assert not closing  # before the client left (it was closed: unframeable)
    assert lanes == [True, True]  # both directions carry with the renewed step


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_the_turn_is_held_by_one_thread_at_a_time_and_always_passed_on(compiled: bool) -> None:
    """Three threads take and give the turn in a tight loop, letting the GIL
    go while they hold it. None finds another inside, and none sleeps on
    after the turn was given (a lost wake-up would hang it past the join)."""
    if compiled:
        from sluice._frames import Turn

        turn: Turn | relay_thread_module._Turn = Turn()
    else:
        turn = relay_thread_module._Turn()
    inside: list[int] = []
    overlaps: list[int] = []
    rounds = 3000

    def take_turns(me: int) -> None:
        for _ in range(rounds):
            turn.take()
            inside.append(me)
            time.sleep(0)  # the GIL goes to another thread, which must wait
            if inside != [me]:
                overlaps.append(me)
            inside.remove(me)
            turn.give()

    threads = [threading.Thread(target=take_turns, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread never got the turn back"
    assert overlaps == []
