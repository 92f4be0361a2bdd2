"""Short connections (docs/proxy.md, "Short connections"): a Cursus
consumer's commits, each on a connection of its own, are served by the
relay thread from their first byte with no trio task (``Relay.park``), and
whatever needs trio is handed to it where it stands: a connection that lives
on, a drain, a dial not made at once. An in-process proxy, the real client
and the Cursus test broker (or, for the slow dial, a broker of the test's
own whose accept queue is full).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from cursus.connection.sync_conn import SyncConnection
from cursus.protocol.encoder import encode_message
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluice import _frames
from sluice.addresses import Address
from sluice.protocols.core import Peer
from sluice.protocols.cursus import List, OkReply, encode_reply, encode_request
from sluice.proxy import dial, server
from sluice.proxy.relay_thread import RelayThread
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.poll import wait_until_in_trio
from tests.test_cursus_broker import in_thread
from tests.test_cursus_proxy import Watched, start_proxy

LIST = encode_message("", "LIST")


@pytest.fixture(autouse=True, params=["compiled", "python"])
def plumbing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test twice: with a parked connection's accept and dial in
    compiled code (rust/src/sockets.rs), and with the Python they stand in
    for."""
    if request.param == "python":
        monkeypatch.setattr(server, "accept_now", None)
        monkeypatch.setattr(dial, "_connect_now", None)
    else:  # (built for every test run: never the Python ones unawares)
        assert vars(server)["accept_now"] is _frames.accept_now
        assert vars(dial)["_connect_now"] is _frames.connect_now
    yield request.param


def one_command(address: str, request: bytes = LIST) -> bytes:
    """What a consumer does for a commit: connect, one command, its reply, close."""
    connection = SyncConnection(address)
    connection.connect()
    try:
        connection.write_frame(request)
        reply: bytes = connection.read_frame()
        return reply
    finally:
        connection.close()


def relay_thread(proxy: Watched) -> RelayThread:
    thread = proxy.proxy._thread
    assert thread is not None, "the proxy runs no relay thread"
    return thread


async def connect(proxy: Watched) -> trio.SocketStream:
    host, port = proxy.address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def parked_with_half_a_frame(proxy: Watched, thread: RelayThread) -> trio.SocketStream:
    """A client that sent half a LIST: its connection stays parked, with
    nothing to send on, both sides read on the relay thread (Cursus dials
    at the first bytes)."""
    client = await connect(proxy)
    await client.send_all(encode_request(List())[:3])
    await wait_until_in_trio(
        lambda: thread.carried() == 2, 20, "both sides read on the relay thread", step=0.02
    )
    return client


def metric(proxy: Watched, name: str, **labels: str) -> float:
    exposed = generate_latest(proxy.proxy.metrics.exposed).decode()
    for family in text_string_to_metric_families(exposed):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def test_commits_are_served_by_the_relay_thread_alone() -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        thread = relay_thread(proxy)
        for _ in range(20):
            assert (await in_thread(one_command, proxy.address)).startswith(b"OK")
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "every connection ended", step=0.02
        )
        # (One could outlive the second after which trio takes it over, on a
        # machine busy enough: the count of both is exact.)
        assert thread.parked_ended + thread.parked_adopted == 20
        assert thread.parked_ended >= 15
        assert thread.carried() == 0 and not proxy.proxy._parked
        assert proxy.direct(cluster) == []  # each dialled by the proxy, on the thread
        assert metric(proxy, "sluice_relay_thread_connections_total", ended="thread") >= 15
        assert metric(proxy, "sluice_connections_closed_total", reason="closed") == 20
        assert metric(proxy, "sluice_connections_opened_total") == 20
        nursery.cancel_scope.cancel()


async def test_a_client_that_sends_nothing_is_timed_out_by_trio() -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster, handshake_timeout=0.6)
        thread = relay_thread(proxy)
        client = await connect(proxy)
        started = trio.current_time()
        with trio.fail_after(10):
            assert await client.receive_some() == b""  # hung up on
        assert 0.5 < trio.current_time() - started < 5
        assert thread.parked_adopted == 1 and thread.parked_ended == 0
        assert metric(proxy, "sluice_connections_rejected_total", reason="handshake_timeout") == 1
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "the connection ended", step=0.02
        )
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_drain_hangs_up_a_parked_connection_at_once() -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster, drain_timeout=30.0)
        thread = relay_thread(proxy)
        client = await parked_with_half_a_frame(proxy, thread)
        assert proxy.proxy._parked
        started = trio.current_time()
        nursery.start_soon(proxy.proxy.drain)
        with trio.fail_after(10):
            assert await client.receive_some() == b""
        assert trio.current_time() - started < 5  # not the drain's 30 s
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "the connection ended", step=0.02
        )
        assert thread.parked_adopted == 1 and thread.carried() == 0
        await client.aclose()


async def test_a_client_that_resets_a_parked_connection_is_lost() -> None:
    """A read that fails on the relay thread (the client reset its
    connection halfway through a command) hands the connection to trio,
    which ends it as a lost one."""
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        thread = relay_thread(proxy)
        client = await parked_with_half_a_frame(proxy, thread)
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()  # a reset, with linger 0
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "the connection ended", step=0.02
        )
        assert metric(proxy, "sluice_connections_closed_total", reason="lost") == 1
        assert thread.parked_adopted == 1 and thread.carried() == 0
        nursery.cancel_scope.cancel()


async def test_a_parked_connection_has_the_socket_options_of_a_trio_stream() -> None:
    """Its sockets stay plain descriptors (no trio stream is made for
    them), with the options trio's streams set: TCP_NODELAY on both, and
    the client's TCP_NOTSENT_LOWAT, inherited from the listener."""
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        thread = relay_thread(proxy)
        client = await parked_with_half_a_frame(proxy, thread)
        (relay,) = proxy.proxy._parked
        assert relay._client is None and relay._broker is None  # no stream made
        for peer in (Peer.CLIENT, Peer.BROKER):
            fd = relay._descriptors[peer]
            assert fd is not None
            with socket.socket(fileno=os.dup(fd)) as sock:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, peer
                if peer is Peer.CLIENT:
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == 2**14
        await client.send_all(encode_request(List())[3:])
        reply = b""
        with trio.fail_after(10):
            while len(reply) < 6:
                reply += await client.receive_some()
        assert reply[4:6] == b"OK"
        await client.aclose()
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "the connection ended", step=0.02
        )
        assert thread.parked_ended + thread.parked_adopted == 1
        nursery.cancel_scope.cancel()


async def test_a_dial_not_made_at_once_is_finished_by_trio() -> None:
    """A broker across a network answers a connect() later: the relay
    thread begins the dial, trio waits for it and relays as usual. Here the
    broker's accept queue is full (listen(0) and a connection waiting), so
    the kernel drops the proxy's SYN until the broker accepts and the SYN
    is sent again, about a second later."""
    broker = socket.socket()
    broker.bind(("127.0.0.1", 0))
    broker.listen(0)
    waiting = socket.create_connection(broker.getsockname())
    reply = encode_reply(OkReply.of(count=0, topics=""))

    def serve() -> bytes:
        first, _ = broker.accept()  # the connection that filled the queue
        first.close()
        connection, _ = broker.accept()  # the proxy's, once its SYN came again
        with connection:
            connection.settimeout(10)
            got = connection.recv(65536)
            connection.sendall(reply)
        return got

    try:
        async with trio.open_nursery() as nursery:
            host, port = broker.getsockname()
            options: dict[str, Any] = {"connect_timeout": 10.0}
            where: Any = _Cluster(f"{host}:{port}")
            proxy = await start_proxy(nursery, where, **options)
            thread = relay_thread(proxy)
            answers: list[bytes] = []

            async def client() -> None:
                answers.append(await in_thread(one_command, proxy.address, LIST))

            nursery.start_soon(client)
            await wait_until_in_trio(
                lambda: thread.parked_adopted == 1, 20, "the dial handed to trio", step=0.02
            )
            assert proxy.proxy.relays and not proxy.proxy._parked
            got = await in_thread(serve)
            await wait_until_in_trio(lambda: bool(answers), 20, "the reply", step=0.02)
            assert got == len(LIST).to_bytes(4, "big") + LIST  # the command, whole
            assert len(answers) == 1 and answers[0].startswith(b"OK")
            assert thread.parked_ended == 0
            nursery.cancel_scope.cancel()
    finally:
        waiting.close()
        broker.close()


class _Cluster:
    """Just enough of a Cluster for start_proxy: where the broker is."""

    def __init__(self, address: str) -> None:
        self.address = address


def _not_listening() -> socket.socket:
    """A socket whose accept() fails, as a listener's does out of file
    descriptors: one that does not listen (EINVAL)."""
    sock = socket.socket()
    sock.setblocking(False)
    return sock


async def test_a_failed_accept_hands_the_listener_to_trio() -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        thread = relay_thread(proxy)
        ((listener, _),) = proxy.proxy._accepting.items()
        # (Called in trio's thread, holding the turn, as the relay thread would.)
        with _not_listening() as failing:
            proxy.proxy._accept_parked(thread, listener, failing, "plain", None)
        assert not proxy.proxy._accepting  # the thread no longer accepts on it
        for _ in range(3):  # trio's accept loop does, and connections still start parked
            assert (await in_thread(one_command, proxy.address)).startswith(b"OK")
        await wait_until_in_trio(
            lambda: proxy.proxy.active == 0, 20, "every connection ended", step=0.02
        )
        assert thread.parked_ended + thread.parked_adopted == 3
        nursery.cancel_scope.cancel()


async def test_a_bug_in_the_accept_step_hands_the_listener_to_trio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster)
        park = proxy.proxy._park
        failures: list[int] = []

        def buggy(client: Any, *rest: Any) -> None:
            if not failures:  # the first accepted connection meets a bug
                failures.append(client if isinstance(client, int) else -1)
                raise RuntimeError("a bug")
            park(client, *rest)

        monkeypatch.setattr(proxy.proxy, "_park", buggy)
        host, port = proxy.address.rsplit(":", 1)
        first = socket.create_connection((host, int(port)))
        try:
            await wait_until_in_trio(
                lambda: not proxy.proxy._accepting, 20, "the thread gave the listener up", step=0.02
            )
            for _ in range(3):  # trio's accept loop serves it: not a listener fallen silent
                assert (await in_thread(one_command, proxy.address)).startswith(b"OK")
        finally:
            first.close()
            for fd in failures:
                if fd >= 0:
                    os.close(fd)
        nursery.cancel_scope.cancel()


def test_a_compiled_accept_is_pythons_accept() -> None:
    """``accept_now``: the peer's address as ``socket.accept()`` gives it
    (IPv4 and IPv6), a descriptor that is non-blocking and not inherited,
    None when nobody waits, and accept()'s error on a socket that does not
    listen."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as listener:
            listener.bind((host, 0))
            listener.listen()
            listener.setblocking(False)
            assert _frames.accept_now(listener.fileno()) is None
            with socket.create_connection(listener.getsockname()[:2]) as client:
                accepted = _frames.accept_now(listener.fileno())
                assert accepted is not None
                fd, peer_host, peer_port = accepted
                try:
                    assert (peer_host, peer_port) == client.getsockname()[:2]
                    assert not os.get_blocking(fd) and not os.get_inheritable(fd)
                finally:
                    os.close(fd)
            with socket.create_connection(listener.getsockname()[:2]) as client:
                sock, peer = listener.accept()  # Python's, for the same facts
                with sock:
                    assert peer[:2] == client.getsockname()[:2]
    with socket.socket() as idle:
        with pytest.raises(OSError) as raised:
            _frames.accept_now(idle.fileno())
        with pytest.raises(OSError) as pythons:
            idle.accept()
        assert raised.value.errno == pythons.value.errno == errno.EINVAL


def test_a_compiled_dial_is_start_tcps_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dial.start_tcp`` with and without ``connect_now``: the same
    connection (made at once over loopback, non-blocking, TCP_NODELAY), the
    same error for a port nobody listens on, and None for a name."""

    def start(address: Address, compiled: bool) -> tuple[int, bool] | None:
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(dial, "_connect_now", None)
            return dial.start_tcp(address)

    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as listener:
            listener.bind((host, 0))
            listener.listen()
            port = listener.getsockname()[1]
            for compiled in (True, False):
                started = start(Address(host, port), compiled)
                assert started is not None and started[1], (host, compiled)
                with socket.socket(fileno=started[0]) as sock:
                    assert sock.getpeername()[:2] == (host, port)
                    assert not os.get_blocking(started[0]) and not sock.get_inheritable()
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                    accepted, _ = listener.accept()
                    accepted.close()
        with socket.socket(family) as unused:
            unused.bind((host, 0))
            nobody = Address(host, unused.getsockname()[1])
        outcomes: list[object] = []
        for compiled in (True, False):
            try:
                started = start(nobody, compiled)
            except OSError as exc:
                outcomes.append((exc.errno, str(exc)))
            else:  # (a kernel that says so later: the same for both)
                assert started is not None
                os.close(started[0])
                outcomes.append(started[1:])
        assert outcomes[0] == outcomes[1], outcomes
    for compiled in (True, False):
        assert start(Address("localhost", 80), compiled) is None
