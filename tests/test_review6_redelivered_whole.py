"""Review of 6d89a9a: a batch delivered thinned, then delivered again whole
(redelivered after the filters were reloaded, or by a filter whose verdict
changed) keeps the numbering of its first delivery, so the consumer's ACKs
of the whole batch are renumbered as if it were still thinned."""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from tests.test_filters import WORDS, _core, _message_frame
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def test_an_entry_redelivered_whole_is_acknowledged_in_its_own_numbering() -> None:
    core, _ = _core(FilterSpec(WORDS))
    core.receive_broker(_message_frame([b"skip me", b"first", b"second"]), 1.0)
    # Redelivered (the consumer never acknowledged it), and this time the
    # filters keep every message: the consumer numbers them 0, 1, 2 as the
    # broker does.
    out = core.receive_broker(_message_frame([b"zero", b"first", b"second"]), 2.0)
    assert len(sent(out, Peer.CLIENT)) == 1
    # It acknowledges its index 0 ("zero") alone: bits 1 and 2 still set.
    ack = pb.CommandAck(
        consumer_id=2, ack_type=pb.CommandAck.Individual,
        message_id=[pb.MessageIdData(ledgerId=1, entryId=7, ack_set=[0b110])],
    )  # fmt: skip
    raw = frame_bytes("ACK", ack)
    out = core.receive_client(raw, 2.1)
    assert b"".join(a.data for a in out if a.to is Peer.BROKER) == raw  # type: ignore[union-attr]
