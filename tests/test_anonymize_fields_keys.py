"""``sluice record anonymize`` on message keys (a message's metadata and a
batch's entries'), built here as a client sends them, without a broker:
the copy's keys must still be read as a client and a broker read them."""

from __future__ import annotations

import base64
import binascii

from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import encode_payload, pb
from sluice.protocols.pulsar.anonymize import anonymized_frame
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.payload import build_batch, split_batch

KEY = b"k" * 32
KEY_BYTES = b"\x00customer-42\xff"  # bytes a client gave as the key (not UTF-8)
KEY_B64 = base64.b64encode(KEY_BYTES).decode()


def send(meta: pb.MessageMetadata, payload: bytes) -> bytes:
    cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
    cmd.send.producer_id, cmd.send.sequence_id = 1, meta.sequence_id
    return encode_payload(cmd, meta, payload)


def copied(
    raw: bytes, names: Pseudonyms
) -> tuple[pb.MessageMetadata, list[pb.SingleMessageMetadata]]:
    """The metadata of ``raw``'s anonymized copy (``filler``) and its batch
    entries', the table learned first (as ``record anonymize`` reads a
    capture twice)."""
    names.learning = True
    anonymized_frame(raw, names, filler=True)
    names.learning = False
    done = anonymized_frame(raw, names, filler=True)
    assert done is not None
    frame = decode_frame(done[0])
    assert frame.metadata is not None
    meta = frame.metadata
    if not meta.HasField("num_messages_in_batch"):
        return meta, []
    entries = split_batch(bytes(frame.payload), meta.num_messages_in_batch)
    return meta, [e.metadata for e in entries if e.metadata is not None]


def decoded(key: str) -> bytes:
    """``key`` read as a client and a broker read a base64-flagged key."""
    try:
        return base64.b64decode(key, validate=True)
    except binascii.Error as error:
        raise AssertionError(f"not base64: {key!r}") from error


def test_a_base64_partition_key_stays_base64() -> None:
    """A key flagged ``partition_key_b64_encoded`` became ``key-…``, which
    is no base64: a client decoding the key's bytes, and a Key_Shared
    subscription hashing them, failed on replay and serve. Its pseudonym
    is now base64 too, of the pseudonym the same bytes take as an
    ``ordering_key``; a key without the flag is as it was."""
    names = Pseudonyms(KEY)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1,
                              partition_key=KEY_B64, partition_key_b64_encoded=True,
                              ordering_key=KEY_BYTES)  # fmt: skip
    clean, _ = copied(send(meta, b"payload"), names)
    assert clean.partition_key_b64_encoded
    assert KEY_B64 not in clean.partition_key
    assert decoded(clean.partition_key) == clean.ordering_key != KEY_BYTES
    plain = pb.MessageMetadata(producer_name="p", sequence_id=2, publish_time=1,
                               partition_key="customer-42")  # fmt: skip
    clean, _ = copied(send(plain, b"payload"), names)
    assert clean.partition_key == names.name("key", "customer-42")


def test_a_batch_entrys_base64_partition_key_stays_base64() -> None:
    """The same in a batch's entries (``--payloads filler``), each entry's
    own key, one key one pseudonym."""
    names = Pseudonyms(KEY)
    other = base64.b64encode(b"other-key").decode()
    entries = [
        (pb.SingleMessageMetadata(payload_size=1, sequence_id=n, partition_key=key,
                                  partition_key_b64_encoded=True), b"x")
        for n, key in enumerate((KEY_B64, other, KEY_B64))
    ]  # fmt: skip
    entries.append((pb.SingleMessageMetadata(payload_size=1, sequence_id=3,
                                             partition_key="plain-key"), b"x"))  # fmt: skip
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              num_messages_in_batch=len(entries))  # fmt: skip
    _, clean = copied(send(meta, build_batch(entries)), names)
    assert [e.partition_key_b64_encoded for e in clean] == [True, True, True, False]
    keys = [decoded(e.partition_key) for e in clean[:3]]
    assert keys[0] == keys[2] != keys[1]
    assert KEY_BYTES not in keys and b"other-key" not in keys
    assert clean[3].partition_key == names.name("key", "plain-key")
