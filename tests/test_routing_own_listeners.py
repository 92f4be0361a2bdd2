"""A broker URL naming one of Sluice's own per-broker listeners: given a
listener that stands for itself, every connection to it would dial it again."""

from __future__ import annotations

import socket
from typing import Any

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
