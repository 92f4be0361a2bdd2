"""Topic names a hostile client picks to get round the filters: names the
broker takes for topics of their own though they look like a partition,
and names that are not UTF-8.

Apache Pulsar reads ``orders-partition-01`` and ``orders-partition-+2`` as
topics of their own (``TopicName.getPartitionIndex``: the index must be
written as Java writes the number, so no sign and no leading zero), with
schemas of their own; any producer may make one where topics are made on
first use (the broker's default). Sluice kept what it learned of such a
topic's schema as ``orders``'s: a client that made ``orders-partition-01``
without a schema, sent one message there and then one to ``orders``, had
its garbage checked against "no schema" and passed into ``orders``.
"""

from __future__ import annotations

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Action, Ask, Peer
from sluice.protocols.filtering import schema_topic
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.encoder import command, encode_payload
from tests.test_filters import TOPIC, _avro_record_answer, _batch, _core, _receipt
from tests.test_filters_producers_known import _producer, _success
from tests.test_pulsar_core import frame_bytes, names, sent

T = pb.BaseCommand


@pytest.mark.parametrize(
    ("name", "schema_of"),
    [
        (TOPIC + "-partition-3", TOPIC),
        ("orders-partition-0", TOPIC),
        (TOPIC + "-partition-2147483647", TOPIC),
        # Topics of their own to the broker, however they look.
        (TOPIC + "-partition-01", TOPIC + "-partition-01"),
        (TOPIC + "-partition-+2", TOPIC + "-partition-+2"),
        (TOPIC + "-partition--1", TOPIC + "-partition--1"),
        (TOPIC + "-partition-2147483648", TOPIC + "-partition-2147483648"),
        (TOPIC + "-partition-", TOPIC + "-partition-"),
    ],
)
def test_a_schema_is_shared_only_by_the_partitions_the_broker_makes(
    name: str, schema_of: str
) -> None:
    assert schema_topic(name) == schema_of


def _schemaless_send(producer_id: int, sequence_id: int, payload: bytes) -> bytes:
    meta, data = _batch([payload])
    body = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1)
    return encode_payload(command(T.SEND, body), meta, data)


def _ask(out: list[Action]) -> Ask:
    (ask,) = out
    assert isinstance(ask, Ask)
    return ask


@pytest.mark.parametrize("suffix", ["-partition-01", "-partition-+0"])
def test_a_topic_that_looks_like_a_partition_does_not_lend_its_schema(suffix: str) -> None:
    core, _ = _core(FilterSpec("schema"))
    # Producer 1 is on TOPIC (made by _core); producer 3 on the look-alike.
    core.receive_client(_producer(3, 50, TOPIC + suffix), 1.0)
    core.receive_broker(_success(50), 1.05)
    ask = _ask(core.receive_client(_schemaless_send(3, 0, b"anything"), 1.1))
    assert ask.request[1].topic == TOPIC + suffix
    no_schema = pb.CommandGetSchemaResponse(request_id=1, error_code=pb.TopicNotFound)
    out = core.answered(ask.token, decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", no_schema)), 1.2)
    assert names(out, Peer.BROKER) == ["SEND"]  # that topic has none: it passes
    # Garbage to TOPIC, whose schema is Avro: asked for, not taken as the other's.
    ask = _ask(core.receive_client(_schemaless_send(1, 0, b"garbage, not avro"), 1.3))
    assert ask.request[1].topic == TOPIC
    answer = decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", _avro_record_answer()))
    out = core.answered(ask.token, answer, 1.4)
    assert names(out, Peer.BROKER) == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR"


def test_a_partitions_producer_registering_a_version_forgets_the_topics_schemas() -> None:
    """A producer opened on partition 3 may register a new version of the
    topic's schema: what was known of the topic is asked again."""
    core, _ = _core(FilterSpec("schema"))
    ask = _ask(core.receive_client(_schemaless_send(1, 0, b"\x02\x06abc"), 1.0))
    answer = decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", _avro_record_answer()))
    assert names(core.answered(ask.token, answer, 1.1), Peer.BROKER) == ["SEND"]
    core.receive_broker(_receipt(0), 1.2)
    core.receive_client(_producer(3, 50, TOPIC + "-partition-3"), 5.0)
    _ask(core.receive_client(_schemaless_send(1, 1, b"\x02\x06abc"), 5.1))
