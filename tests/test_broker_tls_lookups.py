"""With --broker pulsar+ssl://, brokers that lookup answers name are dialled
over TLS too: an answer naming a broker only by its plain URL is not
followed in the clear (Sluice's credential would cross the network
unencrypted), as the Java client, on TLS, does not follow it either."""

from __future__ import annotations

from pathlib import Path

from sluice.addresses import Address
from sluice.protocols.core import Ask, Send
from sluice.protocols.pulsar import decode_frame, pb
from sluice.protocols.pulsar.connection import Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.test_pulsar_core import frame_bytes, lookup_core, lookup_request

LookupResponse = pb.CommandLookupTopicResponse


def test_a_redirect_to_a_plain_url_only_is_not_followed_in_the_clear() -> None:
    core, _ = lookup_core(routing=Routing(parse_broker_url("pulsar+ssl://127.0.0.1:6651")))
    (ask,) = core.receive_client(lookup_request(), 1.0)
    assert isinstance(ask, Ask)
    body = LookupResponse(request_id=1, response=LookupResponse.Redirect,
                          brokerServiceUrl="pulsar://10.1.2.3:6650")  # fmt: skip
    out = core.answered(ask.token, decode_frame(frame_bytes("LOOKUP_RESPONSE", body)), 1.5)
    plain = Address("10.1.2.3", 6650)
    assert not any(isinstance(a, Ask) and a.address == plain for a in out)
    route = core.routing.routes.get(plain)
    assert route is None or route.tls
    # The client's lookup fails, saying why (it retries, as on any failure).
    (told,) = out
    assert isinstance(told, Send) and b"names no TLS URL" in told.data


def test_an_answer_naming_a_tls_url_is_followed_over_tls() -> None:
    core, _ = lookup_core(routing=Routing(parse_broker_url("pulsar+ssl://127.0.0.1:6651")))
    (ask,) = core.receive_client(lookup_request(), 1.0)
    assert isinstance(ask, Ask)
    body = LookupResponse(request_id=1, response=LookupResponse.Redirect,
                          brokerServiceUrl="pulsar://10.1.2.3:6650",
                          brokerServiceUrlTls="pulsar+ssl://10.1.2.3:6651")  # fmt: skip
    out = core.answered(ask.token, decode_frame(frame_bytes("LOOKUP_RESPONSE", body)), 1.5)
    (again,) = [a for a in out if isinstance(a, Ask)]
    assert again.address == Address("10.1.2.3", 6651)
    assert core.routing.routes[Address("10.1.2.3", 6651)].tls


def test_an_http_lookup_naming_a_plain_url_only_gets_no_listener_of_a_tls_sluice(
    tmp_path: Path,
) -> None:
    """The HTTP lookup's rewrite: with a TLS broker, a broker named only by
    its plain URL gets no listener (nothing dials it in the clear); the
    answer stays as the broker wrote it."""
    import trio

    from sluice.protocols.core import OnInvalid
    from sluice.protocols.pulsar.connection import PulsarSettings
    from sluice.proxy.dial import TlsClientConfig
    from sluice.proxy.ports import BrokerPorts
    from sluice.proxy.pulsar import PulsarBackend

    async def main() -> None:
        ports = BrokerPorts("127.0.0.1", None, None, None, None, lambda lis, kind: lis)
        opened: list[object] = []
        ports.serve = lambda listener, upstream, kind: opened.append(listener)
        broker = parse_broker_url("pulsar+ssl://127.0.0.1:6651")
        routing = Routing(broker)
        backend = PulsarBackend(
            broker,
            PulsarSettings(OnInvalid.REJECT, 5 << 20, 5),
            routing,
            broker_tls=TlsClientConfig(),
            connect_timeout=5,
            ports=ports,
        )
        assert await backend.listener_urls(["pulsar://10.1.2.3:6650"]) == {}
        assert opened == [] and Address("10.1.2.3", 6650) not in routing.routes

    trio.run(main)


def test_a_tls_sluice_learns_no_plain_url_a_relayed_broker_names() -> None:
    """With a TLS --broker, a broker's CLOSE_PRODUCER naming where the
    topic went (assignedBrokerServiceUrl and its TLS twin) taught Sluice the
    plain URL as a plain route: a client then sent there was relayed in the
    clear (with Sluice's own credential, in proxy mode)."""
    from sluice.protocols.core import OpenUpstream
    from tests.test_pulsar_core import connect_body, make

    routing = Routing(parse_broker_url("pulsar+ssl://broker.pulsar.svc:6651"))
    core, _ = make(routing=routing)
    hello = connect_body(proxy_to_broker_url="broker.pulsar.svc:6651")
    assert [type(a) for a in core.receive_client(frame_bytes("CONNECT", hello), 0.0)] == [
        OpenUpstream
    ]
    connected = pb.CommandConnected(server_version="b", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)
    moved = pb.CommandCloseProducer(
        producer_id=1, request_id=2, assignedBrokerServiceUrl="pulsar://10.1.2.3:6650",
        assignedBrokerServiceUrlTls="pulsar+ssl://10.1.2.3:6651",
    )  # fmt: skip
    core.receive_broker(frame_bytes("CLOSE_PRODUCER", moved), 0.2)
    assert routing.allowlist.allows(Address("10.1.2.3", 6651))
    assert routing.routes[Address("10.1.2.3", 6651)].tls
    assert not routing.allowlist.allows(Address("10.1.2.3", 6650))
