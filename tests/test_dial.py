"""Opening and closing connections (sluice/proxy/dial.py) on loopback: an IP
address is connected to directly, a name through trio's lookup; a refused
connection leaves no socket behind; closing never raises and the peer sees
the end."""

from __future__ import annotations

import os
import socket
import ssl
from functools import partial

import pytest
import trio
import trio.testing

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.proxy.dial import close_stream, dial, open_tcp


async def echo_once(stream: trio.SocketStream) -> None:
    data = await stream.receive_some(100)
    await stream.send_all(data.upper())


async def test_an_ip_address_and_a_name_both_connect() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo_once, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            with trio.fail_after(10):
                stream = await open_tcp(Address(host, port))
                assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                await stream.send_all(b"ping")
                assert await stream.receive_some(100) == b"PING"
                await close_stream(stream)
        nursery.cancel_scope.cancel()


async def test_a_name_that_cannot_be_looked_up_is_a_failed_dial() -> None:
    """A name an allow-list glob admits (``broker-*.pulsar.svc``) that
    IDNA cannot encode (an empty label, one over 63 characters) fails the
    dial as an unreachable broker does: OSError, which the relay answers
    as the broker would. (It raised UnicodeError: an "internal error"
    traceback for each such CONNECT, and no answer.)"""
    for host in ("broker-..pulsar.svc", "broker-" + "a" * 70 + ".pulsar.svc"):
        with trio.fail_after(10), pytest.raises(OSError, match="not a name that can be looked up"):
            await open_tcp(Address(host, 6651))


async def test_a_loopback_connection_is_made_without_waiting() -> None:
    # Over loopback the handshake is done when connect() returns: the dial
    # then needs no pass of the scheduler (a proxied Cursus commit is a
    # connection of its own, and each pass costs several microseconds).
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo_once, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        for _ in range(20):
            with trio.testing.assert_no_checkpoints():
                stream = await open_tcp(Address("127.0.0.1", port))
            assert stream.socket.getpeername() == ("127.0.0.1", port)
            await stream.send_all(b"ping")
            with trio.fail_after(10):
                assert await stream.receive_some(100) == b"PING"
            await close_stream(stream)
        nursery.cancel_scope.cancel()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_refused_connection_raises_and_leaves_no_socket_open() -> None:
    address = Address("127.0.0.1", free_port())  # nothing listens there
    before = open_descriptors()
    for _ in range(20):
        try:
            await open_tcp(address)
        except OSError as exc:
            assert exc.errno == 111  # ECONNREFUSED
        else:
            raise AssertionError("connected to a port nothing listens on")
    try:
        await dial(address, timeout=5)
    except OSError as exc:
        assert "refused" in str(exc).lower()
    else:
        raise AssertionError("dialled a port nothing listens on")
    assert open_descriptors() == before


async def test_closing_ends_the_connection_for_the_peer_and_never_raises() -> None:
    got: list[bytes] = []
    ended = trio.Event()

    async def read_to_the_end(stream: trio.SocketStream) -> None:
        while data := await stream.receive_some(100):
            got.append(data)
        ended.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, read_to_the_end, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        stream = await open_tcp(Address("127.0.0.1", port))
        await stream.send_all(b"last words")
        await close_stream(stream)
        with trio.fail_after(10):
            await ended.wait()
        assert b"".join(got) == b"last words"
        await close_stream(stream)  # again: nothing to do, nothing raised
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"more")
        nursery.cancel_scope.cancel()


async def test_a_tls_handshake_that_times_out_leaves_no_socket_open() -> None:
    """A broker that accepts and never answers the ClientHello: the dial
    times out, and its socket was left open until garbage collection (the
    failure's traceback keeps it alive where the error is kept)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
    failures = []
    async with trio.open_nursery() as nursery:
        held: list[trio.abc.Stream] = []

        async def silent(stream: trio.abc.Stream) -> None:
            held.append(stream)
            await trio.sleep_forever()

        nursery.start_soon(trio.serve_listeners, silent, listeners)
        before = open_descriptors()
        for _ in range(5):
            try:
                await dial(address, timeout=0.2, tls=ssl.create_default_context())
            except OSError as exc:
                failures.append(exc)  # kept, as a caller that logs it later would
        assert len(failures) == 5 and "timed out" in str(failures[0])
        # Our ends are closed (the accepted ends, held by the server, are not).
        assert open_descriptors() == before + len(held)
        nursery.cancel_scope.cancel()
