"""The PIP-344 flag (``supports_get_partitioned_metadata_without_auto_creation``)
of the CONNECTED Sluice writes itself on a lookup connection says what the
upstream broker announced to Sluice, not always yes.

PARTITIONED_METADATA goes upstream with the client's
metadata_auto_creation_enabled; a broker older than PIP-344 ignores the
field and creates the topic. Told yes, a Java client asks "without
creating" and the topic is created all the same; told no, it falls back as
it does with such a broker. Sluice learns the flags from the CONNECTED its
own connections get (the start check, the shared lookup connections, the
probe); until it knows the broker's, it says no. The core is driven with
real encoded frames; no process is started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.addresses import Address
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.connection import Routing
from sluice.protocols.pulsar.features import BROKERS
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.test_pulsar_core import BROKER, connect_body, frame_bytes, make, sent

OTHER = Address("127.0.0.1", 6651)


@pytest.fixture(autouse=True)
def nothing_learned() -> Iterator[None]:
    """The record is the process's: each test starts and ends with it empty."""
    BROKERS.forget()
    yield
    BROKERS.forget()


def connected_of_broker(supports: bool | None) -> pb.CommandConnected:
    """A broker's CONNECTED: ``supports`` None: one that names no feature
    flags at all (brokers before 2.11, pulsar-lite)."""
    body = pb.CommandConnected(server_version="Pulsar Server", protocol_version=21)
    if supports is not None:
        body.feature_flags.supports_get_partitioned_metadata_without_auto_creation = supports
        body.feature_flags.supports_topic_watchers = True
    return body


def announced(routing: Routing | None = None) -> pb.FeatureFlags:
    """The feature flags of the CONNECTED a lookup connection gets."""
    core, _ = make(routing=routing)
    (connected,) = sent(core.receive_client(frame_bytes("CONNECT", connect_body()), 0.0),
                        Peer.CLIENT)  # fmt: skip
    assert connected.name == "CONNECTED"
    flags: pb.FeatureFlags = connected.body.feature_flags
    return flags


def test_a_broker_that_announced_the_flag_has_it_announced_to_clients() -> None:
    BROKERS.learn(BROKER, connected_of_broker(True))
    flags = announced()
    assert flags.supports_get_partitioned_metadata_without_auto_creation is True
    # Topic watchers are not served on a lookup connection: never offered,
    # whatever the broker offers.
    assert flags.supports_topic_watchers is False


@pytest.mark.parametrize("supports", [False, None], ids=["flag-false", "no-flags"])
def test_a_broker_older_than_pip_344_has_the_flag_announced_false(supports: bool | None) -> None:
    BROKERS.learn(BROKER, connected_of_broker(supports))
    assert announced().supports_get_partitioned_metadata_without_auto_creation is False


def test_nothing_known_of_the_broker_announces_false() -> None:
    """The safe side: Java clients then fall back, as with an old broker."""
    assert announced().supports_get_partitioned_metadata_without_auto_creation is False


def test_only_the_broker_lookups_go_to_counts() -> None:
    BROKERS.learn(OTHER, connected_of_broker(True))
    assert announced().supports_get_partitioned_metadata_without_auto_creation is False
    routing = Routing(parse_broker_url(f"pulsar://{OTHER}"))
    assert announced(routing).supports_get_partitioned_metadata_without_auto_creation is True


def test_the_latest_announcement_wins() -> None:
    """A broker rolled back to a release before PIP-344 (or upgraded) is
    described by what it said last."""
    BROKERS.learn(BROKER, connected_of_broker(True))
    BROKERS.learn(BROKER, connected_of_broker(None))
    assert announced().supports_get_partitioned_metadata_without_auto_creation is False
    BROKERS.learn(BROKER, connected_of_broker(True))
    assert announced().supports_get_partitioned_metadata_without_auto_creation is True


def test_the_record_keeps_a_bounded_number_of_brokers() -> None:
    """Brokers come and go (redirect targets): the record does not grow for ever,
    and the one learned last is kept."""
    for port in range(1, BROKERS.limit + 50):
        BROKERS.learn(Address("10.0.0.1", port), connected_of_broker(True))
    BROKERS.learn(BROKER, connected_of_broker(True))
    assert len(BROKERS) == BROKERS.limit
    assert announced().supports_get_partitioned_metadata_without_auto_creation is True
