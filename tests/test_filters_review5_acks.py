"""A delivered batch with entries a deliver filter left out is renumbered:
the consumer numbers the entries it got 0, 1, ... and acknowledges them by
those numbers. With batch index acknowledgement (the Java client's
``enableBatchIndexAcknowledgment``, the broker's
``acknowledgmentAtBatchIndexLevelEnabled``) an ACK carries an ack set in
the consumer's numbering, which the broker reads in the batch's own: it
was forwarded as it came, so acknowledging one message acknowledged
another the consumer never did (lost to it: a redelivery skips it)."""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.payload import messages
from tests.test_filters import WORDS, _core, _message_frame
from tests.test_pulsar_core import frame_bytes, sent


def _bits(words: list[int], size: int) -> set[int]:
    """The indices whose bit is set (unacknowledged), of a batch of ``size``."""
    return {i for i in range(size) if i // 64 < len(words) and (words[i // 64] >> (i % 64)) & 1}


def test_an_ack_set_in_the_consumers_numbering_acknowledges_only_what_it_acknowledged() -> None:
    core, _ = _core(FilterSpec(WORDS))
    # Entry 7: index 0 is left out (Words skips "skip"), 1 and 2 delivered.
    out = core.receive_broker(_message_frame([b"skip me", b"first", b"second"]), 1.0)
    (delivered,) = sent(out, Peer.CLIENT)
    assert [m.payload for m in messages(delivered)] == [b"first", b"second"]
    # The consumer acknowledges "second", its index 1 of 2, as Java's
    # grouping tracker does: all bits of its batch set, but that one.
    ack = pb.CommandAck(
        consumer_id=2, ack_type=pb.CommandAck.Individual,
        message_id=[pb.MessageIdData(ledgerId=1, entryId=7, ack_set=[0b01])],
    )  # fmt: skip
    forwarded = sent(core.receive_client(frame_bytes("ACK", ack), 1.1), Peer.BROKER)
    (told,) = [f for f in forwarded if f.type == pb.BaseCommand.ACK]
    (message_id,) = told.body.message_id
    unacked = _bits(list(message_id.ack_set), 3)
    # "first" (index 1 of the entry) was never acknowledged by the consumer.
    assert 1 in unacked
    assert 2 not in unacked
