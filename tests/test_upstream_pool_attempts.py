"""``UpstreamPool.get``: lookups that wait on one attempt to open a shared
connection, when the task that opens it is cancelled (its client hung up)
or the attempt fails otherwise. Real sockets over loopback: a broker that
holds the first connection without answering CONNECT, then answers."""

from __future__ import annotations

import trio

from sluice.addresses import Address
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.connection import UpstreamFailure
from sluice.proxy.pulsar import FrameStream, UpstreamPool

BOUND = 10.0


async def _broker(listeners: list[trio.SocketListener], held: list[trio.SocketStream]) -> None:
    """Holds the first connection silent; answers CONNECT on the others."""
    first = True
    async with trio.open_nursery() as nursery:
        while True:
            stream = await listeners[0].accept()
            if first:
                first = False
                held.append(stream)
                continue
            nursery.start_soon(_answer, stream)


async def _answer(raw: trio.SocketStream) -> None:
    stream = FrameStream(raw, 5 * 1024 * 1024)
    frame = await stream.receive_frame()
    assert frame is not None and frame.name == "CONNECT"
    connected = pb.CommandConnected(server_version="raw", protocol_version=21)
    await stream.send(encode(command(Type.Value("CONNECTED"), connected)))
    await trio.sleep_forever()


def test_a_lookup_waiting_on_a_cancelled_attempt_makes_its_own() -> None:
    async def main() -> None:
        with trio.fail_after(BOUND):
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            address = Address("127.0.0.1", port)
            held: list[trio.SocketStream] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_broker, listeners, held)
                pool = UpstreamPool(nursery, timeout=5.0, tls_for=lambda _: None)
                got: list[object] = []

                async def opener(scope_out: list[trio.CancelScope]) -> None:
                    with trio.CancelScope() as scope:
                        scope_out.append(scope)
                        await pool.get(address)

                async def waiter() -> None:
                    try:
                        got.append(await pool.get(address))
                    except UpstreamFailure as exc:
                        got.append(exc)

                scopes: list[trio.CancelScope] = []
                nursery.start_soon(opener, scopes)
                while not held:  # the first attempt is being held
                    await trio.sleep(0.01)
                nursery.start_soon(waiter)
                await trio.sleep(0.1)
                scopes[0].cancel()  # its client went away
                started = trio.current_time()
                while not got:
                    await trio.sleep(0.01)
                took = trio.current_time() - started
                assert not isinstance(got[0], UpstreamFailure), got[0]
                assert took < 2.0  # its own attempt, answered at once
                await pool.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)


async def _slow_broker(listeners: list[trio.SocketListener]) -> None:
    """Answers CONNECT; never answers request 1 of a connection, answers
    the others after 0.6 s."""
    async with trio.open_nursery() as nursery:
        while True:
            stream = await listeners[0].accept()
            nursery.start_soon(_serve_slowly, stream)


async def _serve_slowly(raw: trio.SocketStream) -> None:
    stream = FrameStream(raw, 5 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        while (frame := await stream.receive_frame()) is not None:
            if frame.name == "CONNECT":
                connected = pb.CommandConnected(server_version="raw", protocol_version=21)
                await stream.send(encode(command(Type.Value("CONNECTED"), connected)))
            elif frame.name == "LOOKUP" and frame.body.request_id != 1:
                nursery.start_soon(_answer_later, stream, frame.body.request_id)


async def _answer_later(stream: FrameStream, request_id: int) -> None:
    await trio.sleep(0.6)
    answer = pb.CommandLookupTopicResponse(
        request_id=request_id,
        response=pb.CommandLookupTopicResponse.Connect,
        brokerServiceUrl="pulsar://127.0.0.1:6650",
        authoritative=True,
    )
    await stream.send(encode(command(Type.Value("LOOKUP_RESPONSE"), answer)))


def test_a_request_that_timed_out_leaves_the_others_in_flight_their_answers() -> None:
    """The connection a request timed out on is not used for new requests,
    but those already sent on it still get their answers."""

    async def main() -> None:
        with trio.fail_after(BOUND):
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            address = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_slow_broker, listeners)
                pool = UpstreamPool(nursery, timeout=5.0, tls_for=lambda _: None)
                conn = await pool.get(address)
                got: dict[str, object] = {}

                async def ask(name: str, timeout: float) -> None:
                    lookup = pb.CommandLookupTopic(topic=f"persistent://t/n/{name}")
                    try:
                        got[name] = await conn.request(Type.Value("LOOKUP"), lookup, timeout)
                    except UpstreamFailure as exc:
                        got[name] = exc

                async with trio.open_nursery() as asking:
                    asking.start_soon(ask, "never", 1.0)  # request 1: times out at 1 s
                    await trio.sleep(0.5)
                    asking.start_soon(ask, "slow", 5.0)  # answered at about 1.1 s
                assert isinstance(got["never"], UpstreamFailure)
                assert not isinstance(got["slow"], UpstreamFailure), got["slow"]
                assert await pool.get(address) is not conn  # retired: not used again
                assert conn.closed  # and closed once nothing waited on it
                await pool.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)
