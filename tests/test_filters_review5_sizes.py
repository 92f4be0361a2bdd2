"""How much work a SEND on a filtered topic can ask of the proxy.

The broker bounds a frame (5 MiB by default), not what its payload
decompresses to; Sluice takes a filtered message apart up to
``MAX_UNCOMPRESSED_SIZE`` (256 MiB). Zstandard packs 64 MB of a JSON array
into some 5 KB, and the schema filter's JSON check of those 64 MB took 53
seconds of the proxy's one Python thread (every connection of the process
waits) and 870 MB of memory; 4 MB, in a SEND of 363 bytes, took 7 s."""

from __future__ import annotations

import cramjam

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import WORDS, _core
from tests.test_pulsar_core import MiB, names

T = pb.BaseCommand


def _bomb(size: int, deliver: bool = False) -> bytes:
    """A SEND (or a MESSAGE to consumer 2) of one message of ``size`` bytes,
    ZSTD-compressed to a few KB."""
    body = b'{"a": [' + b"1.5," * ((size - 12) // 4) + b"1.5]}"
    data = bytes(cramjam.zstd.compress(body))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=pb.ZSTD, uncompressed_size=len(body))  # fmt: skip
    if deliver:
        message = pb.CommandMessage(
            consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=7)
        )
        return encode_payload(command(T.MESSAGE, message), meta, data)
    send = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    return encode_payload(command(T.SEND, send), meta, data)


def test_a_filtered_message_many_times_the_frame_limit_uncompressed_is_refused() -> None:
    core, _ = _core(FilterSpec(WORDS))
    raw = _bomb(32 * MiB)  # six times the broker's default frame limit
    assert len(raw) < 64 * 1024  # the frame is small; what it unpacks to is not
    out = core.receive_client(raw, 1.0)
    assert names(out, Peer.BROKER) == []
    assert names(out, Peer.CLIENT) == ["SEND_ERROR"]


def test_a_compressed_message_that_unpacks_within_the_limit_is_filtered_as_before() -> None:
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_client(_bomb(4 * MiB), 1.0)
    assert names(out, Peer.BROKER) == ["SEND"]


def test_a_delivery_that_unpacks_past_the_limit_is_not_read_nor_delivered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_broker(_bomb(32 * MiB, deliver=True), 1.0)
    assert names(out, Peer.CLIENT) == []
    assert names(out, Peer.BROKER) == ["ACK", "FLOW"]  # taken in the consumer's name
