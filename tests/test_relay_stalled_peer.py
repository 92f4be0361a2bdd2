"""A peer that stops taking in what Sluice writes to it, its connection
kept open, is a dead peer once a write has made no progress for two
keepalive intervals: the connection is closed (as ``idle``), and its other
side freed. Before, a consumer that subscribed, granted permits and never
read its socket again (or a broker that stopped reading a producer's
sends) held its client socket, its broker connection and the broker's
side for ever, whatever the keepalive interval, even once the broker had
hung up. Both the relay thread's writes and trio's are bounded
(``SLUICE_RELAY_THREAD=0``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.message import Message

from sluice.protocols.pulsar import Frame, Type, command, encode, pb
from sluice.protocols.pulsar.decoder import FrameDecoder
from sluice.protocols.pulsar.encoder import encode_payload
from tests.helpers.support import ProxyProcess, start_proxy, tcp_connections

pytestmark = pytest.mark.e2e

T = Type.Value
INTERVAL = 0.5  # --keepalive-interval: a write may make no progress for 1 s
BOUND = 15.0  # what the tests wait for at most


def frame(name: str, body: Message | None = None) -> bytes:
    return encode(command(T(name), body))


class Broker:
    """A broker on raw sockets: CONNECT, SUBSCRIBE, PRODUCER answered; a
    FLOW makes it stream MESSAGEs while they are taken in; after a
    PRODUCER it reads nothing more. ``ended``: when its relayed
    connection failed or was closed under it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.ended: float | None = None
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                event = decoder.next_event()
                if not isinstance(event, Frame):
                    data = sock.recv(65536)
                    if not data:
                        return
                    decoder.receive_data(data)
                    continue
                if event.name == "CONNECT":
                    connected = pb.CommandConnected(server_version="raw", protocol_version=21)
                    sock.sendall(frame("CONNECTED", connected))
                elif event.name == "SUBSCRIBE":
                    success = pb.CommandSuccess(request_id=event.body.request_id)
                    sock.sendall(frame("SUCCESS", success))
                elif event.name == "FLOW":
                    self._stream(sock, event.body.consumer_id)
                    return
                elif event.name == "PRODUCER":
                    made = pb.CommandProducerSuccess(
                        request_id=event.body.request_id, producer_name="p"
                    )
                    sock.sendall(frame("PRODUCER_SUCCESS", made))
                    self._wait_for_the_end(sock)  # reading nothing more
                    return
        except OSError:
            return

    def _stream(self, sock: socket.socket, consumer_id: int) -> None:
        meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        entry = 0
        try:
            while not self.stopped:
                body = pb.CommandMessage(
                    consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=1, entryId=entry)
                )
                sock.sendall(encode_payload(command(T("MESSAGE"), body), meta, b"m" * 16384))
                entry += 1
        except OSError:
            self.ended = time.monotonic()

    def _wait_for_the_end(self, sock: socket.socket) -> None:
        """Without reading: the proxy's hang-up shows as an error (a reset)
        or as the socket's end, seen by peeking past the unread bytes'
        buffer being full (a FIN after them cannot be peeked at: polled
        as the connection's state instead)."""
        while not self.stopped:
            if not _established(sock):
                self.ended = time.monotonic()
                return
            time.sleep(0.05)

    def close(self) -> None:
        self.stopped = True
        self.listener.close()
        for sock in self.socks:
            sock.close()


def _established(sock: socket.socket) -> bool:
    """Whether the kernel still has the connection established (TCP_INFO's state)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return info[0] == 1  # TCP_ESTABLISHED


@pytest.fixture(params=["thread", "trio"])
def proxy_and_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, Broker]]:
    broker = Broker()
    env = {"SLUICE_RELAY_THREAD": "0"} if request.param == "trio" else None
    proxy = start_proxy(
        f"pulsar://127.0.0.1:{broker.port}", tmp_path, "--keepalive-interval", str(INTERVAL),
        "--no-check-broker", env=env,
    )  # fmt: skip
    try:
        yield proxy, broker
    finally:
        proxy.kill()
        broker.close()


def _relayed(proxy: ProxyProcess, broker: Broker) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = pb.CommandConnect(
        client_version="stalled",
        protocol_version=21,
        proxy_to_broker_url=f"127.0.0.1:{broker.port}",
    )
    client.sendall(frame("CONNECT", body))
    return client


def _receive(client: socket.socket, decoder: FrameDecoder, name: str) -> None:
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            if event.name == name:
                return
            continue
        decoder.receive_data(client.recv(65536))


def _holds(proxy: ProxyProcess, client: socket.socket) -> bool:
    port = client.getsockname()[1]
    return any(remote[1] == port for _, remote in tcp_connections(proxy.pid))


def _wait_closed(proxy: ProxyProcess, broker: Broker, client: socket.socket) -> float:
    """Seconds until both the client's connection and the broker's are let go."""
    started = time.monotonic()
    deadline = started + BOUND
    while _holds(proxy, client) or broker.ended is None:
        assert time.monotonic() < deadline, (
            f"still held after {BOUND}s: client {_holds(proxy, client)}, "
            f"broker's side ended {broker.ended is not None}\n{proxy.log()}"
        )
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_consumer_that_stops_reading_is_closed_and_its_broker_freed(
    proxy_and_broker: tuple[ProxyProcess, Broker],
) -> None:
    proxy, broker = proxy_and_broker
    with _relayed(proxy, broker) as client:
        decoder = FrameDecoder()
        _receive(client, decoder, "CONNECTED")
        subscribe = pb.CommandSubscribe(
            topic="persistent://t/n/x", subscription="s", subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1, request_id=1,
        )  # fmt: skip
        client.sendall(frame("SUBSCRIBE", subscribe))
        _receive(client, decoder, "SUCCESS")
        client.sendall(frame("FLOW", pb.CommandFlow(consumer_id=1, messagePermits=1_000_000)))
        # Never read again; PINGs keep it from looking silent.
        stop = threading.Event()

        def pings() -> None:
            while not stop.wait(0.2):
                try:
                    client.send(frame("PING"))
                except OSError:
                    return

        pinger = threading.Thread(target=pings, daemon=True)
        pinger.start()
        try:
            took = _wait_closed(proxy, broker, client)
        finally:
            stop.set()
            pinger.join(5)
    assert took < BOUND
    assert "took nothing in" in proxy.log()


def test_a_broker_that_stops_reading_a_producer_is_hung_up_on(
    proxy_and_broker: tuple[ProxyProcess, Broker],
) -> None:
    proxy, broker = proxy_and_broker
    with _relayed(proxy, broker) as client:
        decoder = FrameDecoder()
        _receive(client, decoder, "CONNECTED")
        producer = pb.CommandProducer(topic="persistent://t/n/x", producer_id=1, request_id=1)
        client.sendall(frame("PRODUCER", producer))
        _receive(client, decoder, "PRODUCER_SUCCESS")
        meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        client.setblocking(False)
        deadline = time.monotonic() + BOUND
        sequence = 0
        # Sends until Sluice's writes to the broker wait and the client's do.
        last = time.monotonic()
        while time.monotonic() - last < 1.0:
            assert time.monotonic() < deadline
            send = pb.CommandSend(producer_id=1, sequence_id=sequence)
            try:
                client.send(encode_payload(command(T("SEND"), send), meta, b"s" * 16384))
            except BlockingIOError:
                time.sleep(0.02)
                continue
            except OSError:
                break  # closed already
            sequence += 1
            last = time.monotonic()
        took = _wait_closed(proxy, broker, client)
    assert took < BOUND
    assert "took nothing in" in proxy.log()
