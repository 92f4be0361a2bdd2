"""Schema validation at the edge, against Apache Pulsar and the official client.

A typed producer gives a topic its schema; a producer without one may then
write anything into it (``schemaValidationEnforced`` is off by default), and
the broker stores it: shown here, direct. Through Sluice with the ``schema``
filter, the same bad payloads are refused with the SEND_ERROR the client
fails that one send on, the good ones are stored, and a typed consumer reads
exactly the good ones. No pulsar-lite here: it keeps no schemas.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pulsar
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pulsar.schema import AvroSchema, Integer, JsonSchema, ProtobufNativeSchema, Record, String

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import free_port
from tests.helpers.support import ProxyProcess, client, start_proxy
from tests.test_dashboards import scrape

pytestmark = pytest.mark.e2e

PATTERN = "persistent://public/default/filters-*"


class Order(Record):  # type: ignore[misc]  # pulsar ships no types
    id = Integer(required=True)
    item = String(required=True)


# Version 2 of Order's schema, a field added with a default (the broker's
# compatibility check wants one; Record classes cannot say one).
ORDER_V2 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


@pytest.fixture(scope="module")
def admin_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def schema_proxy(
    apache_pulsar: ApachePulsar, tmp_path_factory: pytest.TempPathFactory, admin_port: int
) -> Iterator[ProxyProcess]:
    spec = json.dumps({"topics": [PATTERN], "direction": "produce"})
    proxy = start_proxy(
        apache_pulsar.url,
        tmp_path_factory.mktemp("schema-proxy"),
        "--filter", f"schema:{spec}",
        "--admin", f"127.0.0.1:{admin_port}",
    )  # fmt: skip
    yield proxy
    proxy.terminate()


def _topic(kind: str) -> str:
    return f"persistent://public/default/filters-{kind}-{uuid.uuid4().hex[:8]}"


def _sent(producer: pulsar.Producer, payloads: list[bytes]) -> list[bool]:
    """Whether each payload was stored (one send at a time, as a user would)."""
    results = []
    for payload in payloads:
        try:
            producer.send(payload)
            results.append(True)
        except pulsar.PulsarException:
            results.append(False)
    return results


def _read_all(consumer: pulsar.Consumer, expected: int) -> list[Any]:
    """Every message there is: ``expected`` of them, then none for 3 s."""
    got = []
    for _ in range(expected):
        message = consumer.receive(timeout_millis=15_000)
        consumer.acknowledge(message)
        got.append(message.value())
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=3_000)
    return got


def _avro(record: dict[str, Any], schema: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _rejected(proxy: ProxyProcess, admin: int, topic: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in scrape(proxy, admin).items()
        if name == "sluice_filter_rejected_total" and dict(labels)["topic"] == topic
    }


def test_avro_topic_refuses_what_does_not_match_and_stores_the_rest(
    apache_pulsar: ApachePulsar, schema_proxy: ProxyProcess, admin_port: int
) -> None:
    topic = _topic("avro")
    schema = AvroSchema(Order)
    definition = json.loads(schema.schema_info().schema())
    good = [_avro({"id": i, "item": f"thing-{i}"}, definition) for i in range(3)]
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "double"}]}
    bad = [b"not avro at all", _avro({"x": 1.5}, other), good[0] + b"\x00trailing"]
    with client(schema_proxy.url) as c:
        # A typed producer gives the topic its schema; a typed consumer waits.
        c.create_producer(topic, schema=schema).send(Order(id=100, item="typed"))
        consumer = c.subscribe(topic, "reader", schema=schema)
        raw = c.create_producer(topic, batching_enabled=False)
        assert _sent(raw, [good[0], bad[0], good[1], bad[1], bad[2], good[2]]) == [
            True, False, True, False, False, True,
        ]  # fmt: skip
        got = _read_all(consumer, 3)
        assert [(o.id, o.item) for o in got] == [(i, f"thing-{i}") for i in range(3)]
    rejected = _rejected(schema_proxy, admin_port, topic)
    assert sum(rejected.values()) == 3, rejected

    # The broker alone: the same producer, direct, stores every bad payload.
    with client(apache_pulsar.url) as c:
        reader = c.subscribe(topic, "direct", initial_position=pulsar.InitialPosition.Latest)
        direct = c.create_producer(topic, batching_enabled=False)
        assert _sent(direct, bad) == [True, True, True]
        stored = [reader.receive(timeout_millis=15_000).data() for _ in bad]
        assert stored == bad


def test_a_refused_message_refuses_its_batch_and_no_other(schema_proxy: ProxyProcess) -> None:
    topic = _topic("batch")
    schema = AvroSchema(Order)
    definition = json.loads(schema.schema_info().schema())
    with client(schema_proxy.url) as c:
        c.create_producer(topic, schema=schema).send(Order(id=0, item="typed"))
        consumer = c.subscribe(topic, "reader", schema=schema)
        batched = c.create_producer(
            topic, batching_enabled=True, batching_max_messages=3,
            batching_max_publish_delay_ms=60_000, compression_type=pulsar.CompressionType.ZSTD,
        )  # fmt: skip
        results: dict[int, str] = {}
        payloads = [_avro({"id": i, "item": "ok"}, definition) for i in range(1, 4)]
        payloads += [_avro({"id": 4, "item": "ok"}, definition), b"garbage", payloads[0]]
        for i, payload in enumerate(payloads):
            batched.send_async(payload, lambda r, _id, i=i: results.__setitem__(i, str(r)))
        with pytest.raises(pulsar.PulsarException):
            batched.flush()
        refused = ["Result.ChecksumError"] * 3
        assert [results.get(i) for i in range(6)] == ["Result.Ok"] * 3 + refused
        assert [o.id for o in _read_all(consumer, 3)] == [1, 2, 3]


def test_json_topic_names_the_field_and_keeps_the_good(schema_proxy: ProxyProcess) -> None:
    topic = _topic("json")
    schema = JsonSchema(Order)
    with client(schema_proxy.url) as c:
        c.create_producer(topic, schema=schema).send(Order(id=0, item="typed"))
        consumer = c.subscribe(topic, "reader", schema=schema)
        raw = c.create_producer(topic, batching_enabled=False)
        payloads = [
            json.dumps({"id": 1, "item": "a"}).encode(),
            json.dumps({"id": "one", "item": "a"}).encode(),  # wrong type
            json.dumps({"id": 2}).encode(),  # a required field missing
            b"{not json",
            json.dumps({"id": 3, "item": "c"}).encode(),
        ]
        assert _sent(raw, payloads) == [True, False, False, False, True]
        assert [(o.id, o.item) for o in _read_all(consumer, 2)] == [(1, "a"), (3, "c")]


def _person_class() -> Any:
    """A protobuf message class made from a descriptor (no protoc needed)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="sluice_test_person.proto", package="t", syntax="proto3"
    )
    message = file.message_type.add(name="Person")
    message.field.add(name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    message.field.add(name="age", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Person"))


def test_protobuf_native_topic(schema_proxy: ProxyProcess) -> None:
    topic = _topic("protobuf")
    person = _person_class()
    schema = ProtobufNativeSchema(person)
    with client(schema_proxy.url) as c:
        c.create_producer(topic, schema=schema).send(person(name="typed", age=1))
        consumer = c.subscribe(topic, "reader", schema=schema)
        raw = c.create_producer(topic, batching_enabled=False)
        good = person(name="ada", age=36).SerializeToString()
        unknown_field = good + b"\x98\x06\x01"  # field 99, a varint: not in Person
        assert _sent(raw, [good, b"\xff\xff\xff", unknown_field]) == [True, False, False]
        assert [(p.name, p.age) for p in _read_all(consumer, 1)] == [("ada", 36)]


def test_schema_evolution_checks_the_version_each_producer_names(
    schema_proxy: ProxyProcess,
) -> None:
    topic = _topic("evolve")
    v1, v2 = AvroSchema(Order), AvroSchema(None, schema_definition=ORDER_V2)
    v1_definition = json.loads(v1.schema_info().schema())
    with client(schema_proxy.url) as c:
        old = c.create_producer(topic, schema=v1)
        old.send(Order(id=1, item="v1"))
        new = c.create_producer(topic, schema=v2)  # registers version 2
        new.send({"id": 2, "item": "v2", "note": "evolved"})
        old.send(Order(id=3, item="v1 again"))  # still names version 1: still fine
        consumer = c.subscribe(topic, "reader", schema=v2,
                               initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
        raw = c.create_producer(topic, batching_enabled=False)
        # A producer naming no version is checked against the latest: v2.
        v2_payload = _avro({"id": 4, "item": "raw", "note": "latest"}, ORDER_V2)
        v1_payload = _avro({"id": 5, "item": "raw v1"}, v1_definition)
        assert _sent(raw, [v2_payload, v1_payload]) == [True, False]
        got = _read_all(consumer, 4)
        assert [o["id"] for o in got] == [1, 2, 3, 4]


def test_topics_no_filter_names_pass_untouched(schema_proxy: ProxyProcess) -> None:
    topic = f"persistent://public/default/unfiltered-{uuid.uuid4().hex[:8]}"
    with client(schema_proxy.url) as c:
        c.create_producer(topic, schema=AvroSchema(Order)).send(Order(id=1, item="typed"))
        raw = c.create_producer(topic, batching_enabled=False)
        assert _sent(raw, [b"anything goes here"]) == [True]


def test_a_chunked_message_on_a_filtered_topic_is_refused_with_a_clear_error(
    schema_proxy: ProxyProcess, admin_port: int
) -> None:
    topic = _topic("chunked")
    with client(schema_proxy.url) as c:
        c.create_producer(topic, schema=AvroSchema(Order)).send(Order(id=0, item="typed"))
        chunking = c.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        with pytest.raises(pulsar.PulsarException):
            chunking.send(bytes(6 * 1024 * 1024))  # over the broker's 5 MiB: sent in chunks
        # The producer goes on: an ordinary message after it is stored.
        consumer = c.subscribe(topic, "reader", schema=AvroSchema(Order))
        definition = json.loads(AvroSchema(Order).schema_info().schema())
        assert _sent(chunking, [_avro({"id": 1, "item": "after"}, definition)]) == [True]
        assert [o.id for o in _read_all(consumer, 1)] == [1]
    assert _rejected(schema_proxy, admin_port, topic).get("chunked", 0) >= 1
