"""Token authentication passes through Sluice unchanged, and stays secret.

pulsar-lite has no authentication, so the broker here is scripted (in the
manner of tests/helpers/scripted_broker.py, extended to producers and consumers):
it demands `auth_method_name = "token"` with the right token on CONNECT,
answers the real client's producers and consumers, and challenges every
authenticated connection once (AUTH_CHALLENGE, the way a broker refreshes
credentials), expecting the token back in AUTH_RESPONSE. The client is the
official pulsar-client with `pulsar.AuthenticationToken`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import pulsar
import pytest

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
from sluice.recording.format import recording_files
from tests.helpers.reliability import AdminProxy, pulsar_client, run_sluice, start_admin_proxy
from tests.helpers.support import RawClient, http_get

pytestmark = pytest.mark.e2e  # every test here starts a process

T = Type.Value
NO_REQUEST = 2**64 - 1


def new_token() -> str:
    """A JWT-shaped token nobody else would write."""
    return "eyJhbGciOiJIUzI1NiJ9.c2x1aWNlLXRlc3Q." + secrets.token_urlsafe(24)


@dataclass
class Seen:
    """What the broker received, for the test to check."""

    connects: list[pb.CommandConnect] = field(default_factory=list)
    auth_responses: list[bytes] = field(default_factory=list)
    refused: int = 0


class TokenBroker:
    """A broker that wants a token. ``anonymous_lookups`` lets connections
    without credentials look topics up (but not produce or consume), the
    only way a client gets through Sluice today: Sluice looks topics up on
    its own, unauthenticated connection (see docs/reliability.md)."""

    def __init__(
        self, token: str, *, anonymous_lookups: bool, challenge_in_handshake: bool = False
    ) -> None:
        self.token = token
        self.anonymous_lookups = anonymous_lookups
        self.challenge_in_handshake = challenge_in_handshake
        self.seen = Seen()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.topics: dict[str, list[tuple[bytes, bytes]]] = {}  # metadata, payload
        self.consumers: list[_Consumer] = []
        self.lock = threading.Lock()
        self._entries = 0
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._closed = False

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def __enter__(self) -> TokenBroker:
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self.listener.close()
        for sock in list(self._socks):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for t in self._threads:
            t.join(5)

    def _accept(self) -> None:
        self.listener.settimeout(0.1)  # a closed listener does not wake accept()
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            self._socks.append(sock)
            t = threading.Thread(target=_Session(self, sock).run, daemon=True)
            t.start()
            self._threads.append(t)

    def valid(self, connect: pb.CommandConnect) -> bool:
        return connect.auth_method_name == "token" and connect.auth_data == self.token.encode()


@dataclass
class _Consumer:
    session: _Session
    consumer_id: int
    topic: str
    permits: int = 0
    position: int = 0


class _Session:
    def __init__(self, broker: TokenBroker, sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self.decoder = FrameDecoder()
        self.write_lock = threading.Lock()
        self.authenticated = False
        self.challenged = False
        self.producers: dict[int, str] = {}

    def send(self, data: bytes) -> None:
        with self.write_lock, contextlib.suppress(OSError):
            self.sock.sendall(data)

    def run(self) -> None:
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    data = b""
                self.decoder.receive_data(data)
                while isinstance(frame := self.decoder.next_event(), Frame):
                    if not self.handle(frame):
                        return
                if frame is CLOSED or not data:
                    return
        finally:
            with self.broker.lock:
                self.broker.consumers = [c for c in self.broker.consumers if c.session is not self]
            self.sock.close()

    def _challenge(self) -> None:
        challenge = pb.CommandAuthChallenge(
            server_version="token-broker",
            protocol_version=21,
            challenge=pb.AuthData(auth_method_name="token", auth_data=b"refresh"),
        )
        self.send(encode(command(T("AUTH_CHALLENGE"), challenge)))
        self.challenged = True

    def _connected(self) -> None:
        connected = pb.CommandConnected(server_version="token-broker", protocol_version=21)
        self.send(encode(command(T("CONNECTED"), connected)))

    def handle(self, frame: Frame) -> bool:
        broker, body = self.broker, frame.body
        t = frame.type
        if t == T("CONNECT"):
            broker.seen.connects.append(body)
            if broker.valid(body):
                self.authenticated = True
                if broker.challenge_in_handshake:
                    self._challenge()
                    return True
                self._connected()
                self._challenge()  # a credentials refresh, right away
                return True
            if not body.auth_data and broker.anonymous_lookups:
                self._connected()
                return True
            broker.seen.refused += 1
            error = pb.CommandError(
                request_id=NO_REQUEST, error=pb.AuthenticationError, message="invalid token"
            )
            self.send(encode(command(T("ERROR"), error)))
            return False
        if t == T("AUTH_RESPONSE"):
            broker.seen.auth_responses.append(body.response.auth_data)
            if body.response.auth_data != broker.token.encode():
                return False
            if broker.challenge_in_handshake and self.challenged:
                self.challenged = False
                self._connected()
            return True
        if t == T("PING"):
            self.send(encode(command(T("PONG"))))
        elif t == T("PARTITIONED_METADATA"):
            answer = pb.CommandPartitionedTopicMetadataResponse(
                request_id=body.request_id, partitions=0
            )
            answer.response = answer.Success
            self.send(encode(command(T("PARTITIONED_METADATA_RESPONSE"), answer)))
        elif t == T("LOOKUP"):
            lookup = pb.CommandLookupTopicResponse(
                brokerServiceUrl=broker.url, authoritative=True, request_id=body.request_id
            )
            lookup.response = lookup.Connect
            self.send(encode(command(T("LOOKUP_RESPONSE"), lookup)))
        elif t in (T("PRODUCER"), T("SUBSCRIBE")) and not self.authenticated:
            error = pb.CommandError(
                request_id=body.request_id, error=pb.AuthorizationError, message="no token"
            )
            self.send(encode(command(T("ERROR"), error)))
        elif t == T("PRODUCER"):
            self.producers[body.producer_id] = body.topic
            ok = pb.CommandProducerSuccess(
                request_id=body.request_id,
                producer_name=f"token-broker-{body.producer_id}",
                last_sequence_id=-1,
            )
            self.send(encode(command(T("PRODUCER_SUCCESS"), ok)))
        elif t == T("SEND"):
            assert frame.metadata is not None
            topic = self.producers[body.producer_id]
            payload = frame.raw[frame.payload_offset :]
            with broker.lock:
                broker.topics.setdefault(topic, []).append(
                    (frame.metadata.SerializeToString(), payload)
                )
                broker._entries += 1
                entry = broker._entries
            receipt = pb.CommandSendReceipt(
                producer_id=body.producer_id,
                sequence_id=body.sequence_id,
                message_id=pb.MessageIdData(ledgerId=1, entryId=entry),
            )
            self.send(encode(command(T("SEND_RECEIPT"), receipt)))
            self.dispatch()
        elif t == T("SUBSCRIBE"):
            with broker.lock:
                broker.consumers.append(_Consumer(self, body.consumer_id, body.topic))
            self.send(encode(command(T("SUCCESS"), pb.CommandSuccess(request_id=body.request_id))))
        elif t == T("FLOW"):
            with broker.lock:
                for c in broker.consumers:
                    if c.session is self and c.consumer_id == body.consumer_id:
                        c.permits += body.messagePermits
            self.dispatch()
        elif t in (T("CLOSE_PRODUCER"), T("CLOSE_CONSUMER")):
            self.send(encode(command(T("SUCCESS"), pb.CommandSuccess(request_id=body.request_id))))
        return True

    def dispatch(self) -> None:
        broker = self.broker
        out: list[tuple[_Session, bytes]] = []
        with broker.lock:
            for c in broker.consumers:
                entries = broker.topics.get(c.topic, [])
                while c.permits > 0 and c.position < len(entries):
                    meta, payload = entries[c.position]
                    message = pb.CommandMessage(
                        consumer_id=c.consumer_id,
                        message_id=pb.MessageIdData(ledgerId=2, entryId=c.position),
                    )
                    out.append(
                        (c.session, encode_payload(command(T("MESSAGE"), message), meta, payload))
                    )
                    c.position += 1
                    c.permits -= 1
        for session, data in out:
            session.send(data)


@contextlib.contextmanager
def token_broker(token: str, **options: bool) -> Iterator[TokenBroker]:
    with TokenBroker(token, **options) as broker:
        yield broker


def produce_and_consume(url: str, topic: str, token: str, count: int = 20) -> list[bytes]:
    sent = [f"auth-{i}".encode() for i in range(count)]
    with pulsar_client(
        url, authentication=pulsar.AuthenticationToken(token), operation_timeout_seconds=10
    ) as c:
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic, batching_enabled=False)
        for m in sent:
            producer.send(m)
        got = []
        for _ in sent:
            msg = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(msg)
            got.append(msg.data())
    return got


def wrong_token_failure(url: str) -> Exception:
    try:
        with pulsar_client(
            url, authentication=pulsar.AuthenticationToken(new_token()), operation_timeout_seconds=3
        ) as c:
            c.create_producer("persistent://public/default/auth-wrong")
    except Exception as exc:
        return exc
    raise AssertionError("a wrong token got a producer")


# --- the token reaches the broker unchanged --------------------------------------


def test_token_reaches_the_broker_unchanged_and_challenges_are_relayed(
    tmp_path: Path,
) -> None:
    token = new_token()
    with token_broker(token, anonymous_lookups=True) as broker:
        proxy = start_admin_proxy(broker.url, tmp_path)
        try:
            topic = "persistent://public/default/auth"
            assert produce_and_consume(proxy.url, topic, token) == [
                f"auth-{i}".encode() for i in range(20)
            ]
            relayed = [
                c for c in broker.seen.connects if not c.client_version.startswith("Sluice/")
            ]
            assert relayed, "no CONNECT came through the proxy"
            for connect in relayed:
                assert connect.auth_method_name == "token"
                assert connect.auth_data == token.encode()  # byte for byte
            # Every authenticated connection was challenged and answered: the
            # client's through the proxy, and the proxy's lookup connection
            # (opened with the client's token) with that token.
            authenticated = [c for c in broker.seen.connects if c.auth_data]
            assert len(authenticated) > len(relayed)  # lookups carried the token too
            assert len(broker.seen.auth_responses) == len(authenticated)
            assert all(r == token.encode() for r in broker.seen.auth_responses)
        finally:
            proxy.kill()


def test_a_challenge_during_the_handshake_is_relayed(tmp_path: Path) -> None:
    token = new_token()
    with token_broker(token, anonymous_lookups=True, challenge_in_handshake=True) as broker:
        proxy = start_admin_proxy(broker.url, tmp_path)
        try:
            with RawClient(proxy.proxy.port) as raw:
                raw.send_connect(f"127.0.0.1:{broker.port}", token=token.encode())
                challenge = raw.receive_type("AUTH_CHALLENGE")
                assert challenge.body.challenge.auth_data == b"refresh"
                answer = pb.CommandAuthResponse(
                    client_version="tests",
                    protocol_version=21,
                    response=pb.AuthData(auth_method_name="token", auth_data=token.encode()),
                )
                raw.send(encode(command(T("AUTH_RESPONSE"), answer)))
                assert raw.receive_type("CONNECTED").name == "CONNECTED"
            assert broker.seen.auth_responses == [token.encode()]
        finally:
            proxy.kill()


def test_a_wrong_token_is_refused_by_the_broker(tmp_path: Path) -> None:
    token = new_token()
    with token_broker(token, anonymous_lookups=True) as broker:
        proxy = start_admin_proxy(broker.url, tmp_path)
        try:
            # The real client never gets a producer either way. Straight to the
            # broker, pulsar-client 3.x retries the refused handshake until its
            # operation timeout (Timeout); through the proxy the lookup, made
            # with the client's token, is refused by the broker and the client
            # is told the broker's own AuthenticationError.
            direct = wrong_token_failure(broker.url)
            proxied = wrong_token_failure(proxy.url)
            assert isinstance(direct, pulsar.Timeout | pulsar.AuthenticationError), direct
            assert isinstance(proxied, pulsar.AuthenticationError), proxied
            assert broker.seen.refused >= 2
            # By hand: the broker's own ERROR frame, unchanged.
            with RawClient(proxy.proxy.port) as raw:
                raw.send_connect(f"127.0.0.1:{broker.port}", token=b"wrong")
                error = raw.receive_type("ERROR")
                assert error.body.error == pb.AuthenticationError
                assert error.body.message == "invalid token"
                assert raw.receive() is None  # and the connection is closed
        finally:
            proxy.kill()


def test_token_reaches_the_broker_on_the_lookup_connection(tmp_path: Path) -> None:
    """A broker that authenticates every connection, lookups included: the
    proxy's lookups go with the client's own token; only the proxy's own
    readiness probe, which carries none, is refused (once: after that the
    broker is only dialled)."""
    token = new_token()
    with token_broker(token, anonymous_lookups=False) as broker:
        proxy = start_admin_proxy(broker.url, tmp_path)
        try:
            got = produce_and_consume(proxy.url, "persistent://public/default/auth-l", token, 5)
            assert len(got) == 5
            ours = [c for c in broker.seen.connects if not c.auth_data]
            theirs = [c for c in broker.seen.connects if c.auth_data]
            assert len(ours) <= 2 and broker.seen.refused == len(ours)  # start-up check, probe
            assert all(c.client_version.startswith("Sluice/") for c in ours)
            assert theirs and all(c.auth_data == token.encode() for c in theirs)
            lookups = [c for c in theirs if c.client_version.startswith("Sluice/")]
            assert lookups, "no lookup connection carried the token"
            assert proxy.metric("sluice_upstream_up") == 1
        finally:
            proxy.kill()


# --- the token stays secret -------------------------------------------------------


def forms(token: str) -> list[bytes]:
    """The token as bytes, and as base64 (JSON output of raw bytes)."""
    raw = token.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


def assert_absent(token: str, where: str, data: bytes) -> None:
    for form in forms(token):
        assert form not in data, f"the token is in {where}"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_token_is_in_no_artefact(tmp_path: Path, log_format: str) -> None:
    token = new_token()
    directory = tmp_path / "capture"
    with token_broker(token, anonymous_lookups=True) as broker:
        proxy: AdminProxy = start_admin_proxy(
            broker.url,
            tmp_path,
            "--log-level",
            "debug",
            "--log-format",
            log_format,
            "--record",
            str(directory),
            "--record-payloads",
            "full",
        )
        try:
            produce_and_consume(proxy.url, "persistent://public/default/auth-secret", token)
            with RawClient(proxy.proxy.port) as raw:  # a wrong token too
                raw.send_connect(f"127.0.0.1:{broker.port}", token=b"wrong-" + token.encode())
                raw.receive_type("ERROR")
            status, metrics = http_get(f"http://127.0.0.1:{proxy.admin}/metrics")
            assert status == 200
            assert_absent(token, "/metrics", metrics.encode())
            assert proxy.proxy.terminate() == 0  # flushes the recording
            log = proxy.proxy.log_path.read_bytes()
            assert b"AUTH_RESPONSE" in log and b"CONNECT" in log, "debug logging was off"
            if log_format == "json":
                for line in log.splitlines():
                    if line.startswith(b"{"):
                        json.loads(line)
            assert_absent(token, "the proxy's log", log)
        finally:
            proxy.kill()
    files = recording_files(directory)
    assert files
    for path in files:
        data = path.read_bytes()
        assert_absent(token, str(path), data)
        # Every recorded frame, decoded: nothing of the token in any field.
        with open(path, "rb") as handle:
            for record in msgpack.Unpacker(handle, raw=False):
                assert token not in repr(record)
    shown = [
        run_sluice("inspect", str(directory)),
        run_sluice("inspect", str(directory), "--json", "--with-bytes"),
        run_sluice("inspect", str(directory), "--summary"),
    ]
    for result in shown:
        assert result.returncode == 0, result.stderr
        assert_absent(token, "inspect's output", (result.stdout + result.stderr).encode())
    assert b"AUTH_RESPONSE" in shown[0].stdout.encode()
    # Bytes in JSON are base64: decode them and look inside.
    for text in shown[1].stdout.splitlines():
        record = json.loads(text)
        if "raw" in record:
            assert_absent(token, "a recorded frame", base64.b64decode(record["raw"]))
    pcap = tmp_path / "out.pcapng"
    exported = run_sluice("inspect", str(directory), "--pcap", str(pcap))
    assert exported.returncode == 0, exported.stderr
    assert_absent(token, "the pcapng export", pcap.read_bytes())
