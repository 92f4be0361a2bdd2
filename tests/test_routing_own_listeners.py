"""A broker URL naming one of Sluice's own per-broker listeners: given a
listener that stands for itself, every connection to it would dial it again."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from sluice.commands.proxy import settings_again
from sluice.errors import ConfigError
from sluice.protocols.core import OnInvalid
from sluice.protocols.pulsar.connection import PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.dial import TlsClientConfig
from sluice.proxy.ports import BrokerPorts
from sluice.proxy.pulsar import PulsarBackend
from sluice.proxy.shared import PLAIN


def free_span() -> tuple[int, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return port, port


async def test_a_lookup_naming_a_port_of_sluices_own_range_opens_no_listener() -> None:
    span = free_span()
    served: list[Any] = []
    ports = BrokerPorts("127.0.0.1", None, span, None, None, lambda listener, kind: listener)
    ports.serve = lambda listener, upstream, kind: served.append((listener, upstream))
    broker = parse_broker_url("pulsar://127.0.0.1:6650")
    backend = PulsarBackend(
        broker,
        PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5),
        Routing(broker),
        broker_tls=TlsClientConfig(),
        connect_timeout=1.0,
        ports=ports,
    )
    try:
        ours = await backend.listener_urls([f"pulsar://127.0.0.1:{span[0]}"])
        assert ours == {}
        assert served == []
        assert not backend.routing.allowlist.knows(parse_broker_url(f"127.0.0.1:{span[0]}").address)
        # A broker elsewhere still gets its listener (of the range's one port).
        ours = await backend.listener_urls(["pulsar://127.0.0.2:6650"])
        assert ours == {PLAIN: f"pulsar://127.0.0.1:{span[0]}"}
    finally:
        for listener, _ in served:
            await listener.aclose()


def test_a_broker_that_is_sluices_own_listener_is_refused_at_start() -> None:
    """--broker naming Sluice's own listener: every client connection was
    another connection to Sluice, until no descriptor was left."""

    def start(*argv: str) -> object:
        return settings_again(["proxy", *argv])

    for argv in (
        ("--listen", "0.0.0.0:6650", "--broker", "127.0.0.1:6650"),
        ("--listen", "0.0.0.0:6650", "--broker", "localhost:6650"),
        ("--listen", "127.0.0.1:6650", "--broker", "LOCALHOST.:6650"),
        ("--listen", "[::]:6650", "--broker", "[::1]:6650"),
        ("--listen", "10.1.2.3:6650", "--broker", "10.1.2.3:6650"),
        ("--listen", "0.0.0.0:6650", "--advertise-host", "me.example", "--broker",
         "me.example:6650"),
        ("--listen", "127.0.0.1:6650", "--broker", "10.0.0.9:6650", "--http-listen",
         "0.0.0.0:8080", "--broker-http", "http://localhost:8080"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=r"Sluice's own listener .* would dial itself"):
            start(*argv)
    for argv in (
        ("--listen", "0.0.0.0:6650", "--broker", "127.0.0.1:6651"),
        ("--listen", "127.0.0.1:6650", "--broker", "10.0.0.9:6650"),  # another machine
        ("--listen", "10.1.2.3:6650", "--broker", "localhost:6650"),  # another interface
        ("--listen", "127.0.0.1:0", "--broker", "127.0.0.1:6650"),
    ):
        start(*argv)
