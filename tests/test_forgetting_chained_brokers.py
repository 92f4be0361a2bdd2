"""A connection chained through an upstream proxy (a lookup answer said
``proxy_through_service_url``) keeps the broker it is chained to from being
forgotten, as a direct one keeps its broker. Sans-I/O on the cores' clock."""

from __future__ import annotations

from sluice.addresses import Address, AllowList
from sluice.protocols.core import Ask, Conn, OnInvalid, OpenUpstream
from sluice.protocols.pulsar import command, decode_frame, encode, pb
from sluice.protocols.pulsar.connection import (
    FORGET_AFTER,
    PulsarConnection,
    PulsarSettings,
    Routing,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.test_pulsar_core import Recording

T = pb.BaseCommand
LookupResponse = pb.CommandLookupTopicResponse
BROKER = "pulsar://127.0.0.1:6650"
BEHIND = Address("10.1.2.3", 6650)


def _core(routing: Routing) -> PulsarConnection:
    settings = PulsarSettings(OnInvalid.REJECT, 5 << 20, 5)
    return PulsarConnection(Conn(1, "127.0.0.1:5000", "plain", "pulsar"), settings, routing,
                            Recording())  # fmt: skip


def _connect(proxy_to: str | None = None) -> bytes:
    body = pb.CommandConnect(client_version="test", protocol_version=21)
    if proxy_to is not None:
        body.proxy_to_broker_url = proxy_to
    return encode(command(T.CONNECT, body))


def _chained_lookup(routing: Routing, now: float) -> None:
    """A lookup the upstream (a proxy) answers naming BEHIND, to be reached through it."""
    core = _core(routing)
    core.receive_client(_connect(), now)
    lookup = pb.CommandLookupTopic(topic="persistent://t/n/a", request_id=7)
    (ask,) = core.receive_client(encode(command(T.LOOKUP, lookup)), now)
    assert isinstance(ask, Ask)
    answer = LookupResponse(
        request_id=1,
        response=LookupResponse.Connect,
        brokerServiceUrl=f"pulsar://{BEHIND}",
        proxy_through_service_url=True,
    )
    core.answered(ask.token, decode_frame(encode(command(T.LOOKUP_RESPONSE, answer))), now)
    core.closed("done")


def test_a_chained_connection_keeps_the_broker_it_is_chained_to() -> None:
    routing = Routing(parse_broker_url(BROKER))
    _chained_lookup(routing, 0.0)
    route = routing.routes[BEHIND]
    assert route.via_upstream
    core = _core(routing)
    out = core.receive_client(_connect(str(BEHIND)), 1.0)
    (dial,) = [a for a in out if isinstance(a, OpenUpstream)]
    assert dial.address == routing.broker.address  # through the upstream proxy
    # Open for hours, no answer naming BEHIND since: it is kept.
    late = 3 * FORGET_AFTER
    assert routing.expire(late, AllowList()) == []
    assert routing.allowlist.allows(BEHIND) and routing.routes.get(BEHIND) == route
    # Closed: forgotten at the next sweep.
    core.closed("done")
    assert routing.expire(late + 60, AllowList()) == [BEHIND]
    assert not routing.allowlist.allows(BEHIND)
