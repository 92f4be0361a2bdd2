"""The relay's clocks (handshake deadline, keepalive, drain) on trio's mock clock.

A ``Relay`` drives a real ``PulsarConnection`` over in-memory streams; the
broker is a small task on the far end of the stream a fake ``dial`` returns.
No sockets, no real sleeps: ``autojump_clock`` jumps over idle time.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from google.protobuf.message import Message

from sluice.addresses import Address
from sluice.protocols.core import Closed, Conn, OnInvalid, Rejected, Taps
from sluice.protocols.pulsar import (
    CLOSED,
    Frame,
    FrameDecoder,
    Type,
    command,
    encode,
    encode_payload,
    pb,
)
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.relay import Relay, Timing
from sluice.proxy.relay_thread import RelayThread, relay_thread
from tests.test_pulsar_core import Recording

T = Type.Value
TIMING = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=30.0)
BROKER_URL = "127.0.0.1:6650"
TOPIC = "persistent://t/n/drain"

Stream = trio.abc.Stream
BrokerScript = Callable[["Wire"], Awaitable[None]]


class Wire:
    """Frames over one end of an in-memory stream (the client, or the broker)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> Frame | None:
        """The next frame; None once the other end closed."""
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is CLOSED:
                return None
            self.decoder.receive_data(await self.stream.receive_some(65536))

    async def rest(self) -> list[str]:
        """The names of every frame until the other end closes."""
        out = []
        while (frame := await self.receive()) is not None:
            out.append(frame.name)
        return out


def frame_bytes(name: str, body: Message | None = None) -> bytes:
    return encode(command(T(name), body))


def connect(proxy_to: str | None = None) -> bytes:
    body = pb.CommandConnect(client_version="test-client", protocol_version=21)
    if proxy_to is not None:
        body.proxy_to_broker_url = proxy_to
    return frame_bytes("CONNECT", body)


def send_frame(sequence_id: int, payload: bytes = b"payload") -> bytes:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=sequence_id))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    return encode_payload(cmd, meta, payload)


async def never_ask(address: Address, request: Any) -> Any:
    raise AssertionError(f"unexpected Ask to {address}")


class Harness:
    """A Relay around a PulsarConnection, its client end, and a scripted broker."""

    def __init__(
        self,
        nursery: trio.Nursery,
        broker: BrokerScript | None = None,
        broker_pair: Callable[[], tuple[Stream, Stream]] = trio.testing.memory_stream_pair,
        client_pair: Callable[[], tuple[Stream, Stream]] = trio.testing.memory_stream_pair,
        thread: RelayThread | None = None,
        taps: Taps | None = None,
    ) -> None:
        self.nursery = nursery
        self.broker_pair = broker_pair
        self.tap = Recording()
        self.client_end, self.server_end = client_pair()
        self.client = Wire(self.client_end)
        self.broker_script = broker
        self.dialed: list[tuple[Address, float]] = []
        self.broker_frames: list[Frame] = []
        core = PulsarConnection(
            Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
            PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
            Routing(parse_broker_url("pulsar://127.0.0.1:6650")),
            self.tap if taps is None else taps,
        )
        self.relay = Relay(
            core,
            self.server_end,
            timing=TIMING,
            dial=self.dial,
            ask=never_ask,
            tap=self.tap if taps is None else taps,
            thread=thread,
        )
        self.reason: str | None = None
        self.ended_at: float | None = None
        self.done = trio.Event()

    async def dial(self, address: Address, tls: bool, timeout: float) -> Stream:
        assert self.broker_script is not None, "this test dials nothing"
        await trio.sleep(3.0)  # dialling takes a while; the handshake clock starts after
        ours, theirs = self.broker_pair()
        self.dialed.append((address, trio.current_time()))
        self.nursery.start_soon(self.broker_script, Wire(theirs))
        return ours

    def start(self) -> None:
        self.nursery.start_soon(self._run)

    async def _run(self) -> None:
        self.reason = await self.relay.run()
        self.ended_at = trio.current_time()
        # The proxy closes the client's socket once the relay is done.
        await trio.aclose_forcefully(self.server_end)
        self.done.set()

    def rejected(self) -> list[str]:
        return [e.reason for e in self.tap.events if isinstance(e, Rejected)]


# --- the handshake deadline -----------------------------------------------------


async def test_silent_client_is_closed_after_the_handshake_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        start = trio.current_time()
        h.start()
        await h.done.wait()
    assert h.reason == "handshake_timeout"
    assert h.ended_at is not None
    assert h.ended_at - start == pytest.approx(TIMING.handshake_timeout)
    assert h.rejected() == ["handshake_timeout"]
    assert await h.client.rest() == []  # hung up without a word


async def test_broker_that_never_answers_connect_times_out_from_the_dial(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hellos: list[Frame] = []

    async def mute_broker(broker: Wire) -> None:
        while (frame := await broker.receive()) is not None:
            hellos.append(frame)

    async with trio.open_nursery() as nursery:
        h = Harness(nursery, mute_broker)
        start = trio.current_time()
        h.start()
        await h.client.send(connect(BROKER_URL))
        answer = await h.client.receive()
        rest = await h.client.rest()
        await h.done.wait()
    assert answer is not None and answer.name == "ERROR"
    assert answer.body.error == pb.ServiceNotReady
    assert "handshake" in answer.body.message
    assert rest == []
    assert [a for a, _ in h.dialed] == [Address("127.0.0.1", 6650)]
    dialed_at = h.dialed[0][1]
    assert dialed_at - start == pytest.approx(3.0)
    assert h.ended_at is not None
    # Counted from the end of the dial, not from the client's CONNECT.
    assert h.ended_at - dialed_at == pytest.approx(TIMING.handshake_timeout)
    assert [f.name for f in hellos] == ["CONNECT"]
    assert h.reason == "upstream"


# --- keepalive ------------------------------------------------------------------


async def test_silent_lookup_client_is_pinged_then_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        start = trio.current_time()
        h.start()
        await h.client.send(connect())
        heard: list[tuple[str, float]] = []
        while (frame := await h.client.receive()) is not None:
            heard.append((frame.name, trio.current_time() - start))
        await h.done.wait()
    interval = TIMING.keepalive_interval
    assert [name for name, _ in heard] == ["CONNECTED", "PING"]
    assert heard[1][1] == pytest.approx(interval)
    assert h.reason == "idle"
    assert h.ended_at is not None
    assert h.ended_at - start == pytest.approx(2 * interval)
    assert [e.reason for e in h.tap.events if isinstance(e, Closed)] == ["idle"]


async def test_lookup_client_answering_pings_stays_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pings = 0

    async def answer_pings(wire: Wire) -> None:
        nonlocal pings
        while (frame := await wire.receive()) is not None:
            if frame.name == "PING":
                pings += 1
                await wire.send(frame_bytes("PONG"))

    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.start()
        await h.client.send(connect())
        nursery.start_soon(answer_pings, h.client)
        await trio.sleep(200.0)
        assert h.reason is None, f"relay ended: {h.reason}"
        assert pings == 6  # at 30, 60, ..., 180 s
        nursery.cancel_scope.cancel()


# --- drain ----------------------------------------------------------------------


async def open_producers(wire: Wire, frame: Frame) -> bool:
    """A scripted broker's answer to CONNECT and PRODUCER; False for any other frame."""
    if frame.name == "CONNECT":
        await wire.send(frame_bytes("CONNECTED", pb.CommandConnected(server_version="b")))
    elif frame.name == "PRODUCER":
        ok = pb.CommandProducerSuccess(request_id=frame.body.request_id, producer_name="p")
        await wire.send(frame_bytes("PRODUCER_SUCCESS", ok))
    else:
        return False
    return True


def receipt(send: Frame) -> bytes:
    """The SEND_RECEIPT of ``send``."""
    body = pb.CommandSendReceipt(
        producer_id=send.body.producer_id, sequence_id=send.body.sequence_id
    )
    return frame_bytes("SEND_RECEIPT", body)


def producer_broker(
    receipt_after: float | None, got: list[Frame], send_seen: trio.Event
) -> BrokerScript:
    """A broker that accepts one producer and receipts SENDs after ``receipt_after``
    seconds (never, for None)."""

    async def broker(wire: Wire) -> None:
        while (frame := await wire.receive()) is not None:
            got.append(frame)
            if not await open_producers(wire, frame) and frame.name == "SEND":
                send_seen.set()
                if receipt_after is not None:
                    await trio.sleep(receipt_after)
                    await wire.send(receipt(frame))

    return broker


async def open_producer(h: Harness) -> None:
    await h.client.send(connect(BROKER_URL))
    first = await h.client.receive()
    assert first is not None and first.name == "CONNECTED"
    producer = pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1)
    await h.client.send(frame_bytes("PRODUCER", producer))
    ok = await h.client.receive()
    assert ok is not None and ok.name == "PRODUCER_SUCCESS"


async def test_drain_waits_for_the_receipt_then_closes_the_producer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got: list[Frame] = []
    send_seen = trio.Event()
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, producer_broker(4.0, got, send_seen))
        h.start()
        await open_producer(h)
        await h.client.send(send_frame(1))
        await send_seen.wait()
        started = trio.current_time()
        nursery.start_soon(h.relay.drain, started + 20.0)
        await trio.sleep(0.5)
        # Sent after the drain began: never read, so never forwarded
        # (the client sends it again once it has reconnected).
        await h.client.send(send_frame(2))
        rest = await h.client.rest()
        await h.done.wait()
    assert rest == ["SEND_RECEIPT", "CLOSE_PRODUCER"]
    assert h.reason == "drained"
    assert h.ended_at is not None
    assert h.ended_at - started == pytest.approx(4.0, abs=0.1)
    assert [f.body.sequence_id for f in got if f.name == "SEND"] == [1]


async def test_drain_ends_at_the_deadline_when_the_receipt_never_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got: list[Frame] = []
    send_seen = trio.Event()
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, producer_broker(None, got, send_seen))
        h.start()
        await open_producer(h)
        await h.client.send(send_frame(1))
        await send_seen.wait()
        started = trio.current_time()
        nursery.start_soon(h.relay.drain, started + 20.0)
        rest = await h.client.rest()
        await h.done.wait()
    assert "SEND_RECEIPT" not in rest
    assert h.reason == "drained"
    assert h.ended_at is not None
    assert h.ended_at - started == pytest.approx(20.0, abs=0.1)
    assert h.relay.core.in_flight_sends == 1


class _Pipe:
    """One direction of a socket-like connection, with a finite buffer."""

    def __init__(self, capacity: int) -> None:
        self.data = bytearray()
        self.capacity = capacity
        self.closed = False
        self.lot = trio.lowlevel.ParkingLot()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.closed:
                raise trio.BrokenResourceError("peer closed")
            room = self.capacity - len(self.data)
            if room <= 0:
                await self.lot.park()
                continue
            self.data += view[:room]
            view = view[room:]
            self.lot.unpark_all()
        await trio.lowlevel.checkpoint()

    async def read(self, max_bytes: int) -> bytes:
        while not self.data and not self.closed:
            await self.lot.park()
        chunk = bytes(self.data[:max_bytes])
        del self.data[:max_bytes]
        self.lot.unpark_all()
        await trio.lowlevel.checkpoint()
        return chunk

    def close(self) -> None:
        self.closed = True
        self.lot.unpark_all()


class SocketLike(trio.abc.Stream):
    """Like a TCP socket: a send goes out in pieces as the peer's buffer
    drains, so a cancelled ``send_all`` may have sent part of its data."""

    def __init__(self, outgoing: _Pipe, incoming: _Pipe) -> None:
        self.outgoing = outgoing
        self.incoming = incoming

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.outgoing.write(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.incoming.read(max_bytes or 65536)

    async def aclose(self) -> None:
        self.outgoing.close()
        self.incoming.close()
        await trio.lowlevel.checkpoint()


def real_socket_pair() -> tuple[Stream, Stream]:
    """Two connected kernel sockets with small buffers: the relay reads and
    writes these itself, past trio's streams (``relay._descriptor``)."""
    ends = trio.socket.socketpair()
    for end in ends:
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return trio.SocketStream(ends[0]), trio.SocketStream(ends[1])


def socket_pair(capacity: int = 16) -> tuple[Stream, Stream]:
    a_to_b, b_to_a = _Pipe(capacity), _Pipe(capacity)
    return SocketLike(a_to_b, b_to_a), SocketLike(b_to_a, a_to_b)


def busy_broker(got: list[Frame], first_send: trio.Event, problems: list[str]) -> BrokerScript:
    """Receipts each SEND after being busy for 5 s, reading nothing meanwhile."""

    async def broker(wire: Wire) -> None:
        try:
            while (frame := await wire.receive()) is not None:
                got.append(frame)
                if not await open_producers(wire, frame) and frame.name == "SEND":
                    first_send.set()
                    await trio.sleep(5.0)
                    await wire.send(receipt(frame))
        except RemoteProtocolError as exc:
            problems.append(exc.problem.value)
        except trio.BrokenResourceError:
            problems.append("broken")

    return broker


async def drain_with_a_send_stuck_in_the_write(
    pair: Callable[[], tuple[Stream, Stream]],
    client_pair: Callable[[], tuple[Stream, Stream]] = trio.testing.memory_stream_pair,
    payload: bytes = b"payload",
    thread: RelayThread | None = None,
) -> tuple[Harness, float, list[str], list[Frame], list[str]]:
    got: list[Frame] = []
    problems: list[str] = []
    first_send = trio.Event()
    async with trio.open_nursery() as nursery:
        broker = busy_broker(got, first_send, problems)
        h = Harness(nursery, broker, pair, client_pair, thread)
        h.start()
        await open_producer(h)
        await h.client.send(send_frame(1))
        await first_send.wait()
        # Read by the relay, stuck writing it on (the client's end sends it
        # from its own task: on sockets it is larger than the buffers).
        nursery.start_soon(h.client.send, send_frame(2, payload))
        await trio.sleep(1.0)
        started = trio.current_time()
        nursery.start_soon(h.relay.drain, started + 20.0)
        rest = await h.client.rest()
        await h.done.wait()
    assert h.ended_at is not None
    return h, h.ended_at - started, rest, got, problems


async def test_drain_waits_for_a_send_that_was_still_being_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Lockstep streams: a write, once started, lands whole even if cancelled.
    h, took, rest, got, problems = await drain_with_a_send_stuck_in_the_write(
        trio.testing.lockstep_stream_pair
    )
    assert [f.body.sequence_id for f in got if f.name == "SEND"] == [1, 2]
    assert rest == ["SEND_RECEIPT", "SEND_RECEIPT", "CLOSE_PRODUCER"]
    assert took == pytest.approx(9.0, abs=0.1)  # receipts at +4 s and +9 s
    assert h.reason == "drained" and problems == []


async def test_drain_does_not_cut_a_send_to_the_broker_in_half(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A drain stops reading the client while its reading task may be in
    the middle of writing a frame it read to the broker (backpressure: a
    busy broker, full socket buffers). That write is finished (it runs
    shielded, ``Relay._do``): a write cut short would leave part of the
    frame on the broker connection, with the SEND counted in flight, and
    the drain would wait out its whole deadline for a receipt that could
    never come, then send the client no CLOSE_PRODUCER either.
    """
    h, took, rest, got, problems = await drain_with_a_send_stuck_in_the_write(socket_pair)
    assert h.reason == "drained"
    assert rest[:1] == ["SEND_RECEIPT"]
    summary = (
        f"drain took {took:g}s of its 20s; the broker saw {problems or 'whole frames'} "
        f"after {[f.name for f in got]}; the client got {rest}"
    )
    assert problems == [], summary
    assert took < 10.0, summary
    assert rest[-1:] == ["CLOSE_PRODUCER"], summary


@pytest.mark.parametrize("thread", [False, True], ids=["trio", "relay-thread"])
async def test_drain_on_sockets_waits_for_a_write_the_socket_would_not_take(
    autojump_clock: trio.testing.MockClock, thread: bool
) -> None:
    """The same on kernel sockets, which the relay writes itself: a frame
    far larger than the socket buffers is still being written when the
    drain begins, and reaches the broker whole. With the relay thread, the
    thread reads the frame and starts the write, and hands the rest back."""
    payload = bytes(range(256)) * 1024  # 256 KiB, against 4 KiB buffers
    if thread:
        # trio does not see the relay thread's work: it jumps the clock only
        # after a real pause, not whenever its own tasks are all waiting
        # (a late step of the thread makes the drain's clock run over a little).
        autojump_clock.autojump_threshold = 0.02
    async with relay_thread(thread) as carrier:
        h, took, rest, got, problems = await drain_with_a_send_stuck_in_the_write(
            real_socket_pair, real_socket_pair, payload, carrier
        )
        if carrier is not None:
            assert carrier.steps_run > 0 and carrier.carried() == 0
    assert problems == []
    sends = [f for f in got if f.name == "SEND"]
    assert [f.body.sequence_id for f in sends] == [1, 2]
    assert sends[1].payload == payload
    assert rest == ["SEND_RECEIPT", "SEND_RECEIPT", "CLOSE_PRODUCER"]
    assert 8.9 < took < (9.1 if not thread else 9.6)  # receipts at +4 s and +9 s
    assert h.reason == "drained"
