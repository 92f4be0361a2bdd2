"""A consumer's ACKs of a batch a deliver filter thinned, renumbered for the
broker: by ack set, by batch index, whole entry and cumulative; and the
client's reads leave the Python path once nothing waits for renumbering."""

from __future__ import annotations

from typing import Any

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.connection import PulsarConnection
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.filtering import _renumbered
from tests.test_filters import WORDS, _batch, _core, _message_frame
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _ack(*ids: pb.MessageIdData, cumulative: bool = False) -> bytes:
    kind = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
    return frame_bytes("ACK", pb.CommandAck(consumer_id=2, ack_type=kind, message_id=ids))


def _told(core: PulsarConnection, raw: bytes, now: float) -> Any:
    """The ACK the broker got for the client's ``raw``."""
    (told,) = [f for f in sent(core.receive_client(raw, now), Peer.BROKER) if f.type == T.ACK]
    return told.body


def _thinned_core() -> PulsarConnection:
    """Entries 7 and 8 delivered thinned: index 0 of 3 left out of each."""
    core, _ = _core(FilterSpec(WORDS))
    for entry in (7, 8):
        core.receive_broker(_message_frame([b"skip me", b"first", b"second"], entry), 1.0)
    return core


def _filtered_reads(core: PulsarConnection) -> bool:
    """Whether an entry waits for its ACKs to be renumbered (the client's
    reads then come the Python way: ``FilterGate.wants``)."""
    assert core._gate is not None
    return bool(core._gate._thinned)


def test_ack_sets_are_renumbered_and_an_entry_left_out_counts_as_acknowledged() -> None:
    assert _renumbered([0b01], 3, (1, 2)) == [0b010]
    assert _renumbered([0b10], 3, (1, 2)) == [0b100]
    assert _renumbered([0b11], 3, (0, 2)) == [0b101]
    assert _renumbered([0], 3, (1, 2)) == [0]
    # Past 64 entries, and a word with its top bit set (protobuf's int64).
    assert _renumbered([0, 1], 70, tuple(range(1, 70))) == [0, 0b10]
    assert _renumbered([1 << 62], 70, tuple(range(1, 70))) == [-(1 << 63), 0]


def test_an_ack_by_batch_index_is_renumbered() -> None:
    core = _thinned_core()
    mid = pb.MessageIdData(ledgerId=1, entryId=7, batch_index=1, batch_size=2)
    (told,) = _told(core, _ack(mid), 1.1).message_id
    assert (told.batch_index, told.batch_size) == (2, 3)


def test_the_whole_entry_acknowledged_goes_on_as_it_came_and_is_forgotten() -> None:
    core = _thinned_core()
    raw = _ack(pb.MessageIdData(ledgerId=1, entryId=7))
    out = core.receive_client(raw, 1.1)
    assert b"".join(a.data for a in out if a.to is Peer.BROKER) == raw  # type: ignore[union-attr]
    assert _filtered_reads(core)  # entry 8 still waits
    core.receive_client(_ack(pb.MessageIdData(ledgerId=1, entryId=8)), 1.2)
    assert not _filtered_reads(core)


def test_a_cumulative_ack_forgets_what_it_passes_and_renumbers_its_own_entry() -> None:
    core = _thinned_core()
    mid = pb.MessageIdData(ledgerId=1, entryId=8, ack_set=[0b10])
    (told,) = _told(core, _ack(mid, cumulative=True), 1.1).message_id
    assert list(told.ack_set) == [0b100]
    assert _filtered_reads(core)  # entry 8 partly acknowledged
    core.receive_client(_ack(pb.MessageIdData(ledgerId=1, entryId=9), cumulative=True), 1.2)
    assert not _filtered_reads(core)


def test_an_ack_set_acknowledging_every_entry_kept_forgets_the_entry() -> None:
    core, _ = _core(FilterSpec(WORDS))
    core.receive_broker(_message_frame([b"skip me", b"first", b"second"]), 1.0)
    (told,) = _told(
        core, _ack(pb.MessageIdData(ledgerId=1, entryId=7, ack_set=[0])), 1.1
    ).message_id
    assert list(told.ack_set) == [0]
    assert not _filtered_reads(core)


def test_an_entry_delivered_whole_is_not_renumbered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    core.receive_broker(_message_frame([b"first", b"second"]), 1.0)
    assert not _filtered_reads(core)
    raw = _ack(pb.MessageIdData(ledgerId=1, entryId=7, ack_set=[0b01]))
    out = core.receive_client(raw, 1.1)
    assert b"".join(a.data for a in out if a.to is Peer.BROKER) == raw  # type: ignore[union-attr]


def test_a_redelivered_batchs_ack_set_is_renumbered_for_the_entries_kept() -> None:
    """A redelivered batch carries the broker's ack set (bit i: entry i still
    unacknowledged); thinned, the consumer reads it in its own numbering."""
    core, _ = _core(FilterSpec(WORDS))
    meta, data = _batch([b"zero", b"skip me", b"two", b"three"], pb.ZSTD)
    body = pb.CommandMessage(
        consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=7), ack_set=[0b1010]
    )  # entries 1 and 3 still unacknowledged
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, data), 1.0)
    (delivered,) = sent(out, Peer.CLIENT)
    # Kept: entries 0, 2 and 3, numbered 0, 1 and 2: only entry 3 (now 2) unacknowledged.
    assert list(delivered.body.ack_set) == [0b100]
