"""Sluice's own credential (--auth-mode proxy) goes only where it should,
and what clients send cannot multiply or misuse it.

- A client names ``proxy_to_broker_url`` itself: an address --allow-broker
  admits but that the upstream never named and --trust-broker does not
  name is refused before anything is dialled (the core, then the running
  proxy with a listener standing in for a broker a client controls).
- LOOKUP and PARTITIONED_METADATA go upstream naming the verified role,
  never the ``original_*`` fields the client wrote.
- The shared upstream connections are kept per verified identity, not per
  spelling of a token, and there are at most --max-upstream-connections.
- AUTH_RESPONSE nobody asked for and a client's AUTH_CHALLENGE are refused
  with a protocol ERROR, not an exception, and logged with a limit.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio

from sluice.addresses import Address, AllowList
from sluice.brokers.apache_pulsar import hs256_token
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.errors import ConfigError
from sluice.protocols.core import (
    Ask,
    Authenticated,
    Close,
    Conn,
    OnInvalid,
    OpenUpstream,
    Peer,
    Rejected,
    Send,
)
from sluice.protocols.pulsar import decode_stream, pb
from sluice.protocols.pulsar.auth import Identity, ProxyAuth
from sluice.protocols.pulsar.connection import (
    PulsarConnection,
    PulsarSettings,
    Routing,
    UpstreamFailure,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.pulsar import SharedRouting, UpstreamPool
from sluice.proxy.server import Proxy
from tests.helpers.reliability import AdminProxy, wait_until
from tests.helpers.scripted_broker import ScriptedBroker
from tests.helpers.support import RawClient, client, start_proxy, tcp_connections
from tests.test_pulsar_core import Recording, connect_body, frame_bytes, lookup_answer, sent

T = pb.BaseCommand
SECRET = b"0123456789abcdef0123456789abcdef"
SLUICE_TOKEN = hs256_token(SECRET, "sluice")
BROKER = "pulsar://127.0.0.1:6650"


def auth_files(tmp_path: Path) -> tuple[Path, Path]:
    key, own = tmp_path / "secret.key", tmp_path / "sluice.token"
    key.write_bytes(SECRET)
    own.write_text(SLUICE_TOKEN + "\n")
    return key, own


def proxy_auth(tmp_path: Path, *, forward: bool = False) -> ProxyAuth:
    key, own = auth_files(tmp_path)
    return ProxyAuth.load(secret_key=key, public_key=None, role_claim="sub", own_token=own,
                          tls_roles=False, forward_auth_data=forward)  # fmt: skip


def core_for(
    routing: Routing,
    auth: ProxyAuth | None,
    trusted: tuple[str, ...] = (),
) -> tuple[PulsarConnection, Recording]:
    rec = Recording()
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, auth,
                              AllowList(trusted, "--trust-broker"))  # fmt: skip
    core = PulsarConnection(Conn(1, "127.0.0.1:5000", "plain", "pulsar"), settings, routing, rec)
    return core, rec


def token_connect(token: str | bytes, **fields: Any) -> bytes:
    data = token.encode() if isinstance(token, str) else token
    return frame_bytes("CONNECT", connect_body(auth_method_name="token", auth_data=data, **fields))


def closes(actions: list[Any]) -> list[Close]:
    return [a for a in actions if isinstance(a, Close)]


# --- where Sluice's credential may go ----------------------------------------------------


def test_sluices_credential_goes_only_to_brokers_the_upstream_named_or_trusted(
    tmp_path: Path,
) -> None:
    routing = Routing(parse_broker_url(BROKER), ("127.0.0.0/8",))
    auth = proxy_auth(tmp_path)
    app = hs256_token(SECRET, "app")

    def relay_to(target: str, now: float = 0.0) -> tuple[list[Any], Recording]:
        core, rec = core_for(routing, auth, trusted=("127.0.0.3:7000-7999",))
        return core.receive_client(token_connect(app, proxy_to_broker_url=target), now), rec

    # Allowed, but nobody named it: refused before anything is dialled.
    out, rec = relay_to("127.0.0.2:7777")
    assert not [a for a in out if isinstance(a, OpenUpstream)]
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.ServiceNotReady
    assert "--trust-broker" in error.body.message
    assert rec.of(Rejected) == [Rejected("untrusted_broker")]
    (close,) = closes(out)
    assert close.reason == "relay_refused" and close.level == logging.WARNING
    # Logged once per broker: again within a minute at debug, another broker warns.
    assert closes(relay_to("127.0.0.2:7777", 10.0)[0])[0].level == logging.DEBUG
    assert closes(relay_to("127.0.0.2:7778", 10.0)[0])[0].level == logging.WARNING

    def hello(out: list[Any]) -> pb.CommandConnect:
        (opened,) = out
        assert isinstance(opened, OpenUpstream)
        (frame,) = decode_stream(opened.hello, 1 << 20)
        body: pb.CommandConnect = frame.body
        return body

    # --trust-broker names it: Sluice logs in as itself, naming the client.
    trusted = hello(relay_to("127.0.0.3:7100")[0])
    assert trusted.auth_data == SLUICE_TOKEN.encode() and trusted.original_principal == "app"
    # The upstream named it in a lookup answer: learned, so trusted too.
    lookup, _ = core_for(routing, auth)
    lookup.receive_client(token_connect(app), 0.0)
    (ask,) = lookup.receive_client(
        frame_bytes("LOOKUP", pb.CommandLookupTopic(topic="persistent://t/n/a", request_id=1)), 1.0
    )
    assert isinstance(ask, Ask)
    lookup.answered(
        ask.token,
        lookup_answer(pb.CommandLookupTopicResponse.Connect, "pulsar://127.0.0.2:7777"),
        1.1,
    )
    learned = hello(relay_to("127.0.0.2:7777", 2.0)[0])
    assert learned.auth_data == SLUICE_TOKEN.encode()
    # Passthrough holds no credential of its own: the client's goes where it says.
    core, _ = core_for(Routing(parse_broker_url(BROKER), ("127.0.0.0/8",)), None)
    out = core.receive_client(token_connect(app, proxy_to_broker_url="127.0.0.2:7777"), 0.0)
    assert hello(out).auth_data == app.encode()


@pytest.mark.parametrize("forward", [False, True], ids=["own-data", "forward-auth-data"])
@pytest.mark.parametrize("request_type", ["LOOKUP", "PARTITIONED_METADATA"])
def test_lookups_name_the_verified_role_not_what_the_client_wrote(
    tmp_path: Path, request_type: str, forward: bool
) -> None:
    core, _ = core_for(Routing(parse_broker_url(BROKER)), proxy_auth(tmp_path, forward=forward))
    app = hs256_token(SECRET, "app")
    core.receive_client(token_connect(app), 0.0)
    message = (
        pb.CommandLookupTopic if request_type == "LOOKUP" else pb.CommandPartitionedTopicMetadata
    )
    body = message(topic="persistent://t/n/a", request_id=9, original_principal="admin",
                   original_auth_method="token", original_auth_data="forged")  # fmt: skip
    (ask,) = core.receive_client(frame_bytes(request_type, body), 1.0)
    assert isinstance(ask, Ask)
    _, upstream, credentials = ask.request
    assert upstream.original_principal == "app" == credentials.original_principal
    assert upstream.original_auth_method == "token"
    if forward:
        assert upstream.original_auth_data == app
    else:
        assert not upstream.HasField("original_auth_data")


# --- one upstream connection per identity, and a cap -------------------------------------


def noncanonical(token: str) -> str:
    """The same token with the unused low bits of its last base64 character
    set: it decodes to the same bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    index = alphabet.index(token[-1])
    return token[:-1] + alphabet[index ^ 1]


def test_every_spelling_of_a_token_shares_one_lookup_credential(tmp_path: Path) -> None:
    auth = proxy_auth(tmp_path, forward=True)
    routing = Routing(parse_broker_url(BROKER))
    token = hs256_token(SECRET, "app", time.time() + 600)
    assert noncanonical(token) != token
    spellings = [f"token:{token} ", f"  {token}\n", token, f"token:{token}", noncanonical(token)]
    kept = []
    for spelling in spellings:
        core, rec = core_for(routing, auth)
        out = core.receive_client(token_connect(spelling), 0.0)
        if Authenticated("token", "ok") not in rec.events:
            assert sent(out, Peer.CLIENT)[0].body.error == pb.AuthenticationError
            continue  # refused by the verifier: no credential at all
        (ask,) = core.receive_client(
            frame_bytes("LOOKUP", pb.CommandLookupTopic(topic="t", request_id=1)), 1.0
        )
        assert isinstance(ask, Ask)
        kept.append(ask.request[2])
    assert len(kept) >= 4  # the canonical one, whitespace and the prefix verify
    assert all(credentials is kept[0] for credentials in kept), kept
    assert kept[0].original_data == token  # forwarded as verified, not as first spelled
    # Whatever the verifier lets through: one value per verified identity.
    one = Identity("app", "token", b"spelling one", 1e9)
    assert routing.upstream_auth(auth, Identity("app", "token", b"spelling two", 1e9)) is (
        routing.upstream_auth(auth, one)
    )
    for other in (Identity("app", "token", b"x", 2e9), Identity("ops", "token", b"x", 1e9)):
        assert routing.upstream_auth(auth, other) != routing.upstream_auth(auth, one)


async def test_the_pool_keeps_at_most_its_limit_closing_the_least_recently_used(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    auth = proxy_auth(tmp_path)
    routing = Routing(parse_broker_url(broker.url))
    address = routing.broker.address
    roles = [routing.upstream_auth(auth, Identity(r, "token", b"")) for r in ("a", "b", "c")]
    async with trio.open_nursery() as nursery:
        pool = UpstreamPool(nursery, timeout=10, tls_for=lambda _: None, limit=2)
        first = await pool.get(address, roles[0])
        second = await pool.get(address, roles[1])
        while trio.current_time() <= second.last_used:  # a later last use for the first
            await trio.sleep(0)
        assert await pool.get(address, roles[0]) is first
        third = await pool.get(address, roles[2])
        assert len(pool) == 2 and second.closed and not first.closed and not third.closed
        # A broker that cannot be dialled leaves nothing behind (the room
        # made for it stays free).
        with pytest.raises(UpstreamFailure, match="cannot reach"):
            await pool.get(Address("127.0.0.1", free_port()), roles[0])
        assert len(pool) == 1 and not pool._attempts
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_full_pool_of_busy_connections_answers_too_many_requests() -> None:
    async def never(request: pb.CommandLookupTopic) -> pb.CommandLookupTopicResponse:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    scripted = ScriptedBroker(never)
    async with trio.open_nursery() as nursery:
        await nursery.start(scripted.serve)
        address = Address("127.0.0.1", scripted.port)
        pool = UpstreamPool(nursery, timeout=10, tls_for=lambda _: None, limit=1)
        busy = await pool.get(address)

        async def unanswered() -> None:
            with contextlib.suppress(UpstreamFailure):  # closed at the end
                await busy.request(T.LOOKUP, pb.CommandLookupTopic(topic="t"), 60.0)

        nursery.start_soon(unanswered)
        with trio.fail_after(10):
            while not busy.busy:
                await trio.sleep(0.01)
        with pytest.raises(UpstreamFailure) as refused:
            await pool.get(address, ProxyAuth("token").own)
        assert refused.value.error == pb.TooManyRequests
        assert "--max-upstream-connections" in refused.value.message
        await pool.aclose()
        nursery.cancel_scope.cancel()


# --- what a client may not send ----------------------------------------------------------


def proxied(tmp_path: Path, routing: Routing | None = None) -> tuple[PulsarConnection, Recording]:
    """Proxy mode, relayed to the configured broker, past the handshake."""
    core, rec = core_for(routing or Routing(parse_broker_url(BROKER)), proxy_auth(tmp_path))
    out = core.receive_client(
        token_connect(hs256_token(SECRET, "app"), proxy_to_broker_url="127.0.0.1:6650"), 0.0
    )
    assert [type(a) for a in out] == [OpenUpstream]
    connected = pb.CommandConnected(server_version="broker", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)
    assert core.established
    return core, rec


def challenge() -> bytes:
    body = pb.CommandAuthChallenge(challenge=pb.AuthData(auth_method_name="token", auth_data=b"?"))
    return frame_bytes("AUTH_CHALLENGE", body)


def response(token: str) -> bytes:
    data = pb.AuthData(auth_method_name="token", auth_data=token.encode())
    return frame_bytes("AUTH_RESPONSE", pb.CommandAuthResponse(response=data))


@pytest.mark.parametrize("kind", ["proxied", "lookup"])
@pytest.mark.parametrize("frame", ["AUTH_CHALLENGE", "AUTH_RESPONSE"])
def test_auth_frames_nobody_asked_for_are_refused_not_raised(
    tmp_path: Path, kind: str, frame: str
) -> None:
    routing = Routing(parse_broker_url(BROKER))
    if kind == "proxied":
        core, rec = proxied(tmp_path, routing)
    else:
        core, rec = core_for(routing, proxy_auth(tmp_path))
        core.receive_client(token_connect(hs256_token(SECRET, "app")), 0.0)
    data = challenge() if frame == "AUTH_CHALLENGE" else response(hs256_token(SECRET, "app"))
    out = core.receive_client(data, 1.0)
    assert not [a for a in out if isinstance(a, Send) and a.to is Peer.BROKER]
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.NotAllowedError
    (close,) = closes(out)
    assert close.reason == "auth" and close.level == logging.WARNING
    assert Authenticated("token", "unsolicited") in rec.events
    # Repeated within a minute: logged at debug.
    if kind == "proxied":
        again, _ = proxied(tmp_path, routing)
    else:
        again, _ = core_for(routing, proxy_auth(tmp_path))
        again.receive_client(token_connect(hs256_token(SECRET, "app")), 0.0)
    assert closes(again.receive_client(data, 2.0))[0].level == logging.DEBUG


def test_a_brokers_challenge_is_still_answered_and_the_clients_refresh_taken(
    tmp_path: Path,
) -> None:
    core, rec = proxied(tmp_path)
    out = core.receive_broker(challenge(), 1.0)
    (answer,) = [a for a in out if isinstance(a, Send)]
    assert answer.to is Peer.BROKER
    assert decode_stream(answer.data, 1 << 20)[0].body.response.auth_data == SLUICE_TOKEN.encode()
    # The client's answer to Sluice's own refresh challenge is taken.
    core._expires_at = 5.0  # the token ran out on the core's clock
    asked = core.keepalive(6.0, 10.0)
    assert [f.name for f in sent(asked, Peer.CLIENT)] == ["AUTH_CHALLENGE"]
    assert core.receive_client(response(hs256_token(SECRET, "app", time.time() + 60)), 6.5) == []
    assert Authenticated("token", "refreshed") in rec.events


# --- through the running proxy -------------------------------------------------------------


class Listener:
    """A TCP listener that keeps every byte sent to it: a broker a client
    controls, or one the operator trusts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.received = bytearray()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.settimeout(5)
            try:
                while data := conn.recv(65536):
                    self.received += data
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    attacker, trusted = Listener(), Listener()
    yield attacker, trusted
    attacker.close()
    trusted.close()


def proxy_mode(
    broker: EmbeddedBroker, tmp_path: Path, *extra: str, port: int | None = None
) -> AdminProxy:
    """``sluice proxy --auth-mode proxy`` with its admin endpoint."""
    key, own = auth_files(tmp_path)
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--auth-mode", "proxy", "--auth-token-secret-key", str(key),
                        "--broker-auth-token-file", str(own), *extra, port=port)  # fmt: skip
    return AdminProxy(proxy, admin)


def test_an_allowed_broker_nobody_named_never_receives_sluices_token(
    broker: EmbeddedBroker, tmp_path: Path, listeners: tuple[Listener, Listener], topic: str
) -> None:
    attacker, trusted = listeners
    proxy = proxy_mode(broker, tmp_path, "--allow-broker", "127.0.0.0/8",
                       "--trust-broker", f"127.0.0.1:{trusted.port}")  # fmt: skip
    app = hs256_token(SECRET, "app")
    try:
        for _ in range(3):
            with RawClient(proxy.proxy.port) as raw:
                raw.send_connect(f"127.0.0.1:{attacker.port}", app.encode())
                answer = raw.receive()
                assert answer is not None and answer.name == "ERROR", answer
                assert answer.body.error == pb.ServiceNotReady
                assert "--trust-broker" in answer.body.message
        wait_until(lambda: proxy.metric("sluice_connections_rejected_total",
                                        reason="untrusted_broker") == 3,
                   10, "three refusals counted")  # fmt: skip
        # The real client, looking its broker up through Sluice, works.
        with client(proxy.url, authentication=pulsar.AuthenticationToken(app)) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"through")
            assert consumer.receive(10_000).data() == b"through"
        # What a broker the operator trusts gets: the token the attacker's never did.
        with RawClient(proxy.proxy.port) as raw:
            raw.send_connect(f"127.0.0.1:{trusted.port}", app.encode())
            wait_until(lambda: SLUICE_TOKEN.encode() in trusted.received, 10, "trusted CONNECT")
        assert attacker.accepted == 0 and not attacker.received
        assert proxy.proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.proxy.log()
    assert "Traceback" not in log
    assert log.count(f"127.0.0.1:{attacker.port} is allowed but was not named") == 1, log


def test_bad_input_through_the_running_proxy_is_answered_without_a_traceback(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    proxy = proxy_mode(broker, tmp_path, "--forward-auth-data")
    app = hs256_token(SECRET, "app")
    broker_address = broker.url.removeprefix("pulsar://")
    try:
        for _ in range(2):
            with RawClient(proxy.proxy.port) as raw:  # a CONNECT whose broker is not text
                body = pb.CommandConnect()
                body.ParseFromString(connect_body(auth_method_name="token", auth_data=app.encode())
                                     .SerializeToString() + b"\x32\x03\xff\xfe1")  # fmt: skip
                raw.send(frame_bytes("CONNECT", body))
                answer = raw.receive()
                assert answer is not None and answer.body.error == pb.NotAllowedError, answer
            with RawClient(proxy.proxy.port) as raw:  # a client's AUTH_CHALLENGE, relayed
                raw.send_connect(broker_address, app.encode())
                assert raw.receive_type("CONNECTED")
                raw.send(challenge())
                answer = raw.receive_type("ERROR")
                assert answer.body.error == pb.NotAllowedError
                assert raw.receive() is None  # and closed
            with RawClient(proxy.proxy.port) as raw:  # AUTH_RESPONSE unasked, on lookups
                raw.send_connect(None, app.encode())
                assert raw.receive_type("CONNECTED")
                raw.send(response(app))
                assert raw.receive_type("ERROR").body.error == pb.NotAllowedError
        wait_until(lambda: proxy.metric("sluice_auth_total", outcome="unsolicited") == 4,
                   10, "four refused auth frames counted")  # fmt: skip
        assert proxy.metric("sluice_connections_rejected_total", reason="handshake") == 2
        assert proxy.proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.proxy.log()
    assert "Traceback" not in log and "internal error" not in log, log
    for line in ("is not UTF-8", "only brokers challenge", "AUTH_RESPONSE without a challenge"):
        assert log.count(line) == 1, (line, log)


def test_spellings_of_one_token_share_one_upstream_connection(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    proxy = proxy_mode(broker, tmp_path, "--forward-auth-data")
    token = hs256_token(SECRET, "app", time.time() + 600)
    port = int(broker.url.rsplit(":", 1)[1])

    def to_broker() -> int:
        return sum(remote == ("127.0.0.1", port) for _, remote in tcp_connections(proxy.pid))

    try:
        wait_until(lambda: to_broker() == 1, 10, "the probe's own connection")
        for i, spelling in enumerate([token, f" {token}\n", f"token:{token}", f"token:{token}  "]):
            with RawClient(proxy.proxy.port) as raw:
                raw.send_connect(None, spelling.encode())
                assert raw.receive_type("CONNECTED")
                assert (
                    raw.lookup(topic, request_id=i).body.response
                    == pb.CommandLookupTopicResponse.Connect
                )
        assert to_broker() == 2  # the probe's, and one for the role
        assert proxy.proxy.terminate() == 0
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.proxy.log()


def test_trust_broker_rules_are_checked_and_need_proxy_mode(tmp_path: Path) -> None:
    broker = parse_broker_url(BROKER)
    listen = Address("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="--trust-broker: only with --auth-mode proxy"):
        ProxyConfig(broker=broker, listen=listen, trust_broker=("10.0.0.1",))
    key, own = auth_files(tmp_path)

    def config(*trust: str) -> ProxyConfig:
        return ProxyConfig(broker=broker, listen=listen, auth_mode="proxy",
                           auth_token_secret_key=key, broker_auth_token_file=own,
                           trust_broker=trust)  # fmt: skip

    with pytest.raises(ConfigError, match=r"--trust-broker '10\.0\.0\.1:x': bad port"):
        config("10.0.0.1:x")
    with pytest.raises(ConfigError, match=r"--allow-broker '10\.0\.0\.1:x': bad port"):
        ProxyConfig(broker=broker, listen=listen, allow_broker=("10.0.0.1:x",))
    proxy = Proxy(config("127.0.0.9:*"))
    assert proxy.routing.allowlist.allows(Address("127.0.0.9", 1))  # trusted is allowed too
    assert not proxy.routing.knows(Address("127.0.0.9", 1))


def test_a_broker_another_worker_learned_is_trusted_here(tmp_path: Path) -> None:
    """--workers: a lookup answered by one worker, the CONNECT on another."""
    url = parse_broker_url(BROKER)
    journal = tmp_path / "routes"
    one = SharedRouting(url, journal, ("127.0.0.0/8",))
    other = SharedRouting(url, journal, ("127.0.0.0/8",))
    named = Address("127.0.0.2", 7777)
    assert other.allowlist.allows(named) and not other.knows(named)
    one.learn(parse_broker_url("pulsar+ssl://127.0.0.2:7777"))
    # Its route (TLS) too, asked for before anything else on a first CONNECT
    # (it was missed: the journal was read only after, and the dial was plain).
    route = other.route(named)
    assert route is not None and route.tls
    assert other.knows(named)  # read from the journal, though a rule already allowed it
    one.close()
    other.close()


def test_a_client_carries_on_through_a_restarted_proxy_without_trust_broker(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """A restarted Sluice has learned no broker yet: the client's producer
    reconnects by looking its topic up again, which teaches it the broker."""
    first = proxy_mode(broker, tmp_path)
    auth = pulsar.AuthenticationToken(hs256_token(SECRET, "app"))
    second: AdminProxy | None = None
    try:
        with client(first.url, authentication=auth) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"before")
            first.kill()
            second = proxy_mode(broker, tmp_path, port=first.proxy.port)
            producer.send(b"after")
        # (A consumer is subscribed afresh: pulsar-lite may drop a connection
        # that takes an exclusive subscription over, whatever the proxy.)
        with client(second.url, authentication=auth) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            assert [consumer.receive(15_000).data() for _ in range(2)] == [b"before", b"after"]
        assert second.metric("sluice_connections_rejected_total", reason="untrusted_broker") == 0
        assert second.proxy.terminate() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert second is not None and "Traceback" not in second.proxy.log()
