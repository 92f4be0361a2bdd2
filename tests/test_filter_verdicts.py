"""What a filter's verdict changes of a message, and no more; and what a
malformed verdict does (the filter failed: its connection goes on).

Run through the Pulsar core without a process, as tests/test_filters.py does."""

from __future__ import annotations

from sluice.filters import Filter, Message, NoSettings, Reject, Replace, Verdict
from sluice.filters.config import FilterSpec
from sluice.protocols.core import Filtered, Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import build_batch, compress, messages
from tests.test_filters import WORDS, _core, _send
from tests.test_pulsar_core import sent

T = pb.BaseCommand
HERE = "tests.test_filter_verdicts"


class Tags(Filter[NoSettings]):
    """Adds a property to every produced message; nothing else."""

    def on_produce(self, message: Message) -> Verdict:
        return Replace(properties={**message.properties, "tagged": "yes"})


class RejectsBadly(Filter[NoSettings]):
    """Refuses every produced message with a Reject whose message is not text."""

    def on_produce(self, message: Message) -> Verdict:
        return Reject("bad", 5)  # type: ignore[arg-type]


def _batch_send(entries: list[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    data = build_batch(entries)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=pb.LZ4, uncompressed_size=len(data),
                              num_messages_in_batch=len(entries))  # fmt: skip
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=len(entries))
    return encode_payload(command(T.SEND, body), meta, compress(pb.LZ4, data))


def test_a_tombstone_stays_a_tombstone_when_only_its_properties_change() -> None:
    """A Replace of properties alone left the payload "unchanged" as the
    empty bytes a tombstone has, and the batch was rebuilt with that as a
    value: the broker stored an empty message where the producer sent a
    tombstone (a compacted topic kept the key)."""
    core, _ = _core(FilterSpec(f"{HERE}:Tags"))
    tombstone = pb.SingleMessageMetadata(payload_size=0, partition_key="k", null_value=True)
    value = pb.SingleMessageMetadata(payload_size=5, partition_key="j")
    out = core.receive_client(_batch_send([(tombstone, b""), (value, b"value")]), 1.0)
    (frame,) = sent(out, Peer.BROKER)
    assert frame.error is None
    first, second = messages(frame)
    assert first.metadata is not None and second.metadata is not None
    assert first.metadata.null_value and not second.metadata.null_value
    assert {kv.key: kv.value for kv in first.metadata.properties} == {"tagged": "yes"}
    assert second.payload == b"value"


def test_a_key_of_bytes_stays_one_when_only_the_properties_change() -> None:
    """A key the client sent as bytes (base64, flagged) went on as the text
    of its base64 with the flag cleared: another key, for consumers,
    compaction and key-shared subscriptions."""
    core, _ = _core(FilterSpec(f"{HERE}:Tags"))
    keyed = pb.SingleMessageMetadata(
        payload_size=1, partition_key="AAEC", partition_key_b64_encoded=True
    )
    out = core.receive_client(_batch_send([(keyed, b"x"), (keyed, b"y")]), 1.0)
    (frame,) = sent(out, Peer.BROKER)
    for message in messages(frame):
        assert message.metadata is not None
        assert message.metadata.partition_key == "AAEC"
        assert message.metadata.partition_key_b64_encoded


def test_a_reject_that_is_not_well_formed_fails_the_filter_not_the_connection() -> None:
    """A Reject whose message was not text raised in the core, which ended
    the connection: every producer and consumer on it, not the one message."""
    core, rec = _core(FilterSpec(f"{HERE}:RejectsBadly"))
    out = core.receive_client(_send(0, [b"x"]), 1.0)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and not sent(out, Peer.BROKER)
    assert error.body.message == f"filter {HERE}:RejectsBadly failed"
    assert [(e.action, e.reason) for e in rec.of(Filtered)] == [
        ("error", "closed"), ("rejected", "filter_error"),
    ]  # fmt: skip
    # Open: the message goes on as the filter got it.
    core, _ = _core(FilterSpec(f"{HERE}:RejectsBadly", on_error="open"))
    assert [f.name for f in sent(core.receive_client(_send(1, [b"y"]), 1.0), Peer.BROKER)] == [
        "SEND"
    ]


def test_the_words_filter_still_tags_deliveries() -> None:
    """(A check of the helpers above: a properties-only change on delivery
    still reaches the consumer.)"""
    core, _ = _core(FilterSpec(WORDS))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=1))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, b"hi"), 1.0)
    (frame,) = sent(out, Peer.CLIENT)
    assert frame.metadata is not None
    assert {kv.key: kv.value for kv in frame.metadata.properties} == {"seen-by": "sluice"}
    assert bytes(frame.payload) == b"hi"


class Exits(Filter[NoSettings]):
    """Calls sys.exit on every produced message, as argparse does on input
    it does not like."""

    def on_produce(self, message: Message) -> Verdict:
        raise SystemExit(2)


def test_a_filter_that_exits_fails_like_one_that_raises() -> None:
    """SystemExit is no Exception: it went through the chain and the
    relay, and ended the proxy with every connection."""
    core, rec = _core(FilterSpec(f"{HERE}:Exits"))
    (error,) = sent(core.receive_client(_send(0, [b"x"]), 1.0), Peer.CLIENT)
    assert error.name == "SEND_ERROR" and error.body.message == f"filter {HERE}:Exits failed"
    assert ("error", "closed") in [(e.action, e.reason) for e in rec.of(Filtered)]


class Rewrites(Filter[NoSettings]):
    """Gives every delivery a new payload."""

    def on_deliver(self, message: Message) -> Verdict:
        return Replace(payload=b"new")


def _encrypted_message(batch: int = 0) -> bytes:
    """A delivery the client encrypted (LZ4, then AES: the payload is
    ciphertext that does not decompress), of ``batch`` messages or none."""
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=pb.LZ4, uncompressed_size=100,
                              encryption_keys=[pb.EncryptionKeys(key="k", value=b"wrapped")],
                              encryption_param=b"\x01" * 12, encryption_algo="RSA")  # fmt: skip
    if batch:
        meta.num_messages_in_batch = batch
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=1))
    return encode_payload(command(T.MESSAGE, body), meta, bytes(range(7, 57)))


def test_an_encrypted_delivery_takes_a_property_and_keeps_its_ciphertext() -> None:
    """A deliver filter that tags (docs/filters.md's example) on a message
    the client encrypted and compressed: the core tried to decompress the
    ciphertext and ended the connection ("unframeable"), every producer and
    consumer on it, and the consumer got the same message again, for ever.
    Its properties travel in the clear: they change; the payload stays."""
    core, _ = _core(FilterSpec(WORDS))
    raw = _encrypted_message()
    out = core.receive_broker(raw, 1.0)
    (frame,) = sent(out, Peer.CLIENT)
    assert frame.name == "MESSAGE" and frame.error is None and frame.metadata is not None
    assert {kv.key: kv.value for kv in frame.metadata.properties} == {"seen-by": "sluice"}
    assert bytes(frame.payload) == bytes(range(7, 57))
    assert [k.key for k in frame.metadata.encryption_keys] == ["k"]
    assert frame.metadata.compression == pb.LZ4 and frame.metadata.uncompressed_size == 100


def test_an_encrypted_delivery_given_a_payload_or_a_batch_changed_is_refused() -> None:
    """What cannot be changed (a new payload would reach consumers as
    ciphertext that is not; a batch's properties are in the ciphertext) is
    refused, reason encrypted, as on produce; a skipped batch gives back
    its messages' permits."""
    for spec, batch in ((f"{HERE}:Rewrites", 0), (WORDS, 3)):
        core, rec = _core(FilterSpec(spec))
        out = core.receive_broker(_encrypted_message(batch), 1.0)
        assert not sent(out, Peer.CLIENT)
        to_broker = sent(out, Peer.BROKER)
        assert [f.name for f in to_broker] == ["ACK", "FLOW"]
        assert to_broker[1].body.messagePermits == max(batch, 1)
        assert [(e.action, e.reason) for e in rec.of(Filtered)] == [("rejected", "encrypted")]


def test_an_unbatched_tombstone_given_a_payload_is_a_tombstone_no_more() -> None:
    """The batch rebuild cleared null_value for an entry given a payload;
    an unbatched message kept it, and the broker got a value flagged as
    none."""
    core, _ = _core(FilterSpec(f"{HERE}:Rewrites"))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, null_value=True)
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=1))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, b""), 1.0)
    (frame,) = sent(out, Peer.CLIENT)
    assert frame.metadata is not None and not frame.metadata.null_value
    assert bytes(frame.payload) == b"new"


def test_an_encrypted_send_takes_a_property_as_a_delivery_does() -> None:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=pb.LZ4, uncompressed_size=100,
                              encryption_keys=[pb.EncryptionKeys(key="k", value=b"wrapped")],
                              encryption_param=b"\x01" * 12)  # fmt: skip
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    core, _ = _core(FilterSpec(f"{HERE}:Tags"))
    out = core.receive_client(encode_payload(command(T.SEND, body), meta, b"\x09" * 40), 1.0)
    (frame,) = sent(out, Peer.BROKER)
    assert frame.name == "SEND" and frame.metadata is not None
    assert {kv.key: kv.value for kv in frame.metadata.properties} == {"tagged": "yes"}
    assert bytes(frame.payload) == b"\x09" * 40 and frame.metadata.encryption_keys
