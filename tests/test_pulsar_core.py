"""The Pulsar connection core, bytes in and actions out: no sockets, no trio."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.message import Message

from sluice.addresses import Address
from sluice.logs import LogLimit
from sluice.protocols.core import (
    Action,
    Answered,
    AnsweredMany,
    Ask,
    Close,
    Conn,
    Dialed,
    Event,
    Invalid,
    LookupDone,
    OnInvalid,
    Opened,
    OpenUpstream,
    Peer,
    Rejected,
    Send,
    Taps,
)
from sluice.protocols.pulsar import (
    Frame,
    Type,
    command,
    decode_frame,
    decode_stream,
    encode,
    encode_payload,
    pb,
)
from sluice.protocols.pulsar.auth import UpstreamAuth
from sluice.protocols.pulsar.connection import (
    SLUICE_VERSION,
    PulsarConnection,
    PulsarSettings,
    Routing,
    UpstreamFailure,
)
from sluice.protocols.pulsar.urls import parse_broker_url

T = Type.Value
MiB = 1024 * 1024
BROKER = Address("127.0.0.1", 6650)
LookupResponse = pb.CommandLookupTopicResponse


class Recording:
    """A tap that keeps everything it is shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, Frame]] = []
        self.events: list[Event] = []
        self.order: list[str] = []  # frame names and event kinds, as shown

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        self.seen += [(from_client, frame) for frame in frames]
        self.order += [frame.name for frame in frames]

    def event(self, conn: Conn | None, event: Event) -> None:
        self.events.append(event)
        self.order.append(type(event).__name__)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class Exploding:
    """A tap that fails at everything."""

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        raise RuntimeError("tap frames boom")

    def event(self, conn: Conn | None, event: Event) -> None:
        raise RuntimeError("tap event boom")


def make(
    on_invalid: OnInvalid = OnInvalid.REJECT,
    *,
    routing: Routing | None = None,
    tap: Any = None,
) -> tuple[PulsarConnection, Recording]:
    recording = Recording()
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(on_invalid, 5 * MiB, 5),
        routing or Routing(parse_broker_url("pulsar://127.0.0.1:6650")),
        tap if tap is not None else recording,
    )
    return core, recording


def frame_bytes(name: str, body: Message | None = None) -> bytes:
    return encode(command(T(name), body))


def send_frame(
    producer_id: int = 1, sequence_id: int = 0, payload: bytes = b"hello", **kw: Any
) -> bytes:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    return encode_payload(cmd, meta, payload, **kw)


def sent(actions: list[Action], to: Peer) -> list[Frame]:
    """The frames the actions write to ``to``, decoded."""
    data = b"".join(a.data for a in actions if isinstance(a, Send) and a.to is to)
    return decode_stream(data, 64 * MiB)


def names(actions: list[Action], to: Peer) -> list[str]:
    return [f.name for f in sent(actions, to)]


def closes(actions: list[Action]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, Close)]


def connect_body(**kw: Any) -> pb.CommandConnect:
    return pb.CommandConnect(client_version="test-client", protocol_version=21, **kw)


def lookup_core(**kw: Any) -> tuple[PulsarConnection, Recording]:
    core, rec = make(**kw)
    out = core.receive_client(frame_bytes("CONNECT", connect_body()), 0.0)
    assert names(out, Peer.CLIENT) == ["CONNECTED"]
    rec.events.clear()
    rec.order.clear()
    return core, rec


def lookup_request(request_id: int = 7, topic: str = "persistent://t/n/a") -> bytes:
    return frame_bytes("LOOKUP", pb.CommandLookupTopic(topic=topic, request_id=request_id))


def lookup_answer(response: Any, url: str, **kw: Any) -> Frame:
    body = LookupResponse(request_id=1, response=response, brokerServiceUrl=url, **kw)
    return decode_frame(frame_bytes("LOOKUP_RESPONSE", body))


def proxied_core(
    on_invalid: OnInvalid = OnInvalid.REJECT, connected: pb.CommandConnected | None = None
) -> tuple[PulsarConnection, Recording]:
    """A connection relayed to the configured broker, past the handshake."""
    core, rec = make(on_invalid)
    out = core.receive_client(
        frame_bytes("CONNECT", connect_body(proxy_to_broker_url="127.0.0.1:6650")), 0.0
    )
    assert [type(a) for a in out] == [OpenUpstream]
    body = connected or pb.CommandConnected(server_version="broker", protocol_version=21)
    out = core.receive_broker(frame_bytes("CONNECTED", body), 0.5)
    assert names(out, Peer.CLIENT) == ["CONNECTED"]
    assert core.established
    rec.events.clear()
    rec.order.clear()
    return core, rec


def with_producer(core: PulsarConnection, topic: str = "persistent://t/n/p") -> None:
    producer = pb.CommandProducer(topic=topic, producer_id=1, request_id=1)
    assert names(core.receive_client(frame_bytes("PRODUCER", producer), 1.0), Peer.BROKER) == [
        "PRODUCER"
    ]
    ok = pb.CommandProducerSuccess(request_id=1, producer_name="p")
    core.receive_broker(frame_bytes("PRODUCER_SUCCESS", ok), 1.1)


# --- lookup connections ----------------------------------------------------------


def test_lookup_connect_is_answered_without_a_max_message_size() -> None:
    core, rec = make()
    out = core.receive_client(frame_bytes("CONNECT", connect_body()), 0.0)
    assert len(out) == 1 and isinstance(out[0], Send) and out[0].to is Peer.CLIENT
    connected = decode_frame(out[0].data)
    assert connected.name == "CONNECTED" and connected.ok
    # Regression: clients size their chunks by this; only the broker knows it.
    assert not connected.body.HasField("max_message_size")
    assert connected.body.server_version == SLUICE_VERSION
    assert connected.body.protocol_version == 21
    assert core.conn.kind == "lookup" and core.established
    assert rec.of(Opened) and not rec.of(Rejected)


def test_lookup_connection_answers_ping_with_pong() -> None:
    core, _ = lookup_core()
    out = core.receive_client(frame_bytes("PING"), 1.0)
    assert names(out, Peer.CLIENT) == ["PONG"]
    assert names(out, Peer.BROKER) == []


def test_lookup_is_asked_of_the_configured_broker() -> None:
    core, _ = lookup_core()
    out = core.receive_client(lookup_request(request_id=7, topic="persistent://t/n/a"), 1.0)
    assert len(out) == 1 and isinstance(out[0], Ask)
    ask = out[0]
    assert ask.address == BROKER
    type_, body, credentials = ask.request
    assert type_ == T("LOOKUP") and body.topic == "persistent://t/n/a"
    assert credentials is None  # the client's CONNECT carried none
    assert core.routing.lookups == 1


def test_lookups_carry_the_clients_credentials() -> None:
    core, _ = make()
    connect = connect_body(auth_method_name="token", auth_data=b"secret")
    core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    (ask,) = core.receive_client(lookup_request(request_id=7, topic="persistent://t/n/a"), 1.0)
    assert isinstance(ask, Ask)
    assert ask.request[2] == UpstreamAuth("token", b"secret")


def test_redirect_is_followed_and_its_target_learned() -> None:
    core, rec = lookup_core()
    target = Address("10.1.2.3", 6650)
    assert not core.routing.allowlist.allows(target)
    (ask,) = core.receive_client(lookup_request(), 1.0)
    assert isinstance(ask, Ask)
    out = core.answered(
        ask.token, lookup_answer(LookupResponse.Redirect, "pulsar://10.1.2.3:6650"), 1.5
    )
    assert len(out) == 1 and isinstance(out[0], Ask)
    assert out[0].address == target
    assert out[0].request[0] == T("LOOKUP")
    assert core.routing.allowlist.allows(target)
    assert [e.outcome for e in rec.of(LookupDone)] == ["redirected"]
    assert names(out, Peer.CLIENT) == []  # the client hears nothing yet


def test_a_redirect_is_followed_as_sluice_speaks_to_its_brokers() -> None:
    """A redirect names the broker both ways, plain and TLS: it is asked
    again the way Sluice speaks to its configured broker, and learned as
    that URL says. (The plain URL was taken first, whatever the broker:
    with --broker pulsar+ssl:// the lookup went to the plain port.)"""
    body = pb.CommandLookupTopicResponse(
        request_id=1, response=LookupResponse.Redirect,
        brokerServiceUrl="pulsar://10.1.2.3:6650", brokerServiceUrlTls="pulsar+ssl://10.1.2.3:6651",
    )  # fmt: skip
    for configured, port, tls in (("pulsar+ssl://127.0.0.1:6651", 6651, True),
                                  ("pulsar://127.0.0.1:6650", 6650, False)):  # fmt: skip
        core, _ = lookup_core(routing=Routing(parse_broker_url(configured)))
        (ask,) = core.receive_client(lookup_request(), 1.0)
        assert isinstance(ask, Ask)
        (again,) = core.answered(ask.token, decode_frame(frame_bytes("LOOKUP_RESPONSE", body)), 1.5)
        assert isinstance(again, Ask) and again.address == Address("10.1.2.3", port)
        assert core.routing.routes[again.address].tls is tls


def test_only_a_broker_the_upstream_named_teaches_brokers() -> None:
    """A relayed broker's CLOSE_PRODUCER (assignedBrokerServiceUrl) and
    lookup answers name brokers the client is sent to next: learned from
    the configured broker, or one the upstream named. Not from a broker the
    client chose that only --allow-broker admits (its own pod in an allowed
    range): that one could name any host and port (cloud metadata, ssh)
    for any client to be relayed to. (It did.)"""
    routing = Routing(parse_broker_url("pulsar://broker.pulsar.svc:6650"), ("10.0.0.0/8:6650",))
    connected = pb.CommandConnected(server_version="b", protocol_version=21)
    metadata = "pulsar://169.254.169.254:80"
    moved = pb.CommandCloseProducer(producer_id=1, request_id=2, assignedBrokerServiceUrl=metadata)
    answer = pb.CommandLookupTopicResponse(request_id=9, response=LookupResponse.Connect,
                                           brokerServiceUrl="pulsar://127.0.0.1:22")  # fmt: skip

    def relayed_to(url: str) -> PulsarConnection:
        core, _ = make(routing=routing)
        out = core.receive_client(
            frame_bytes("CONNECT", connect_body(proxy_to_broker_url=url)), 0.0
        )
        assert [type(a) for a in out] == [OpenUpstream]
        core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)
        return core

    chosen = relayed_to("10.9.9.9:6650")
    chosen.receive_broker(frame_bytes("CLOSE_PRODUCER", moved), 0.2)
    chosen.receive_broker(frame_bytes("LOOKUP_RESPONSE", answer), 0.3)
    for taught in (Address("169.254.169.254", 80), Address("127.0.0.1", 22)):
        assert not routing.allowlist.allows(taught)
    named = relayed_to("broker.pulsar.svc:6650")
    named.receive_broker(frame_bytes("CLOSE_PRODUCER", moved), 0.2)
    assert routing.allowlist.allows(Address("169.254.169.254", 80))  # the upstream's word


def test_connect_answer_is_rewritten_to_come_back_through_the_proxy() -> None:
    core, rec = lookup_core()
    (ask,) = core.receive_client(lookup_request(request_id=42), 1.0)
    assert isinstance(ask, Ask)
    answer = lookup_answer(LookupResponse.Connect, "pulsar://10.1.2.3:6650", authoritative=False)
    out = core.answered(ask.token, answer, 1.25)
    (response,) = sent(out, Peer.CLIENT)
    assert response.name == "LOOKUP_RESPONSE"
    body = response.body
    assert body.request_id == 42  # the client's, not the proxy's
    assert body.response == LookupResponse.Connect
    assert body.proxy_through_service_url is True
    assert body.authoritative is True
    assert body.brokerServiceUrl == "pulsar://10.1.2.3:6650"
    done = rec.of(LookupDone)
    assert [d.outcome for d in done] == ["answered"]
    assert done[0].total == pytest.approx(0.25)
    assert core.routing.lookups == 0
    assert core.routing.allowlist.allows(Address("10.1.2.3", 6650))


def test_too_many_redirects_fail_the_lookup() -> None:
    core, rec = lookup_core()
    (ask,) = core.receive_client(lookup_request(request_id=9), 1.0)
    assert isinstance(ask, Ask)
    out: list[Action] = [ask]
    hops = 0
    while out and isinstance(out[0], Ask):
        hops += 1
        assert hops < 20, "redirects never stopped"
        redirect = lookup_answer(LookupResponse.Redirect, f"pulsar://10.0.0.{hops}:6650")
        out = core.answered(out[0].token, redirect, 1.0 + hops)
    assert hops == 6  # max_redirects=5 followed, the sixth refused
    (response,) = sent(out, Peer.CLIENT)
    assert response.name == "LOOKUP_RESPONSE"
    assert response.body.response == LookupResponse.Failed
    assert response.body.request_id == 9
    assert response.body.error == pb.ServiceNotReady
    assert rec.of(LookupDone)[-1].outcome == "failed"
    assert core.routing.lookups == 0


def test_lookup_slots_exhausted_answer_too_many_requests() -> None:
    core, rec = lookup_core(routing=Routing(parse_broker_url("pulsar://127.0.0.1:6650"), (), 1))
    first = core.receive_client(lookup_request(request_id=1), 1.0)
    assert [type(a) for a in first] == [Ask]
    second = core.receive_client(lookup_request(request_id=2), 1.0)
    assert not any(isinstance(a, Ask) for a in second)
    (response,) = sent(second, Peer.CLIENT)
    assert response.name == "LOOKUP_RESPONSE" and response.body.request_id == 2
    assert response.body.response == LookupResponse.Failed
    assert response.body.error == pb.TooManyRequests
    assert [d.outcome for d in rec.of(LookupDone)] == ["rejected"]


def test_a_lookup_answered_after_its_connection_closed_gives_its_slot_back() -> None:
    # The client hangs up while its lookup is upstream, and the answer comes
    # before the proxy has released the connection: the proxy-wide slot the
    # lookup held is given back either way, or lookups run out for everyone.
    routing = Routing(parse_broker_url("pulsar://127.0.0.1:6650"), (), 1)
    core, _ = lookup_core(routing=routing)
    (ask,) = core.receive_client(lookup_request(request_id=1), 1.0)
    assert isinstance(ask, Ask) and routing.lookups == 1
    assert closes(core.receive_client(b"", 1.5)) == ["closed"]
    answer = lookup_answer(LookupResponse.Connect, "pulsar://127.0.0.1:6650")
    assert core.answered(ask.token, answer, 2.0) == []
    core.closed("closed")
    assert routing.lookups == 0
    other, _ = lookup_core(routing=routing)
    assert [type(a) for a in other.receive_client(lookup_request(request_id=1), 3.0)] == [Ask]


def test_upstream_failure_answers_with_its_error_code() -> None:
    core, rec = lookup_core()
    (ask,) = core.receive_client(lookup_request(request_id=3), 1.0)
    assert isinstance(ask, Ask)
    out = core.answered(ask.token, UpstreamFailure("no broker", pb.MetadataError), 2.0)
    (response,) = sent(out, Peer.CLIENT)
    assert response.body.response == LookupResponse.Failed
    assert response.body.request_id == 3
    assert response.body.error == pb.MetadataError
    assert response.body.message == "no broker"
    answered = rec.of(Answered)
    assert [(a.request, a.error) for a in answered] == [("LOOKUP", "MetadataError")]
    assert core.routing.lookups == 0


def test_requests_not_served_on_lookup_connections_are_refused() -> None:
    core, _ = lookup_core()
    producer = pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=5)
    out = core.receive_client(frame_bytes("PRODUCER", producer), 1.0)
    assert not any(isinstance(a, Ask) for a in out)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR"
    assert error.body.error == pb.NotAllowedError and error.body.request_id == 5


def test_a_command_ignored_on_a_lookup_connection_is_logged_once_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, _ = lookup_core()
    flow = pb.CommandFlow(consumer_id=1, messagePermits=10)
    with caplog.at_level(logging.DEBUG, logger="sluice"):
        for _ in range(3):
            assert core.receive_client(frame_bytes("FLOW", flow), 1.0) == []
        ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual)
        assert core.receive_client(frame_bytes("ACK", ack), 1.0) == []
    ignored = [r for r in caplog.records if "ignoring" in r.getMessage()]
    assert [(r.levelno, r.getMessage().split("ignoring ")[1].split()[0]) for r in ignored] == [
        (logging.INFO, "FLOW"),
        (logging.DEBUG, "FLOW"),
        (logging.DEBUG, "FLOW"),
        (logging.INFO, "ACK"),
    ]


# --- proxied connections: the handshake ---------------------------------------------


def test_proxied_connect_opens_the_upstream_with_the_clients_connect() -> None:
    core, rec = make()
    body = connect_body(
        proxy_to_broker_url="127.0.0.1:6650", auth_method_name="token", auth_data=b"secret"
    )
    out = core.receive_client(frame_bytes("CONNECT", body), 0.0)
    assert len(out) == 1 and isinstance(out[0], OpenUpstream)
    assert out[0].address == BROKER and out[0].tls is False
    hello = decode_frame(out[0].hello)
    assert hello.name == "CONNECT" and hello.ok
    # Passed through as the client wrote it: a proxy_version would make an
    # authenticating Apache Pulsar refuse the client's own credentials.
    assert not hello.body.HasField("proxy_version")
    assert not hello.body.HasField("proxy_to_broker_url")
    assert hello.body.auth_method_name == "token" and hello.body.auth_data == b"secret"
    assert core.conn.kind == "proxied" and not core.established and core.upstream_pending
    assert core.conn.broker == "127.0.0.1:6650"
    assert rec.of(Opened) and not rec.of(Rejected)


@pytest.mark.parametrize("target", ["10.9.9.9:6650", "169.254.169.254:80"])
def test_proxied_connect_to_a_broker_not_allowed_is_refused(target: str) -> None:
    core, rec = make()
    out = core.receive_client(frame_bytes("CONNECT", connect_body(proxy_to_broker_url=target)), 0.0)
    assert not any(isinstance(a, OpenUpstream) for a in out)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.ServiceNotReady
    assert closes(out) == ["relay_refused"]
    assert isinstance(out[-1], Close)
    assert [r.reason for r in rec.of(Rejected)] == ["relay_refused"]


def test_broker_connected_establishes_and_releases_what_the_client_sent_early() -> None:
    core, rec = make()
    core.receive_client(
        frame_bytes("CONNECT", connect_body(proxy_to_broker_url="127.0.0.1:6650")), 0.0
    )
    producer = frame_bytes(
        "PRODUCER", pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=1)
    )
    assert core.receive_client(producer, 0.1) == []  # held until CONNECTED
    connected = frame_bytes("CONNECTED", pb.CommandConnected(server_version="b"))
    out = core.receive_broker(connected, 0.5)
    assert out == [Send(Peer.CLIENT, connected), Send(Peer.BROKER, producer)]
    assert core.established
    assert [d.seconds for d in rec.of(Dialed)] == [pytest.approx(0.5)]


def test_a_client_that_sends_on_and_on_before_connected_is_told_and_closed() -> None:
    # Clients wait for CONNECTED; what one sends before it waits in the
    # decoder until the broker answers (which a hung broker never does
    # before the handshake timeout). That wait is bounded.
    core, rec = make()
    core.receive_client(
        frame_bytes("CONNECT", connect_body(proxy_to_broker_url="127.0.0.1:6650")), 0.0
    )
    chunk = send_frame(payload=b"x" * (4 * MiB))
    out: list[Action] = []
    sent_bytes = 0
    while not closes(out) and sent_bytes < 256 * MiB:
        out = core.receive_client(chunk, 0.1)
        sent_bytes += len(chunk)
    assert closes(out) == ["handshake"]
    assert 64 * MiB < sent_bytes <= 64 * MiB + len(chunk)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and "before its CONNECT was answered" in error.body.message
    assert [r.reason for r in rec.of(Rejected)] == ["handshake"]
    # The broker's late CONNECTED finds the connection closed.
    connected = frame_bytes("CONNECTED", pb.CommandConnected(server_version="b"))
    assert core.receive_broker(connected, 0.5) == []


def test_broker_max_message_size_raises_the_frame_limit() -> None:
    big = send_frame(payload=b"x" * (6 * MiB), max_message_size=16 * MiB)
    connected = pb.CommandConnected(server_version="b", max_message_size=8 * MiB)
    core, rec = proxied_core(connected=connected)
    out = core.receive_client(big, 1.0)
    assert out == [Send(Peer.BROKER, big)]
    assert not rec.of(Invalid)


def test_without_a_broker_limit_a_frame_over_5_mib_loses_framing() -> None:
    big = send_frame(payload=b"x" * (6 * MiB), max_message_size=16 * MiB)
    core, rec = proxied_core()
    out = core.receive_client(big, 1.0)
    assert closes(out) == ["unframeable"]
    assert names(out, Peer.BROKER) == []
    assert [i.fatal for i in rec.of(Invalid)] == [True]


def test_auth_challenge_is_relayed_and_the_answer_forwarded() -> None:
    core, _ = make()
    core.receive_client(
        frame_bytes("CONNECT", connect_body(proxy_to_broker_url="127.0.0.1:6650")), 0.0
    )
    challenge = frame_bytes(
        "AUTH_CHALLENGE",
        pb.CommandAuthChallenge(challenge=pb.AuthData(auth_method_name="token", auth_data=b"?")),
    )
    assert core.receive_broker(challenge, 0.1) == [Send(Peer.CLIENT, challenge)]
    response = frame_bytes(
        "AUTH_RESPONSE",
        pb.CommandAuthResponse(response=pb.AuthData(auth_method_name="token", auth_data=b"!")),
    )
    assert core.receive_client(response, 0.2) == [Send(Peer.BROKER, response)]
    connected = frame_bytes("CONNECTED", pb.CommandConnected(server_version="b"))
    assert core.receive_broker(connected, 0.3) == [Send(Peer.CLIENT, connected)]
    assert core.established


def test_broker_error_during_handshake_is_forwarded_then_closes() -> None:
    core, rec = make()
    core.receive_client(
        frame_bytes("CONNECT", connect_body(proxy_to_broker_url="127.0.0.1:6650")), 0.0
    )
    refusal = frame_bytes(
        "ERROR",
        pb.CommandError(request_id=2**64 - 1, error=pb.AuthenticationError, message="who?"),
    )
    out = core.receive_broker(refusal, 0.1)
    assert out[0] == Send(Peer.CLIENT, refusal)
    assert closes(out) == ["upstream"] and isinstance(out[-1], Close)
    assert [d.seconds for d in rec.of(Dialed)] == [None]
    assert not core.established


# --- proxied connections: relaying --------------------------------------------------


def test_valid_frames_are_forwarded_as_the_identical_read() -> None:
    core, _ = proxied_core()
    with_producer(core)
    data = send_frame(sequence_id=1) + send_frame(sequence_id=2)
    out = core.receive_client(data, 2.0)
    assert out == [Send(Peer.BROKER, data)]
    assert core.in_flight_sends == 2


def test_bad_checksum_is_answered_under_reject() -> None:
    core, rec = proxied_core(OnInvalid.REJECT)
    with_producer(core)
    bad = bytearray(send_frame(sequence_id=4))
    bad[-1] ^= 1
    out = core.receive_client(bytes(bad), 2.0)
    assert names(out, Peer.BROKER) == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR"
    assert error.body.error == pb.ChecksumError and error.body.sequence_id == 4
    assert [(i.problem, i.fatal) for i in rec.of(Invalid)] == [("checksum", False)]
    assert closes(out) == []


def test_taps_see_an_invalid_frame_and_its_answer_where_they_were_in_the_read() -> None:
    """A read's frames reach the taps at once, after the read; an invalid
    frame's Invalid event and answer come right after it, in order."""
    core, rec = proxied_core(OnInvalid.REJECT)
    with_producer(core)
    rec.order.clear()
    bad = bytearray(send_frame(sequence_id=2))
    bad[-1] ^= 1
    out = core.receive_client(
        send_frame(sequence_id=1) + bytes(bad) + send_frame(sequence_id=3), 2.0
    )
    assert [f.body.sequence_id for f in sent(out, Peer.BROKER)] == [1, 3]
    assert rec.order == ["SEND", "SEND", "Invalid", "SEND_ERROR", "SEND", "TopicTraffic"]
    # A read that loses its framing: the frames before it, then the event.
    rec.order.clear()
    oversized = (64 * MiB).to_bytes(4, "big") + bytes(4)
    out = core.receive_client(send_frame(sequence_id=4) + oversized, 3.0)
    assert closes(out) == ["unframeable"]
    assert rec.order == ["SEND", "Invalid", "TopicTraffic"]


def test_taps_see_an_answer_after_the_frame_it_timed() -> None:
    core, rec = proxied_core()
    producer = pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=1)
    core.receive_client(frame_bytes("PRODUCER", producer), 1.0)
    ok = pb.CommandProducerSuccess(request_id=1, producer_name="p")
    core.receive_broker(frame_bytes("PING") + frame_bytes("PRODUCER_SUCCESS", ok)
                        + frame_bytes("PING"), 1.5)  # fmt: skip
    assert rec.order == ["PRODUCER", "PING", "PRODUCER_SUCCESS", "Answered", "PING"]


def test_bad_checksum_is_passed_on_under_forward() -> None:
    core, rec = proxied_core(OnInvalid.FORWARD)
    with_producer(core)
    bad = bytearray(send_frame(sequence_id=4))
    bad[-1] ^= 1
    out = core.receive_client(bytes(bad), 2.0)
    assert out == [Send(Peer.BROKER, bytes(bad))]
    assert [(i.problem, i.from_client) for i in rec.of(Invalid)] == [("checksum", True)]


def test_stream_ending_mid_frame_is_unframeable() -> None:
    core, rec = proxied_core()
    whole = frame_bytes("PING")
    partial = send_frame()[:-3]
    out = core.receive_client(whole + partial, 1.0)
    assert out == [Send(Peer.BROKER, whole)]  # the complete frame goes on
    out = core.receive_client(b"", 2.0)
    assert closes(out) == ["unframeable"]
    assert names(out, Peer.BROKER) == []
    (invalid,) = rec.of(Invalid)
    assert invalid.fatal and invalid.problem == "truncated" and invalid.from_client


def test_send_and_receipt_are_correlated_with_the_topic() -> None:
    core, rec = proxied_core()
    with_producer(core, "persistent://t/n/orders")
    assert [a.request for a in rec.of(Answered)] == ["PRODUCER"]
    core.receive_client(send_frame(sequence_id=5), 2.0)
    core.receive_client(send_frame(sequence_id=6) + send_frame(sequence_id=7), 2.25)
    assert core.in_flight_sends == 3
    receipt = frame_bytes("SEND_RECEIPT", pb.CommandSendReceipt(producer_id=1, sequence_id=5))
    out = core.receive_broker(receipt, 2.5)
    assert out == [Send(Peer.CLIENT, receipt)]
    (send,) = rec.of(AnsweredMany)
    assert send.request == "SEND" and send.topic == "persistent://t/n/orders"
    assert send.seconds == [pytest.approx(0.5)]
    assert core.in_flight_sends == 2
    # The receipts of one read: one event, a time each, in order.
    receipts = b"".join(
        frame_bytes("SEND_RECEIPT", pb.CommandSendReceipt(producer_id=1, sequence_id=seq))
        for seq in (7, 6, 99)  # 99 was never sent: not timed
    )
    core.receive_broker(receipts, 3.0)
    assert len(rec.of(AnsweredMany)) == 2
    assert rec.of(AnsweredMany)[-1].seconds == [pytest.approx(0.75)] * 2
    assert core.in_flight_sends == 0
    assert [a.request for a in rec.of(Answered)] == ["PRODUCER"]  # none for a SEND


def test_sends_of_a_producer_the_broker_closed_are_not_waited_for() -> None:
    # A broker unloading a topic closes the producer and answers none of
    # its SENDs in flight; the client sends them again once it has the
    # producer back. The drain waits for none of the first tries, and the
    # receipts time the second.
    core, rec = proxied_core()
    with_producer(core, "persistent://t/n/orders")
    core.receive_client(send_frame(sequence_id=5) + send_frame(sequence_id=6), 2.0)
    assert core.in_flight_sends == 2
    close = pb.CommandCloseProducer(producer_id=1, request_id=2**64 - 1)
    out = core.receive_broker(frame_bytes("CLOSE_PRODUCER", close), 3.0)
    assert names(out, Peer.CLIENT) == ["CLOSE_PRODUCER"]
    assert core.in_flight_sends == 0
    assert core.drain() == []  # nothing left to close
    producer = pb.CommandProducer(topic="persistent://t/n/orders", producer_id=1, request_id=3)
    core.receive_client(frame_bytes("PRODUCER", producer), 4.0)
    ok = pb.CommandProducerSuccess(request_id=3, producer_name="p")
    core.receive_broker(frame_bytes("PRODUCER_SUCCESS", ok), 4.1)
    core.receive_client(send_frame(sequence_id=5) + send_frame(sequence_id=6), 5.0)
    receipts = b"".join(
        frame_bytes("SEND_RECEIPT", pb.CommandSendReceipt(producer_id=1, sequence_id=seq))
        for seq in (5, 6)
    )
    core.receive_broker(receipts, 5.5)
    (times,) = rec.of(AnsweredMany)
    assert times.seconds == [pytest.approx(0.5)] * 2
    assert core.in_flight_sends == 0


def test_drain_closes_the_clients_producers_and_consumers() -> None:
    core, _ = proxied_core()
    assert core.drain() == []
    with_producer(core)
    subscribe = pb.CommandSubscribe(
        topic="persistent://t/n/s",
        subscription="sub",
        subType=pb.CommandSubscribe.Shared,
        consumer_id=8,
        request_id=2,
    )
    core.receive_client(frame_bytes("SUBSCRIBE", subscribe), 1.0)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=2)), 1.1)
    out = core.drain()
    assert names(out, Peer.BROKER) == []
    frames = sent(out, Peer.CLIENT)
    assert [f.name for f in frames] == ["CLOSE_PRODUCER", "CLOSE_CONSUMER"]
    assert frames[0].body.producer_id == 1 and frames[1].body.consumer_id == 8


# --- keepalive and taps ---------------------------------------------------------


def test_keepalive_pings_an_idle_lookup_client_then_hangs_up() -> None:
    core, _ = lookup_core()  # last heard at 0
    assert core.keepalive(10.0, 30.0) == []
    assert names(core.keepalive(30.0, 30.0), Peer.CLIENT) == ["PING"]
    core.receive_client(frame_bytes("PONG"), 45.0)
    assert names(core.keepalive(60.0, 30.0), Peer.CLIENT) == []  # heard 15 s ago
    assert names(core.keepalive(90.0, 30.0), Peer.CLIENT) == ["PING"]
    out = core.keepalive(105.0, 30.0)
    assert out == [Close("idle", "client silent for 60s, closing")]


def test_keepalive_leaves_proxied_connections_alone() -> None:
    core, _ = proxied_core()
    assert core.keepalive(1000.0, 30.0) == []


def test_a_failing_tap_never_stops_traffic() -> None:
    recording = Recording()
    taps = Taps([Exploding(), recording])
    core, _ = make(tap=taps)
    out = core.receive_client(frame_bytes("CONNECT", connect_body()), 0.0)
    assert names(out, Peer.CLIENT) == ["CONNECTED"]
    out = core.receive_client(frame_bytes("PING"), 1.0)
    assert names(out, Peer.CLIENT) == ["PONG"]
    assert taps.failures > 0
    # The tap after the failing one still sees everything.
    assert [f.name for _, f in recording.seen] == ["CONNECT", "CONNECTED", "PING", "PONG"]
    assert taps.failures == len(recording.seen) + len(recording.events)


# --- bad input, answered and logged with a limit ----------------------------------


def garbled_connect(field: int, value: bytes = b"\xff\xfe127.0.0.1:6650") -> bytes:
    """A CONNECT whose text field number ``field`` is not UTF-8 (the
    protobuf library will not write one, so its bytes are appended)."""
    body = pb.CommandConnect()
    body.ParseFromString(
        connect_body().SerializeToString() + bytes([field << 3 | 2, len(value)]) + value
    )
    return frame_bytes("CONNECT", body)


@pytest.mark.parametrize("field", [6, 5, 1], ids=["proxy_to_broker_url", "method", "version"])
def test_a_connect_with_text_that_is_not_utf8_is_refused_not_raised(field: int) -> None:
    routing = Routing(parse_broker_url("pulsar://127.0.0.1:6650"))
    core, rec = make(routing=routing)
    out = core.receive_client(garbled_connect(field), 0.0)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.NotAllowedError
    assert "is not UTF-8" in error.body.message
    (close,) = [a for a in out if isinstance(a, Close)]
    assert close.reason == "handshake" and close.level == logging.WARNING
    assert rec.of(Rejected) == [Rejected("handshake")]
    assert not [a for a in out if isinstance(a, OpenUpstream)]
    assert isinstance(core.conn.broker, str)
    # Anyone can repeat it: the next ones within a minute log at debug.
    again, _ = make(routing=routing)
    (close,) = [
        a for a in again.receive_client(garbled_connect(field), 30.0) if isinstance(a, Close)
    ]
    assert close.level == logging.DEBUG


def test_warnings_are_limited_per_key_and_in_all() -> None:
    limit = LogLimit(interval=60.0, burst=3)
    assert limit.level("a", 0.0) == logging.WARNING
    assert limit.level("a", 59.0) == logging.DEBUG
    assert limit.level("a", 60.0) == logging.WARNING  # the first of a new minute
    assert [limit.level(k, 61.0) for k in "bcd"] == [
        logging.WARNING,
        logging.WARNING,
        logging.DEBUG,
    ]
    assert limit.level("e", 121.0) == logging.WARNING  # a new minute
