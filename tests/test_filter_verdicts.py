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
