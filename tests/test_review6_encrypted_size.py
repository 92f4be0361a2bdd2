"""Review of a101645 (a compressed message that unpacks past the broker's
message size is refused unread): an encrypted message is never unpacked.

Its payload is ciphertext; the filters get it as one opaque message
(``FilterGate._messages``), so what it says it unpacks to costs the proxy
nothing. Pulsar's clients compress, then encrypt, and bound the compressed
size by the broker's: a message that fits only compressed is legal."""

from __future__ import annotations

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import WORDS, _core
from tests.test_pulsar_core import MiB, names

T = pb.BaseCommand


def _encrypted(deliver: bool) -> bytes:
    """One client-encrypted ZSTD message, 8 MiB before compression."""
    meta = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, compression=pb.ZSTD,
        uncompressed_size=8 * MiB, encryption_algo="RSA", encryption_param=b"\x01" * 12,
        encryption_keys=[pb.EncryptionKeys(key="k", value=b"wrapped")],
    )  # fmt: skip
    ciphertext = bytes(range(256)) * 16  # 4 KiB, as opaque to Sluice as any
    if deliver:
        body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=7))
        return encode_payload(command(T.MESSAGE, body), meta, ciphertext)
    send = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    return encode_payload(command(T.SEND, send), meta, ciphertext)


def test_an_encrypted_send_is_not_refused_for_its_unpacked_size() -> None:
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_client(_encrypted(deliver=False), 1.0)
    assert names(out, Peer.CLIENT) == []
    assert names(out, Peer.BROKER) == ["SEND"]


def test_an_encrypted_delivery_is_not_skipped_for_its_unpacked_size() -> None:
    core, _ = _core(FilterSpec(WORDS))
    out = core.receive_broker(_encrypted(deliver=True), 1.0)
    assert names(out, Peer.CLIENT) == ["MESSAGE"]
    assert names(out, Peer.BROKER) == []  # nothing acknowledged in the consumer's name
