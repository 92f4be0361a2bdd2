"""Which host a broker URL names, as Sluice dials it: a client's
``proxy_to_broker_url`` (and a broker's answer) is checked against the
allow-list by its host, so the host checked must be the host dialled."""

from __future__ import annotations

import pytest

from sluice.addresses import Address, AllowList, parse_address
from sluice.errors import ConfigError
from sluice.protocols.core import Close, Conn, OnInvalid, OpenUpstream, Taps
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url

# The resolver reads a host name as a C string: whatever follows a NUL is
# never looked up, so "127.0.0.1\0.pulsar.svc" is dialled as 127.0.0.1.
CONTROL = ["127.0.0.1\x00.pulsar.svc", "169.254.169.254\x00.pulsar.svc", "b\x07.pulsar.svc"]


@pytest.mark.parametrize("host", CONTROL)
def test_a_host_with_a_control_character_is_no_broker(host: str) -> None:
    with pytest.raises(ConfigError):
        parse_broker_url(f"pulsar://{host}:6650", what="proxy_to_broker_url")
    with pytest.raises(ConfigError):
        parse_address(f"{host}:6650")


def test_a_nul_cannot_take_a_client_past_a_host_glob() -> None:
    routing = Routing(parse_broker_url("pulsar://broker-0.pulsar.svc:6650"), ("*.pulsar.svc",))
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
        routing,
        Taps([]),
    )
    connect = pb.CommandConnect(
        client_version="test", protocol_version=21,
        proxy_to_broker_url="pulsar://127.0.0.1\x00.pulsar.svc:6650",
    )  # fmt: skip
    out = core.receive_client(encode(command(Type.Value("CONNECT"), connect)), 0.0)
    assert not any(isinstance(a, OpenUpstream) for a in out)
    assert [a.reason for a in out if isinstance(a, Close)] == ["relay_refused"]
    # The glob still admits the broker's own names.
    assert AllowList(["*.pulsar.svc"]).allows(Address("broker-1.pulsar.svc", 6650))
