"""Pulsar's WebSocket API through Sluice's HTTP listener, against Apache Pulsar 4.0.8.

A broker of this module's own, with ``webSocketServiceEnabled=true`` (it
serves ``/ws/v2/…`` on its web port), and a ``sluice proxy`` process with
``--http-listen`` in front of it. The client is websocket-client, over
loopback; what it sends is Pulsar's WebSocket protocol (JSON text frames).
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme
import websocket
from prometheus_client import CollectorRegistry

import sluice.proxy.websocket as session_module
from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.protocols.http.websocket import (
    MESSAGE_TOO_BIG,
    PROTOCOL_ERROR,
    FrameReader,
    WebSocketError,
    close_frame,
    is_websocket_upgrade,
    switch_problem,
    switched_headers,
    upgrade_headers,
)
from sluice.proxy.metrics import HttpMetrics
from sluice.proxy.websocket import Session
from tests.helpers.poll import wait_until, wait_until_in_trio
from tests.test_http import MAX_BODY, Redirector, WebProxy, raw_exchange, start_web_proxy

N = 100
TIMEOUT = 30


@pytest.fixture
def ws_web(ws_broker: ApachePulsar, tmp_path: Path) -> Iterator[WebProxy]:
    w = start_web_proxy(ws_broker, tmp_path, ws_broker.http_url)
    yield w
    w.proxy.kill()
    assert "Traceback" not in w.proxy.log(), w.proxy.log()


def ws_url(web: WebProxy, path: str) -> str:
    return f"ws://127.0.0.1:{web.http_port}{path}"


def to_send(context: str, body: bytes) -> str:
    """A message for Pulsar's WebSocket producer."""
    return json.dumps({"payload": base64.b64encode(body).decode(), "context": context})


def received_close(ws: websocket.WebSocket) -> int:
    """The code of the CLOSE frame the server sends next (data skipped)."""
    return received_close_reason(ws)[0]


def received_close_reason(ws: websocket.WebSocket) -> tuple[int, str]:
    while True:
        opcode, frame = ws.recv_data_frame(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code: int = struct.unpack("!H", frame.data[:2])[0]
            return code, frame.data[2:].decode()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_produce_consume_and_read_over_websocket_through_sluice(
    ws_broker: ApachePulsar, ws_web: WebProxy
) -> None:
    name = f"ws-{uuid.uuid4().hex[:8]}"
    topic = f"persistent/public/default/{name}"
    # The consumer first: its subscription exists before anything is sent.
    consumer = websocket.create_connection(
        ws_url(ws_web, f"/ws/v2/consumer/{topic}/sub?subscriptionType=Exclusive"),
        timeout=TIMEOUT,
    )
    producer = websocket.create_connection(
        ws_url(ws_web, f"/ws/v2/producer/{topic}"), timeout=TIMEOUT
    )
    try:
        assert ws_web.metric("sluice_http_websocket_sessions_active") == 2
        sent = [f"message {i}".encode() for i in range(N)]
        for i, body in enumerate(sent):
            producer.send(to_send(str(i), body))
        acks = [json.loads(producer.recv()) for _ in sent]
        assert [a["result"] for a in acks] == ["ok"] * N, acks[:3]
        assert [a["context"] for a in acks] == [str(i) for i in range(N)]
        got = []
        for _ in sent:
            message = json.loads(consumer.recv())
            got.append(base64.b64decode(message["payload"]))
            consumer.send(json.dumps({"messageId": message["messageId"]}))
        assert got == sent
    finally:
        producer.close()
        consumer.close()
    # A reader from the earliest message: the same N again (it acknowledges nothing).
    reader = websocket.create_connection(
        ws_url(ws_web, f"/ws/v2/reader/{topic}?messageId=earliest"), timeout=TIMEOUT
    )
    try:
        read = [base64.b64decode(json.loads(reader.recv())["payload"]) for _ in sent]
        assert read == sent
    finally:
        reader.close()

    # The broker took the consumer's acks (they went through Sluice too).
    def backlog() -> object:
        stats = ws_broker.admin_json("GET", f"/admin/v2/{topic}/stats")
        assert isinstance(stats, dict)
        return stats["subscriptions"]["sub"]["msgBacklog"]

    wait_until(
        lambda: backlog() == 0, TIMEOUT, "the consumer's acks to reach the broker", step=0.05
    )
    wait_until(
        lambda: ws_web.metric("sluice_http_websocket_sessions_active") == 0,
        TIMEOUT,
        "the sessions to close after both sides closed",
        step=0.05,
    )

    def frames(direction: str, opcode: str) -> float:
        return ws_web.metric(
            "sluice_http_websocket_frames_total", direction=direction, opcode=opcode
        )

    # Producer: N sends in, N receipts out; consumer: N messages out, N acks
    # in; reader: N messages out.
    assert frames("client_to_broker", "text") == 2 * N
    assert frames("broker_to_client", "text") == 3 * N
    # Each session's close handshake: the client's CLOSE, the broker's answer.
    assert frames("client_to_broker", "close") == 3
    assert frames("broker_to_client", "close") == 3
    for opcode in ("binary", "ping", "pong"):
        assert frames("client_to_broker", opcode) == frames("broker_to_client", opcode) == 0
    for direction, messages in (("client_to_broker", 2 * N), ("broker_to_client", 3 * N)):
        assert (
            ws_web.metric("sluice_http_websocket_messages_total", direction=direction) == messages
        )
    assert ws_web.metric("sluice_http_websocket_sessions_total") == 3
    assert ws_web.metric("sluice_http_websocket_sessions_ended_total", reason="closed") == 3
    assert ws_web.metric("sluice_http_websocket_sessions_ended_total") == 3
    assert ws_web.metric("sluice_http_requests_total", kind="websocket", status="1xx") == 3
    assert ws_web.metric("sluice_http_requests_total", kind="websocket") == 3
    # The bytes relayed: at least the frames' payloads, each with a header
    # (2 bytes, and a 4-byte mask from the client), and not wildly more.
    payloads_in = sum(len(to_send(str(i), body)) for i, body in enumerate(sent))
    relayed_in = ws_web.metric("sluice_http_websocket_bytes_total", direction="client_to_broker")
    assert payloads_in + 6 * N < relayed_in < 3 * payloads_in, (payloads_in, relayed_in)
    assert ws_web.metric("sluice_http_websocket_bytes_total", direction="broker_to_client") > 0


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_a_malformed_frame_closes_the_session_with_1002(ws_web: WebProxy) -> None:
    topic = f"persistent/public/default/ws-bad-{uuid.uuid4().hex[:8]}"
    ws = websocket.create_connection(ws_url(ws_web, f"/ws/v2/producer/{topic}"), timeout=TIMEOUT)
    try:
        # Not a WebSocket frame: opcode 0xF does not exist (and the reserved bits are set).
        assert ws.sock is not None
        ws.sock.sendall(b"\xff\x80\x00\x00\x00\x00garbage")
        assert received_close(ws) == PROTOCOL_ERROR
    finally:
        ws.close()
    wait_until(
        lambda: (
            ws_web.metric("sluice_http_websocket_sessions_ended_total", reason="protocol_error")
            == 1
        ),
        TIMEOUT,
        "the malformed frame to be counted",
        step=0.05,
    )
    assert ws_web.metric("sluice_http_websocket_sessions_active") == 0
    # No bad frame reached the broker: nothing counted client_to_broker.
    assert ws_web.metric("sluice_http_websocket_frames_total", direction="client_to_broker") == 0
    assert "malformed WebSocket frame: Invalid opcode 0xf" in ws_web.proxy.log()

    # A message over --http-max-body: 1009 (message too big).
    ws = websocket.create_connection(ws_url(ws_web, f"/ws/v2/producer/{topic}"), timeout=TIMEOUT)
    try:
        ws.send("x" * (MAX_BODY + 1))
        assert received_close(ws) == MESSAGE_TOO_BIG
    finally:
        ws.close()
    wait_until(
        lambda: (
            ws_web.metric("sluice_http_websocket_sessions_ended_total", reason="message_too_large")
            == 1
        ),
        TIMEOUT,
        "the oversized message to be counted",
        step=0.05,
    )

    # Sluice stays up: a session after them works; its client hangs up
    # without a CLOSE frame.
    ws = websocket.create_connection(ws_url(ws_web, f"/ws/v2/producer/{topic}"), timeout=TIMEOUT)
    try:
        ws.send(to_send("a", b"after"))
        assert json.loads(ws.recv())["result"] == "ok"
    finally:
        assert ws.sock is not None
        ws.sock.close()  # no CLOSE frame
    wait_until(
        lambda: ws_web.metric("sluice_http_websocket_sessions_ended_total", reason="hangup") == 1,
        TIMEOUT,
        "the hang-up to be counted",
        step=0.05,
    )
    assert ws_web.metric("sluice_http_websocket_sessions_ended_total") == 3
    assert "internal error" not in ws_web.proxy.log()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_a_refused_upgrade_is_answered_as_the_broker_gave_it(
    ws_broker: ApachePulsar, ws_web: WebProxy
) -> None:
    """A WebSocket path the broker does not serve: its own answer, not a 101."""
    head = (
        b"GET /ws/v2/nowhere/persistent/public/default/t HTTP/1.1\r\nHost: x\r\n"
        b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    direct, _ = raw_exchange(ws_broker.web_port, head)
    assert direct >= 400, direct
    status, _ = raw_exchange(ws_web.http_port, head)
    assert status == direct
    assert ws_web.metric("sluice_http_websocket_sessions_total") == 0
    assert (
        ws_web.metric("sluice_http_requests_total", kind="websocket", status=f"{direct // 100}xx")
        == 1
    )


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_idle_session_and_shutdown_close_with_1001(ws_broker: ApachePulsar, tmp_path: Path) -> None:
    web = start_web_proxy(ws_broker, tmp_path, ws_broker.http_url,
                          "--http-request-timeout", "1")  # fmt: skip
    try:
        topic = f"persistent/public/default/ws-idle-{uuid.uuid4().hex[:8]}"
        ws = websocket.create_connection(web.url.replace("http", "ws") +
                                         f"/ws/v2/producer/{topic}", timeout=TIMEOUT)  # fmt: skip
        try:
            started = time.monotonic()
            code, reason = received_close_reason(ws)
            assert (code, "--http-request-timeout" in reason) == (1001, True), reason
            assert 0.5 < time.monotonic() - started < 10
        finally:
            ws.close()
        wait_until(
            lambda: (
                web.metric("sluice_http_websocket_sessions_ended_total", reason="idle_timeout") == 1
            ),
            TIMEOUT,
            "the idle session to be counted",
            step=0.05,
        )
        # Shutdown: an open session is told 1001 (going away), and Sluice exits.
        ws = websocket.create_connection(web.url.replace("http", "ws") +
                                         f"/ws/v2/producer/{topic}", timeout=TIMEOUT)  # fmt: skip
        try:
            web.proxy.process.send_signal(signal.SIGTERM)
            assert received_close_reason(ws) == (1001, "Sluice is shutting down")
        finally:
            ws.close()
        assert web.proxy.process.wait(timeout=TIMEOUT) == 0
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_an_upgrade_is_redirected_and_keeps_its_authorization(
    ws_broker: ApachePulsar, tmp_path: Path
) -> None:
    """A web service that answers the upgrade with a 307 to the broker:
    Sluice follows it with the upgrade asked again, the client's
    Authorization passed on, and the client sees the broker's 101."""
    redirector = Redirector(ws_broker.http_url)
    thread = threading.Thread(target=redirector.serve_forever, daemon=True)
    thread.start()
    web = start_web_proxy(ws_broker, tmp_path, redirector.url, "--allow-broker", "127.0.0.1")
    try:
        topic = f"persistent/public/default/ws-moved-{uuid.uuid4().hex[:8]}"
        ws = websocket.create_connection(
            ws_url(web, f"/ws/v2/producer/{topic}"),
            timeout=TIMEOUT,
            header=["Authorization: Bearer abc.def.ghi"],
        )
        try:
            ws.send(to_send("r", b"redirected"))
            assert json.loads(ws.recv())["result"] == "ok"
        finally:
            ws.close()
        assert redirector.authorizations == ["Bearer abc.def.ghi"]
        assert web.metric("sluice_http_redirects_followed_total") == 1
        assert web.metric("sluice_http_websocket_sessions_total") == 1
    finally:
        web.proxy.kill()
        redirector.shutdown()
        redirector.server_close()
        thread.join(timeout=10)
    assert "Traceback" not in web.proxy.log()


@pytest.mark.e2e  # ws_broker starts Apache Pulsar
def test_a_session_holds_a_connection_under_the_cap(
    ws_broker: ApachePulsar, tmp_path: Path
) -> None:
    web = start_web_proxy(ws_broker, tmp_path, ws_broker.http_url,
                          "--http-max-connections", "1")  # fmt: skip
    try:
        wait_until(
            lambda: web.metric("sluice_http_connections_active") == 0,
            TIMEOUT,
            "the start-up probe's connection to close",
            step=0.05,
        )
        topic = f"persistent/public/default/ws-cap-{uuid.uuid4().hex[:8]}"
        ws = websocket.create_connection(ws_url(web, f"/ws/v2/producer/{topic}"), timeout=TIMEOUT)
        try:
            status, text = raw_exchange(web.http_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and "--http-max-connections" in text, text
        finally:
            ws.close()
        # The session gone, its connection is free again.
        wait_until(
            lambda: web.metric("sluice_http_connections_active") == 0,
            TIMEOUT,
            "the session's connection to close",
            step=0.05,
        )
        status, _ = raw_exchange(web.http_port, b"GET /admin/v2/clusters HTTP/1.1\r\n"
                                 b"Host: x\r\nConnection: close\r\n\r\n")  # fmt: skip
        assert status == 200
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


# --- the decisions, sans-I/O ------------------------------------------------------


def masked(frame: bytes) -> bytes:
    """An unmasked frame of ours as a client sends it (mask key 0)."""
    first, length = frame[0], frame[1]
    assert length < 126
    return bytes([first, length | 0x80]) + b"\x00\x00\x00\x00" + frame[2:]


def test_frame_reader_counts_frames_and_messages() -> None:
    reader = FrameReader(from_client=True, max_message=100)
    text = masked(b"\x81\x05hello")
    # A fragmented binary message with a ping between its frames.
    fragmented = masked(b"\x02\x02ab") + masked(b"\x89\x00") + masked(b"\x80\x01c")
    seen = reader.feed(text + fragmented[:3])
    assert (seen.frames, seen.messages) == (["text"], 1)
    assert not reader.between_frames
    seen = reader.feed(fragmented[3:])
    assert (seen.frames, seen.messages) == (["binary", "ping", "binary"], 1)
    assert reader.between_frames
    seen = reader.feed(masked(b"\x88\x04\x03\xe8ok"))
    assert seen.close == (1000, "ok") and seen.frames == ["close"]
    assert reader.feed(b"anything after CLOSE").frames == []
    # A read with a bad frame is not passed on: between frames is what the
    # reads before it left.
    failing = FrameReader(from_client=True, max_message=100)
    failing.feed(text)
    with pytest.raises(WebSocketError):
        failing.feed(b"\xff\x80\x00\x00\x00\x00")
    assert failing.between_frames
    failing = FrameReader(from_client=True, max_message=100)
    failing.feed(text[:3])
    with pytest.raises(WebSocketError):
        failing.feed(text[3:] + b"\xff\x80\x00\x00\x00\x00")
    assert not failing.between_frames


def test_frame_reader_refuses_bad_frames() -> None:
    cases: list[tuple[bool, bytes, int, str]] = [
        (True, b"\x81\x05hello", PROTOCOL_ERROR, "unmasked"),  # a client must mask
        (False, masked(b"\x81\x05hello"), PROTOCOL_ERROR, "masked"),  # a broker must not
        (True, masked(b"\x83\x00"), PROTOCOL_ERROR, "Invalid opcode"),
        (True, masked(b"\x81\x02\xc3\x28"), 1007, "decode"),  # text that is not UTF-8
        (True, masked(b"\x80\x01x"), PROTOCOL_ERROR, "CONTINUATION"),
        (True, masked(b"\x81\x0b" + b"x" * 11), MESSAGE_TOO_BIG, "larger than 10 bytes"),
    ]
    for from_client, data, code, why in cases:
        with pytest.raises(WebSocketError, match=why) as caught:
            FrameReader(from_client=from_client, max_message=10).feed(data)
        assert caught.value.code == code, (data, caught.value)


def test_sluice_close_frames_parse_on_the_other_side() -> None:
    to_client = close_frame(1002, "Sluice: bad", to_client=True)
    assert FrameReader(from_client=False, max_message=10).feed(to_client).close == (
        1002,
        "Sluice: bad",
    )
    to_broker = close_frame(1001, "x" * 300, to_client=False)
    closed = FrameReader(from_client=True, max_message=10).feed(to_broker).close
    assert closed is not None and closed[0] == 1001 and len(closed[1]) == 123


def test_upgrade_headers() -> None:
    asked = [(b"Host", b"sluice:8080"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
             (b"Sec-WebSocket-Key", b"k"), (b"Sec-WebSocket-Version", b"13"),
             (b"Sec-WebSocket-Extensions", b"permessage-deflate"),
             (b"Authorization", b"Bearer t")]  # fmt: skip
    assert is_websocket_upgrade(asked)
    assert not is_websocket_upgrade([(b"Upgrade", b"h2c")])
    assert upgrade_headers(asked, b"broker:8080") == [
        (b"host", b"broker:8080"), (b"Sec-WebSocket-Key", b"k"),
        (b"Sec-WebSocket-Version", b"13"), (b"Authorization", b"Bearer t"),
        (b"connection", b"Upgrade"), (b"upgrade", b"websocket"),
    ]  # fmt: skip
    answer = [(b"Upgrade", b"WebSocket"), (b"Connection", b"Upgrade"),
              (b"Sec-WebSocket-Accept", b"a")]  # fmt: skip
    assert switch_problem(answer) is None
    assert switched_headers(answer) == [
        (b"Sec-WebSocket-Accept", b"a"), (b"connection", b"Upgrade"), (b"upgrade", b"websocket")
    ]  # fmt: skip
    assert "extension" in (switch_problem([*answer, (b"Sec-WebSocket-Extensions", b"x")]) or "")
    assert "other than WebSocket" in (switch_problem([(b"Upgrade", b"h2c")]) or "")


# --- a Session over real socket pairs ---------------------------------------------


def socket_pair(
    buffer: int | None = None, *, tcp: bool = False
) -> tuple[trio.SocketStream, trio.SocketStream]:
    """Two connected sockets: a socket pair, or a TCP connection over
    loopback with ``tcp`` (where a send to a peer that has closed still
    succeeds, as between hosts; a socket pair's fails at once)."""
    if tcp:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            a = socket.create_connection(listener.getsockname())
            b, _ = listener.accept()
    else:
        a, b = socket.socketpair()
    if buffer is not None:  # small buffers: a side that does not read holds up its sender
        for end in (a, b):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return (trio.SocketStream(trio.socket.from_stdlib_socket(a)),
            trio.SocketStream(trio.socket.from_stdlib_socket(b)))  # fmt: skip


def tls_pair() -> tuple[trio.SSLStream[trio.SocketStream], trio.SSLStream[trio.SocketStream]]:
    """A client's TLS stream and the server's end of it (trustme's CA), not
    yet shaken hands: ``(client, server)``."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    client, server = socket_pair()
    return (trio.SSLStream(client, client_context, server_hostname="localhost"),
            trio.SSLStream(server, server_context, server_side=True))  # fmt: skip


class Between:
    """A ``Session`` between a client and a broker, each the far end of a
    socket pair (``client``, ``broker``: what they send and receive); with
    ``tls``, the client's over TLS (as to a TLS ``--http-listen``) and the
    broker's over TCP."""

    def __init__(self, *, max_message: int = 1 << 20, idle_timeout: float = 30.0,
                 client_buffer: int | None = None, tls: bool = False) -> None:  # fmt: skip
        self.client: trio.abc.Stream
        client_side: trio.abc.Stream
        if tls:
            self.client, client_side = tls_pair()
        else:
            self.client, client_side = socket_pair(client_buffer)
        self.broker, broker_side = socket_pair(tcp=tls)
        self.sides = (client_side, broker_side)
        self.registry = CollectorRegistry()
        self.metrics = HttpMetrics(self.registry)
        self.session = Session(client_side, broker_side, self.metrics, max_message=max_message,
                               idle_timeout=idle_timeout, what="/ws/v2/test")  # fmt: skip
        self.done = trio.Event()

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"sluice_http_websocket_{name}", labels)

    async def run(self) -> None:
        """The TLS handshake (with ``tls``), the session, then both of
        Sluice's connections closed (as the HTTP relay does)."""
        try:
            client_side = self.sides[0]
            if isinstance(client_side, trio.SSLStream):
                assert isinstance(self.client, trio.SSLStream)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.client.do_handshake)
                    nursery.start_soon(client_side.do_handshake)
            await self.session.run(b"", b"")
        finally:
            for side in self.sides:
                await side.aclose()
            self.done.set()


async def read_to_eof(stream: trio.abc.ReceiveStream, *, reset: bool = False) -> bytes:
    """What ``stream`` receives up to its end; with ``reset``, a connection
    reset ends it too (as closing a socket with bytes still unread does)."""
    got = bytearray()
    with trio.fail_after(TIMEOUT):
        try:
            while data := await stream.receive_some(65536):
                got += data
        except trio.BrokenResourceError:
            if not reset:
                raise
    return bytes(got)


def test_nothing_a_side_sends_after_its_close_is_relayed() -> None:
    """After its CLOSE a client's bytes (an unmasked frame past the size
    limit, garbage) are neither relayed nor counted."""
    close = masked(b"\x88\x04\x03\xe8ok")
    after = b"\x82\x7e\x4e\x20" + b"x" * 20000 + b"\xff\xff garbage"

    async def main() -> bytes:
        between = Between(max_message=1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            await between.client.send_all(close + after)
            await between.client.aclose()
            got = await read_to_eof(between.broker)
            await between.broker.aclose()  # the broker hangs up in turn
        assert between.session.ending == "closed"
        assert between.metric("bytes_total", direction="client_to_broker") == len(close)
        return got

    assert trio.run(main) == close


def broker_frame(opcode: int, payload: bytes) -> bytes:
    """A broker's (unmasked) frame."""
    n = len(payload)
    length = bytes([n]) if n < 126 else b"\x7e" + struct.pack("!H", n)
    return bytes([0x80 | opcode]) + length + payload


def test_a_brokers_last_frames_reach_a_slow_client_after_it_hung_up() -> None:
    """The broker sends its last frames and a CLOSE, then hangs up; the
    client, not reading yet, sends a ping, which cannot reach the broker:
    the client still gets every frame and the CLOSE, then the end."""
    frames = b"".join(broker_frame(2, bytes([i]) * 10000) for i in range(10))
    sent = frames + broker_frame(8, struct.pack("!H", 1011) + b"topic deleted")

    async def main() -> bytes:
        between = Between(client_buffer=4096)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            await between.broker.send_all(sent)
            await between.broker.aclose()
            await between.client.send_all(masked(b"\x89\x04ping"))
            await wait_until_in_trio(
                lambda: between.metric("frames_total", direction="client_to_broker",
                                       opcode="ping") == 1,
                TIMEOUT,
                "the ping read",
            )  # fmt: skip
            got = await read_to_eof(between.client)
        assert between.session.ending == "closed"
        return got

    got = trio.run(main)
    assert len(got) == len(sent) and got == sent


@pytest.mark.parametrize("broker_first", [True, False], ids=["broker-first", "client-first"])
def test_a_tls_client_sees_the_end_once_the_close_handshake_is_done(
    monkeypatch: pytest.MonkeyPatch, broker_first: bool
) -> None:
    """Over TLS, which cannot be half-closed, the broker sends its CLOSE
    (first, or in answer to the client's) and hangs up; the client, which
    has sent its own CLOSE (or answers with it), waits for the end: its
    connection is closed at once, not after ``CLOSE_GRACE`` (made 5 s
    here, so that the two cannot be mistaken on a busy machine)."""
    monkeypatch.setattr(session_module, "CLOSE_GRACE", 5.0)
    broker_close = broker_frame(8, struct.pack("!H", 1000) + b"bye")
    client_close = masked(b"\x88\x02\x03\xe8")

    async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
        got = b""
        with trio.fail_after(TIMEOUT):
            while len(got) < n:
                got += await stream.receive_some(n - len(got))
        return got

    async def main() -> float:
        between = Between(tls=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            if not broker_first:
                await between.client.send_all(client_close)
                assert await read_exactly(between.broker, len(client_close)) == client_close
            await between.broker.send_all(broker_close)
            await between.broker.aclose()
            assert await read_exactly(between.client, len(broker_close)) == broker_close
            if broker_first:
                await between.client.send_all(client_close)
            closed = trio.current_time()  # the close handshake is done
            assert await read_to_eof(between.client) == b""
            ended = trio.current_time() - closed
        assert between.session.ending == "closed"
        for direction in ("client_to_broker", "broker_to_client"):
            assert between.metric("frames_total", direction=direction, opcode="close") == 1
        return ended

    ended = trio.run(main)
    assert ended < 2.0, f"the client saw the end {ended:.2f}s after the close handshake"


def test_a_frame_sent_a_byte_at_a_time_does_not_hold_an_idle_session() -> None:
    """Bytes of a frame that never ends are not frames: the session ends
    after the idle timeout (1001 to the client, whose direction is between
    frames) although a byte came in every tenth of a second."""
    frame = masked(b"\x81\x7d" + b"x" * 125)

    async def main() -> bytes:
        between = Between(idle_timeout=0.5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            sent = 0
            while not between.done.is_set() and sent < len(frame) - 1:
                try:
                    await between.client.send_all(frame[sent : sent + 1])
                except trio.BrokenResourceError:
                    break  # Sluice has closed the connection
                sent += 1
                await trio.sleep(0.1)  # a byte each tenth of a second, never a whole frame
            # The last byte may still be unread when Sluice closes the
            # connection: then a reset ends it, after the CLOSE frame.
            got = await read_to_eof(between.client, reset=True)
        assert sent < len(frame) - 1, "the session outlived the frame's bytes"
        assert between.session.ending == "idle_timeout"
        return got

    got = trio.run(main)
    assert FrameReader(from_client=False, max_message=100).feed(got).close == (
        1001,
        "Sluice: no frame within 0.5s (--http-request-timeout)",
    )


def test_a_character_split_between_fragments_is_kept_in_each_as_sent() -> None:
    """A text message in fragments that split a UTF-8 character (as a
    client that fragments by bytes does): each fragment's payload, as a
    recording keeps it (size, bytes, digest), is the bytes that fragment
    carried, not what a decoder had made of the message so far; and text
    that is not UTF-8 is still refused (1007)."""
    text = "prix: 10 €".encode()  # the euro sign: three bytes
    cut = text.index(b"\xe2") + 1  # inside it
    fragments = masked(b"\x01" + bytes([cut]) + text[:cut])
    fragments += masked(b"\x80" + bytes([len(text) - cut]) + text[cut:])
    reader = FrameReader(from_client=True, max_message=100, keep=True)
    seen = reader.feed(fragments)
    assert (seen.frames, seen.messages) == (["text", "text"], 1)
    assert seen.payloads == [text[:cut], text[cut:]] and seen.finals == [False, True]
    # Read a byte at a time: the same.
    reader = FrameReader(from_client=True, max_message=100, keep=True)
    payloads = [
        p for i in range(len(fragments)) for p in reader.feed(fragments[i : i + 1]).payloads
    ]
    assert payloads == [text[:cut], text[cut:]]
    with pytest.raises(WebSocketError) as caught:  # a character that never ends
        FrameReader(from_client=True, max_message=100).feed(
            masked(b"\x01" + bytes([cut]) + text[:cut]) + masked(b"\x80\x01x")
        )
    assert caught.value.code == 1007


def test_registered_close_codes_are_relayed() -> None:
    """The close codes IANA's registry assigns (1012 Service Restart, 1013
    Try Again Later, 1014 Bad Gateway: Jetty, the broker's web server,
    sends each) end a session as its side said; a code reserved and not
    assigned (1016) is still malformed (1002)."""
    for code in (1012, 1013, 1014):
        frame = broker_frame(8, struct.pack("!H", code) + b"upstream gone")
        reader = FrameReader(from_client=False, max_message=100, keep=True)
        seen = reader.feed(frame)
        assert seen.close == (code, "upstream gone") and seen.frames == ["close"], code
        assert seen.payloads == [frame[2:]] and seen.passed == len(frame)
    with pytest.raises(WebSocketError, match="Error decoding CLOSE reason") as caught:
        FrameReader(from_client=False, max_message=100).feed(
            broker_frame(8, struct.pack("!H", 1014) + b"\xff")
        )
    assert caught.value.code == 1007
    with pytest.raises(WebSocketError, match="reserved") as caught:
        FrameReader(from_client=False, max_message=100).feed(
            broker_frame(8, struct.pack("!H", 1016))
        )
    assert caught.value.code == PROTOCOL_ERROR
