"""What a lookup connection answers, held to what Apache Pulsar's brokers and
proxy answer real clients: the CONNECTED Sluice writes itself, the answer
types of the errors it gives itself, a second CONNECT, and the broker URLs
a Connect answer names when Sluice speaks TLS to its brokers. The core is
driven with real encoded frames; no process is started."""

from __future__ import annotations

from sluice.addresses import Address
from sluice.protocols.core import Ask, Close, OpenUpstream, Peer
from sluice.protocols.pulsar import decode_frame, pb
from sluice.protocols.pulsar.connection import Routing, UpstreamFailure
from sluice.protocols.pulsar.encoder import error_reply, own_frame
from sluice.protocols.pulsar.features import BROKERS
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.test_pulsar_core import (
    BROKER,
    T,
    closes,
    connect_body,
    frame_bytes,
    lookup_core,
    lookup_request,
    make,
    sent,
)

LookupResponse = pb.CommandLookupTopicResponse


def test_lookup_connected_says_partitions_can_be_asked_without_creating_the_topic() -> None:
    """Java clients (3.3+) ask PARTITIONED_METADATA with
    metadata_auto_creation_enabled=false only where the CONNECTED says so
    (PIP-344); without the flag they fail such a call as not supported, or
    fall back to asking with auto-creation, which creates the topic. Sluice
    forwards the field as the client wrote it, as Apache Pulsar's proxy does
    (whose CONNECTED sets the flag), where the broker announces it."""
    announced = pb.FeatureFlags(supports_get_partitioned_metadata_without_auto_creation=True)
    BROKERS.learn(BROKER, pb.CommandConnected(server_version="x", feature_flags=announced))
    try:
        core, _ = make()
        (connected,) = sent(core.receive_client(frame_bytes("CONNECT", connect_body()), 0.0),
                            Peer.CLIENT)  # fmt: skip
    finally:
        BROKERS.forget()
    assert connected.name == "CONNECTED"
    flags = connected.body.feature_flags
    assert flags.supports_get_partitioned_metadata_without_auto_creation
    # Topic watchers are not served on a lookup connection: not offered.
    assert not flags.supports_topic_watchers
    # ...and the field reaches the broker as the client set it.
    metadata = pb.CommandPartitionedTopicMetadata(
        topic="persistent://t/n/x", request_id=3, metadata_auto_creation_enabled=False
    )
    (ask,) = core.receive_client(frame_bytes("PARTITIONED_METADATA", metadata), 1.0)
    assert isinstance(ask, Ask)
    assert ask.request[1].HasField("metadata_auto_creation_enabled")
    assert ask.request[1].metadata_auto_creation_enabled is False


def test_a_failed_get_schema_is_answered_as_a_broker_answers_it() -> None:
    """A broker fails GET_SCHEMA with GET_SCHEMA_RESPONSE carrying
    error_code (the C++ and Python clients wait on that answer type); Sluice
    failing one itself (its upstream unreachable) answers the same way."""
    core, _ = lookup_core()
    request = pb.CommandGetSchema(topic="persistent://t/n/s", request_id=11)
    (ask,) = core.receive_client(frame_bytes("GET_SCHEMA", request), 1.0)
    assert isinstance(ask, Ask)
    out = core.answered(ask.token, UpstreamFailure("broker gone", pb.ServiceNotReady), 1.5)
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.name == "GET_SCHEMA_RESPONSE"
    assert answer.body.request_id == 11
    assert answer.body.error_code == pb.ServiceNotReady
    assert "broker gone" in answer.body.error_message
    assert core.routing.lookups == 0


def test_get_or_create_schema_errors_have_their_own_answer_type() -> None:
    """GET_OR_CREATE_SCHEMA (sent by producers) is failed by brokers with
    GET_OR_CREATE_SCHEMA_RESPONSE and error_code; so are Sluice's own
    refusals of it (a lookup connection does not serve it)."""
    core, _ = lookup_core()
    schema = pb.Schema(name="s", schema_data=b"", type=pb.Schema.String)
    request = pb.CommandGetOrCreateSchema(request_id=12, topic="persistent://t/n/s", schema=schema)
    out = core.receive_client(frame_bytes("GET_OR_CREATE_SCHEMA", request), 1.0)
    assert not any(isinstance(a, Ask) for a in out)
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.name == "GET_OR_CREATE_SCHEMA_RESPONSE"
    assert answer.body.request_id == 12 and answer.body.error_code == pb.NotAllowedError
    # error_reply is what fault rules and invalid frames use too.
    frame = own_frame(T("GET_SCHEMA"), pb.CommandGetSchema(topic="t", request_id=4))
    reply = error_reply(frame, pb.TooManyRequests, "slow down")
    assert reply is not None and reply.name == "GET_SCHEMA_RESPONSE"
    assert reply.body.error_code == pb.TooManyRequests and reply.body.request_id == 4


def test_a_second_connect_on_a_lookup_connection_is_refused_not_ignored() -> None:
    """A broker (and Apache Pulsar's proxy) takes one CONNECT per connection
    and hangs up on another; ignored, the client would wait for a CONNECTED
    that never comes."""
    core, _ = lookup_core()
    out = core.receive_client(frame_bytes("CONNECT", connect_body()), 1.0)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "ERROR" and error.body.error == pb.NotAllowedError
    assert closes(out) == ["handshake"] and isinstance(out[-1], Close)


def test_a_tls_sluice_sends_clients_to_the_tls_url_of_a_connect_answer() -> None:
    """With --broker pulsar+ssl://, a Connect answer naming a broker both
    ways is rewritten to name its TLS URL both ways (as Apache Pulsar's
    proxy names the one it connects with), so a client on plain TCP, which
    picks brokerServiceUrl, is never relayed to the broker in the clear."""
    core, _ = lookup_core(routing=Routing(parse_broker_url("pulsar+ssl://127.0.0.1:6651")))
    (ask,) = core.receive_client(lookup_request(request_id=5), 1.0)
    assert isinstance(ask, Ask)
    body = LookupResponse(request_id=1, response=LookupResponse.Connect,
                          brokerServiceUrl="pulsar://10.1.2.3:6650",
                          brokerServiceUrlTls="pulsar+ssl://10.1.2.3:6651")  # fmt: skip
    out = core.answered(ask.token, decode_frame(frame_bytes("LOOKUP_RESPONSE", body)), 1.5)
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.body.request_id == 5
    assert answer.body.brokerServiceUrl == "pulsar+ssl://10.1.2.3:6651"
    assert answer.body.brokerServiceUrlTls == "pulsar+ssl://10.1.2.3:6651"
    # A client (on the same routing) naming the plain port is never dialled in the clear.
    client, _ = make(routing=core.routing)
    connect = connect_body(proxy_to_broker_url="10.1.2.3:6650")
    dialled = client.receive_client(frame_bytes("CONNECT", connect), 2.0)
    assert not any(isinstance(a, OpenUpstream) and not a.tls for a in dialled)
    # The TLS one is dialled over TLS.
    client, _ = make(routing=core.routing)
    connect = connect_body(proxy_to_broker_url="10.1.2.3:6651")
    (opened,) = client.receive_client(frame_bytes("CONNECT", connect), 2.0)
    assert isinstance(opened, OpenUpstream) and opened.tls
    assert opened.address == Address("10.1.2.3", 6651)
