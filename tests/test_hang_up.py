"""Hanging up on a peer that is still sending, over loopback TCP.

Linux sends a reset instead of a FIN when a socket is closed with bytes it
has not read, and throws away what it had not sent yet: a drain's
CLOSE_CONSUMER written behind a consumer's backlog, to a client that keeps
sending while Sluice no longer reads it, never arrived; the client got part
of the backlog and ECONNRESET. The relay now hangs up as proxies do
(``dial.hang_up``): a FIN after the data, then what the peer still sends is
read and dropped until it hangs up too, for a bounded time.
"""

from __future__ import annotations

import contextlib
import socket

import trio
import trio.testing

from sluice.addresses import Address
from sluice.protocols.pulsar import CLOSED, Frame, FrameDecoder, pb
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.proxy import dial as dial_module
from tests.test_relay_clock import (
    BROKER_URL,
    BrokerScript,
    Harness,
    Stream,
    Wire,
    connect,
    frame_bytes,
)
from tests.test_relay_drain import message_once

BACKLOG = 60_000  # a MESSAGE far over the client's receive window
TOPIC = "persistent://t/n/hang-up"


def tcp_pair() -> tuple[Stream, Stream]:
    """A loopback TCP connection: (the peer's end, Sluice's end). The peer
    takes in little at a time (a small receive buffer); Sluice's end takes
    whole what is written to it, so that it sits in Sluice's send queue."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.socket()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer.connect(listener.getsockname())
        ours, _ = listener.accept()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    for end in (peer, ours):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(peer)),
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
    )


class TcpHarness(Harness):
    """``Harness`` over loopback TCP, dialling the broker at once."""

    async def dial(self, address: Address, tls: bool, timeout: float) -> Stream:
        assert self.broker_script is not None
        ours, theirs = self.broker_pair()
        self.nursery.start_soon(self.broker_script, Wire(theirs))
        return ours


def backlogged_broker(deliver: trio.Event) -> BrokerScript:
    """Accepts one consumer; once ``deliver`` is set, sends it a MESSAGE of
    BACKLOG bytes."""

    async def broker(wire: Wire) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(message_once, wire, deliver, BACKLOG)
            while (frame := await wire.receive()) is not None:
                if frame.name == "CONNECT":
                    connected = pb.CommandConnected(server_version="b")
                    await wire.send(frame_bytes("CONNECTED", connected))
                elif frame.name == "SUBSCRIBE":
                    ok = pb.CommandSuccess(request_id=frame.body.request_id)
                    await wire.send(frame_bytes("SUCCESS", ok))
            nursery.cancel_scope.cancel()

    return broker


async def test_a_drain_goodbye_behind_a_backlog_reaches_a_client_that_keeps_sending() -> None:
    deliver = trio.Event()
    async with trio.open_nursery() as nursery:
        h = TcpHarness(nursery, backlogged_broker(deliver), tcp_pair, tcp_pair)
        h.start()
        with trio.fail_after(10):
            await h.client.send(connect(BROKER_URL))
            first = await h.client.receive()
            assert first is not None and first.name == "CONNECTED"
            subscribe = pb.CommandSubscribe(
                topic=TOPIC,
                subscription="s",
                subType=pb.CommandSubscribe.Shared,
                consumer_id=1,
                request_id=1,
            )
            await h.client.send(frame_bytes("SUBSCRIBE", subscribe))
            ok = await h.client.receive()
            assert ok is not None and ok.name == "SUCCESS"
            # The backlog: what the client's window does not take waits in
            # Sluice's send queue, and the drain's goodbye after it. The
            # client reads it at its pace, and keeps sending meanwhile.
            frames: list[Frame] = []
            end: list[str] = []
            ended = trio.Event()
            sending = trio.CancelScope()

            async def read_slowly() -> None:
                decoder = FrameDecoder()
                while not end:
                    try:
                        event = decoder.next_event()
                    except RemoteProtocolError as exc:  # the stream ended inside a frame
                        end.append(str(exc))
                        break
                    if isinstance(event, Frame):
                        frames.append(event)
                    elif event is CLOSED:
                        end.append("end of stream")
                    else:
                        try:
                            decoder.receive_data(await h.client_end.receive_some(4096))
                        except trio.BrokenResourceError as exc:
                            end.append(repr(exc.__cause__))
                        await trio.sleep(0.005)
                ended.set()

            nursery.start_soon(read_slowly)
            deliver.set()
            while not any(frame.name == "MESSAGE" for _, frame in h.tap.seen):
                await trio.sleep(0.005)  # (seen, then written in the same step)
            nursery.start_soon(h.relay.drain, trio.current_time() + 8)

            async def keep_sending() -> None:  # (a client that has not seen the goodbye yet)
                ping = frame_bytes("PING", pb.CommandPing())
                with sending, contextlib.suppress(trio.BrokenResourceError):
                    while True:
                        await h.client_end.send_all(ping * 64)
                        await trio.sleep(0.005)

            nursery.start_soon(keep_sending)
            while not ended.is_set():
                await trio.sleep(0.01)
            sending.cancel()
            await h.client_end.aclose()
            await h.done.wait()
    names = [frame.name for frame in frames]
    assert (names, end) == (["MESSAGE", "CLOSE_CONSUMER"], ["end of stream"])
    assert h.reason == "drained"


async def test_a_peer_that_never_stops_sending_is_cut_at_the_bound() -> None:
    peer, ours = tcp_pair()
    stop = trio.Event()

    async def flood() -> None:
        try:
            while not stop.is_set():
                await peer.send_all(b"x" * 65536)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        await ours.send_all(b"bye")
        started = trio.current_time()
        await dial_module.hang_up([ours], started + 0.3)
        took = trio.current_time() - started
        stop.set()
        got = b""
        while b"bye" not in got and (data := await peer.receive_some(65536)):
            got += data
        await peer.aclose()
    assert dial_module.stream_descriptor(ours) is None  # closed
    assert took < 1.0  # cut at the bound (0.3 s), or at LINGER_BYTES before it
    assert got == b"bye"


async def test_what_the_second_peer_sends_while_the_first_is_waited_for_costs_it_nothing() -> None:
    """Both sides are hung up on together, the second waited for after the
    first: what the second peer sent meanwhile was left unread when the
    bound came, so its socket closed with unread bytes, a reset, and its
    kernel dropped what Sluice had written it last."""
    first_peer, first = tcp_pair()
    second_peer, second = tcp_pair()
    last = b"last frames" * 10_000  # (more than the second peer's window: some wait in Sluice)
    # (trio's streams wait for all but 16 KiB to be sent: here it stays queued.)
    assert isinstance(second, trio.SocketStream)
    second.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 1 << 22)
    stop = trio.Event()

    async def keep_talking() -> None:  # the first peer: never quiet, never done
        with contextlib.suppress(trio.BrokenResourceError):
            while not stop.is_set():
                await first_peer.send_all(b"x")
                await trio.sleep(0.005)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_talking)
        await second.send_all(last)
        started = trio.current_time()

        async def answer_late() -> None:  # the second peer, once the hang-up waits
            await trio.testing.wait_all_tasks_blocked()
            await second_peer.send_all(b"a late answer")

        nursery.start_soon(answer_late)
        await dial_module.hang_up([first, second], started + 0.3)
        stop.set()
        got = b""
        error = None
        try:
            while data := await second_peer.receive_some(65536):
                got += data
        except trio.BrokenResourceError as exc:
            error = exc.__cause__
        await first_peer.aclose()
        await second_peer.aclose()
    assert (len(got), error) == (len(last), None)
