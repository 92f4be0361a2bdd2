"""What each upstream broker announced in its CONNECTED, for the CONNECTED
Sluice writes itself on a lookup connection.

A lookup connection's requests go to the configured broker with the
client's fields as the client wrote them: what Sluice may promise about
them is what that broker promised. Learned from every CONNECTED a
connection of Sluice's own gets (``sluice.proxy.pulsar.connect_broker``:
the start check, the shared lookup connections, the probe), so the start
check's answer holds until Sluice's own connections say otherwise; the
latest word wins. Process-wide: each worker process learns its own.
"""

from __future__ import annotations

from sluice.addresses import Address
from sluice.protocols.pulsar import pb

# How many brokers are remembered (the least recently heard is forgotten
# first): redirects name brokers that come and go.
MAX_BROKERS = 1_024


class Announced:
    """The feature flags each broker announced, by its address."""

    def __init__(self, limit: int = MAX_BROKERS) -> None:
        self.limit = limit
        self._flags: dict[Address, pb.FeatureFlags] = {}

    def learn(self, address: Address, connected: pb.CommandConnected) -> None:
        """``address`` answered a CONNECT with ``connected``."""
        flags = pb.FeatureFlags()
        if connected.HasField("feature_flags"):
            flags.CopyFrom(connected.feature_flags)
        self._flags.pop(address, None)  # heard last: forgotten last
        self._flags[address] = flags
        while len(self._flags) > self.limit:
            del self._flags[next(iter(self._flags))]

    def of(self, address: Address) -> pb.FeatureFlags | None:
        """What ``address`` announced last; None: not heard from."""
        return self._flags.get(address)

    def forget(self) -> None:
        self._flags.clear()

    def __len__(self) -> int:
        return len(self._flags)


BROKERS = Announced()


def lookup_flags(broker: Address) -> pb.FeatureFlags:
    """The feature flags of Sluice's own CONNECTED on a lookup connection
    whose requests go to ``broker``.

    PARTITIONED_METADATA goes upstream with the client's
    metadata_auto_creation_enabled (PIP-344): a Java client told the broker
    honours it asks without creating the topic; one that is not falls back
    (or refuses the call). A broker older than PIP-344 ignores the field and
    creates the topic, so the flag is what the broker announced, and no
    while nothing is known of it. Topic watchers are not served on a lookup
    connection (WATCH_TOPIC_LIST is refused): never offered."""
    known = BROKERS.of(broker)
    return pb.FeatureFlags(
        supports_get_partitioned_metadata_without_auto_creation=(
            known is not None and known.supports_get_partitioned_metadata_without_auto_creation
        )
    )
