"""The PIP-344 flag of a lookup connection's CONNECTED, through a real
``sluice proxy``, is the broker's own: Apache Pulsar (4.0) announces
``supports_get_partitioned_metadata_without_auto_creation``; pulsar-lite
announces no feature flags at all, as brokers before PIP-344 do, and
Sluice in front of it said yes all the same."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.protocols.pulsar.features import BROKERS
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.pulsar import check_broker
from tests.helpers.support import ProxyProcess, RawClient, start_proxy

pytestmark = pytest.mark.e2e  # starts brokers and proxies


def flag_at(port: int) -> bool:
    """The PIP-344 flag of the CONNECTED that ``port`` answers a CONNECT with."""
    with RawClient(port) as raw:
        connected = raw.connect()
    assert connected.name == "CONNECTED", connected
    flags = connected.body.feature_flags
    return bool(flags.supports_get_partitioned_metadata_without_auto_creation)


def port_of(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    assert port is not None
    return port


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[list[ProxyProcess]]:
    started: list[ProxyProcess] = []
    yield started
    for p in started:
        p.kill()
        assert "Traceback" not in p.log(), p.log()


def test_a_lookup_connection_announces_the_flag_as_the_broker_does(
    any_broker: object, tmp_path: Path, proxies: list[ProxyProcess]
) -> None:
    url = any_broker.url  # type: ignore[attr-defined]
    own = flag_at(port_of(url))
    # What each broker says for itself (a broker before PIP-344 says nothing).
    assert own is isinstance(any_broker, ApachePulsar)
    proxies.append(start_proxy(url, tmp_path))
    # The start check heard the broker before the proxy listened: the first
    # client is told what the broker told it.
    assert flag_at(proxies[-1].port) is own


def test_without_the_start_check_the_flag_is_learned_from_sluices_own_connections(
    apache_pulsar: ApachePulsar, tmp_path: Path, proxies: list[ProxyProcess]
) -> None:
    proxies.append(start_proxy(apache_pulsar.url, tmp_path, "--no-check-broker"))
    # Until it has heard the broker, it says no (the probe at start, or a
    # lookup, is heard within moments).
    deadline = time.monotonic() + 20
    while not flag_at(proxies[-1].port):
        assert time.monotonic() < deadline, "the broker's flag was never learned"
        time.sleep(0.1)


def test_the_start_check_learns_what_the_broker_announces(any_broker: object) -> None:
    """``sluice proxy``'s start check (``sluice.proxy.pulsar.check_broker``)
    records the broker's flags, for the lookup clients served after it."""
    broker = parse_broker_url(any_broker.url)  # type: ignore[attr-defined]
    BROKERS.forget()
    try:
        assert trio.run(check_broker, ProxyConfig(broker)) is None
        flags = BROKERS.of(broker.address)
        assert flags is not None, "the start check learned nothing"
        said = flags.supports_get_partitioned_metadata_without_auto_creation
        assert said is isinstance(any_broker, ApachePulsar)
    finally:
        BROKERS.forget()
