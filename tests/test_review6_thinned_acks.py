"""Review of 6d89a9a (a consumer's ACKs of a batch a deliver filter thinned,
renumbered for the broker): cases it leaves wrong.

Facts from Apache Pulsar: the broker's MESSAGE carries the partition index
of the topic it delivers from (``Commands.newMessageCommand`` sets
``partition``: 3 for ``...-partition-3``); the Java client's ACKs set only
ledger and entry (and ack set, batch size): their ``partition`` is absent,
-1 by the proto's default."""

from __future__ import annotations

from typing import Any

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.connection import PulsarConnection
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import WORDS, _batch, _core, _message_frame
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _delivered(core: PulsarConnection, partition: int | None = None) -> None:
    """Entry 7 delivered to consumer 2 thinned: index 0 of 3 left out."""
    if partition is None:
        core.receive_broker(_message_frame([b"skip me", b"first", b"second"]), 1.0)
        return
    meta, data = _batch([b"skip me", b"first", b"second"], pb.ZSTD)
    mid = pb.MessageIdData(ledgerId=1, entryId=7, partition=partition)
    body = pb.CommandMessage(consumer_id=2, message_id=mid)
    core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.0)


def _acks(core: PulsarConnection, *ids: pb.MessageIdData, now: float = 1.1) -> list[Any]:
    """The message ids of the ACKs the broker got for the client's ACK."""
    ack = pb.CommandAck(consumer_id=2, ack_type=pb.CommandAck.Individual, message_id=ids)
    out = sent(core.receive_client(frame_bytes("ACK", ack), now), Peer.BROKER)
    return [m for f in out if f.type == T.ACK for m in f.body.message_id]


def test_an_ack_on_a_partitioned_topic_is_renumbered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    _delivered(core, partition=3)
    # The consumer acknowledges "second" (its index 1 of 2) as Java's client
    # does: ledger, entry and ack set, no partition.
    (told,) = _acks(core, pb.MessageIdData(ledgerId=1, entryId=7, ack_set=[0b01]))
    # In the broker's numbering: "first" (1) unacknowledged, "second" (2) not.
    assert list(told.ack_set) == [0b010]


def test_an_ack_of_an_index_never_delivered_acknowledges_no_delivered_message() -> None:
    core, _ = _core(FilterSpec(WORDS))
    _delivered(core)
    # The consumer got 2 messages (its 0 and 1): index 2 is none of them.
    told = _acks(core, pb.MessageIdData(ledgerId=1, entryId=7, batch_index=2, batch_size=2))
    # Broker's index 2 is "second", delivered as the consumer's 1, unacknowledged.
    assert all(not (m.entryId == 7 and m.batch_index == 2) for m in told), told
    # And the entry is still renumbered: the consumer's 1 is the broker's 2.
    (again,) = _acks(
        core, pb.MessageIdData(ledgerId=1, entryId=7, batch_index=1, batch_size=2), now=1.2
    )
    assert again.batch_index == 2


def test_a_closed_consumer_leaves_the_clients_reads_unfiltered() -> None:
    core, _ = _core(FilterSpec(WORDS, direction="deliver"))
    _delivered(core)
    assert core._filtered(True)  # an ACK of entry 7 is to be renumbered
    close = pb.CommandCloseConsumer(consumer_id=2, request_id=9)
    core.receive_client(frame_bytes("CLOSE_CONSUMER", close), 1.1)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=9)), 1.2)
    assert 2 not in core.correlator.consumers
    # No consumer is left whose ACKs need renumbering: the client's reads
    # (PINGs, SENDs of unfiltered producers) may take the compiled path again.
    assert not core._filtered(True)
