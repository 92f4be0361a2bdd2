"""A SEND reaches the filters however the client frames it: split across
reads at any byte, without the checksum (no 0x0e01 magic), or with a
broker entry metadata section a client has no business sending."""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import messages
from tests.test_filters import WORDS, _batch, _core
from tests.test_pulsar_core import sent

T = pb.BaseCommand


def _loud(**kw: object) -> bytes:
    meta, data = _batch([b"shout it"])
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    return encode_payload(command(T.SEND, body), meta, data, **kw)  # type: ignore[arg-type]


def _to_broker(out: list) -> list[bytes]:  # type: ignore[type-arg]
    return [a.data for a in out if getattr(a, "to", None) is Peer.BROKER]


def test_a_send_split_at_every_byte_is_filtered() -> None:
    raw = _loud()
    for cut in range(1, len(raw)):
        core, _ = _core(FilterSpec(WORDS))
        out = core.receive_client(raw[:cut], 1.0) + core.receive_client(raw[cut:], 1.1)
        (frame,) = sent(out, Peer.BROKER)
        assert [m.payload for m in messages(frame)] == [b"SHOUT IT"], cut


def test_a_send_one_byte_a_read_is_filtered() -> None:
    raw = _loud()
    core, _ = _core(FilterSpec(WORDS))
    out = []
    for i in range(len(raw)):
        out += core.receive_client(raw[i : i + 1], 1.0 + i / 1000)
    (frame,) = sent(out, Peer.BROKER)
    assert [m.payload for m in messages(frame)] == [b"SHOUT IT"]


def test_a_send_without_a_checksum_is_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    (frame,) = sent(core.receive_client(_loud(checksum=False), 1.0), Peer.BROKER)
    assert [m.payload for m in messages(frame)] == [b"SHOUT IT"]


@pytest.mark.parametrize("checksum", [True, False])
def test_a_send_with_broker_entry_metadata_is_filtered_or_refused(checksum: bool) -> None:
    core, _ = _core(FilterSpec(WORDS))
    bem = pb.BrokerEntryMetadata(broker_timestamp=1)
    raw = _loud(checksum=checksum, broker_entry_metadata=bem)
    out = core.receive_client(raw, 1.0)
    frames = sent(out, Peer.BROKER)
    assert all(
        [m.payload for m in messages(f)] == [b"SHOUT IT"] for f in frames if f.type == T.SEND
    )
    assert raw not in b"".join(_to_broker(out))
