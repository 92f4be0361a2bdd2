"""What an unusual or hostile client tried and the filters held: SENDs the
broker treats specially (replicated, markers, in a transaction), deliveries
before the consumer is made, the schema version a message names, and
unusual topic names."""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Action, Ask, Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import TOPIC, WORDS, _batch, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _success
from tests.test_pulsar_core import frame_bytes, sent

T = pb.BaseCommand


def _special_send(meta_fields: dict[str, object], send_fields: dict[str, object]) -> bytes:
    meta, data = _batch(LOUD)
    for name, value in meta_fields.items():
        setattr(meta, name, value)
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1, **send_fields)  # type: ignore[arg-type]
    return encode_payload(command(T.SEND, body), meta, data)


@pytest.mark.parametrize(
    ("meta_fields", "send_fields"),
    [
        ({"replicated_from": "other-cluster"}, {}),
        ({"marker_type": 10}, {"marker": True}),
        ({"txnid_least_bits": 7, "txnid_most_bits": 1}, {"txnid_least_bits": 7,
                                                          "txnid_most_bits": 1}),
    ],
    ids=["replicated", "marker", "transaction"],
)  # fmt: skip
def test_a_send_the_broker_treats_specially_is_filtered_as_any(
    meta_fields: dict[str, object], send_fields: dict[str, object]
) -> None:
    """Replicated, a marker, in a transaction (committed or aborted later:
    what the broker keeps is what was filtered at the SEND)."""
    core, _ = _core(FilterSpec(WORDS))
    assert _filtered(core.receive_client(_special_send(meta_fields, send_fields), 1.0), 1)


def _delivery(consumer_id: int) -> bytes:
    meta, data = _batch([b"please skip me"])
    body = pb.CommandMessage(consumer_id=consumer_id,
                             message_id=pb.MessageIdData(ledgerId=1, entryId=3))  # fmt: skip
    return encode_payload(command(T.MESSAGE, body), meta, data)


def test_a_delivery_before_the_subscribe_is_answered_is_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS))
    subscribe = pb.CommandSubscribe(topic=TOPIC, subscription="t", consumer_id=6, request_id=80,
                                    subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(frame_bytes("SUBSCRIBE", subscribe), 1.0)
    out = core.receive_broker(_delivery(6), 1.1)  # no SUCCESS yet
    assert sent(out, Peer.CLIENT) == []
    assert [f.type for f in sent(out, Peer.BROKER)] == [T.ACK, T.FLOW]


def _ask(out: list[Action]) -> Ask:
    (ask,) = out
    assert isinstance(ask, Ask)
    return ask


def test_a_message_naming_an_older_version_is_checked_against_that_version_of_its_topic() -> None:
    """Consumers decode a message with the schema version it names, so it
    is checked against that one: of its own topic, whichever topic the
    bytes were copied from (versions are numbered per topic)."""
    core, _ = _core(FilterSpec("schema"))
    meta, data = _batch([b"anything"])
    meta.schema_version = (0).to_bytes(8, "big")
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    ask = _ask(core.receive_client(encode_payload(command(T.SEND, body), meta, data), 1.0))
    assert ask.request[0] == T.GET_SCHEMA
    assert (ask.request[1].topic, ask.request[1].schema_version) == (TOPIC, meta.schema_version)


@pytest.mark.parametrize(
    "topic",
    [
        "non-persistent://public/default/orders",
        "persistent://public/default/" + "o" * 20_000,
        "persistent://public/default/ord ers\u00e9/\u2603",
        "persistent://public/default/orders-partition-7",
    ],
    ids=["non-persistent", "long", "unusual-characters", "partition"],
)
def test_unusual_topic_names_are_filtered_by_a_pattern_over_the_namespace(topic: str) -> None:
    core, _ = _core(FilterSpec(WORDS, ("public/default/*",)))
    core.receive_client(_producer(3, 50, topic), 1.0)
    core.receive_broker(_success(50), 1.1)
    meta, data = _batch(LOUD)
    body = pb.CommandSend(producer_id=3, sequence_id=0, num_messages=1)
    out = core.receive_client(encode_payload(command(T.SEND, body), meta, data), 1.2)
    assert _filtered(out, 3)


def test_a_batch_entry_is_seen_whole_nothing_after_it_unchecked() -> None:
    """A batch says how many entries it holds; bytes past the last would
    be stored unchecked, so such a SEND is refused."""
    core, _ = _core(FilterSpec(WORDS))
    meta, data = _batch([b"fine"], pb.NONE)
    hidden = data + b"\x00\x00\x00\x02\x18\x04more"  # a second entry, uncounted
    meta.uncompressed_size = len(hidden)
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    out = core.receive_client(encode_payload(command(T.SEND, body), meta, hidden), 1.0)
    assert [a for a in out if getattr(a, "to", None) is Peer.BROKER] == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and "after the last batch entry" in error.body.message
