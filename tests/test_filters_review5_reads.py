"""A SEND that comes in the same read as the PRODUCER that opens its
producer: whether a read is filtered is decided when it arrives, from the
producers known then, so a hand-written client that writes PRODUCER and
SEND at once (one TCP segment) had its SEND go on unfiltered."""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from tests.test_filters import WORDS, _core
from tests.test_filters_producers_known import LOUD, OTHER, _filtered, _producer, _send
from tests.test_pulsar_core import names

# The connection's other producer (on TOPIC) is not filtered: only OTHER is.
ONLY_OTHER = FilterSpec(WORDS, topics=("*elsewhere",))


def test_a_send_in_the_read_of_its_producer_is_filtered() -> None:
    core, _ = _core(ONLY_OTHER)
    out = core.receive_client(_producer(5, 9, OTHER) + _send(5, LOUD), 1.0)
    assert names(out, Peer.BROKER) == ["PRODUCER", "SEND"]
    assert _filtered(out, 5)


def test_a_send_in_the_read_that_ends_its_producer_frame_is_filtered() -> None:
    """The PRODUCER's frame begun in one read and ended in the next, with
    the SEND: that read is decided before the PRODUCER is seen too."""
    core, _ = _core(ONLY_OTHER)
    producer = _producer(5, 9, OTHER)
    assert core.receive_client(producer[:7], 1.0) == []
    out = core.receive_client(producer[7:] + _send(5, LOUD), 1.1)
    assert _filtered(out, 5)


def test_a_send_in_a_read_after_its_producer_is_filtered() -> None:
    """What the two above should do, as a read of its own does."""
    core, _ = _core(ONLY_OTHER)
    core.receive_client(_producer(5, 9, OTHER), 1.0)
    assert _filtered(core.receive_client(_send(5, LOUD), 1.1), 5)
