"""``sluice record anonymize`` on a frame's schema (PRODUCER, SUBSCRIBE,
GET_SCHEMA's answer …), built here as a client sends it, without a broker:
the copy's schema must still be one a broker takes on replay."""

from __future__ import annotations

import base64
import json
import re

import fastavro
from google.protobuf import descriptor_pb2, descriptor_pool

from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import encode, pb
from sluice.protocols.pulsar.anonymize import anonymized_frame, schema_name
from sluice.protocols.pulsar.decoder import decode_frame

KEY = b"k" * 32
TOPIC = "persistent://acme/billing/invoices"


def producer(schema: pb.Schema) -> bytes:
    """A PRODUCER frame on ``TOPIC`` with ``schema``."""
    cmd = pb.BaseCommand(type=pb.BaseCommand.PRODUCER)
    cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = TOPIC, 1, 1
    cmd.producer.schema.CopyFrom(schema)
    return encode(cmd)


def copied_schema(raw: bytes, names: Pseudonyms) -> pb.Schema:
    """The schema of ``raw``'s anonymized copy, the table learned first (as
    ``record anonymize`` reads a capture twice)."""
    names.learning = True
    anonymized_frame(raw, names)
    names.learning = False
    done = anonymized_frame(raw, names)
    assert done is not None
    command = decode_frame(done[0]).command
    assert command is not None
    return command.producer.schema


def protobuf_native_data() -> bytes:
    """A PROTOBUF_NATIVE schema's data as the Java client makes it: JSON
    naming a root message in a base64 FileDescriptorSet."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="acme/billing/invoice.proto", package="com.acme.billing", syntax="proto3"
    )
    message = proto.message_type.add(name="Invoice")
    message.field.add(name="amount", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    files = descriptor_pb2.FileDescriptorSet(file=[proto])
    return json.dumps({
        "fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode(),
        "rootMessageTypeName": "com.acme.billing.Invoice",
        "rootFileDescriptorName": "acme/billing/invoice.proto",
    }).encode()  # fmt: skip


def root_message_resolves(data: bytes) -> None:
    """``data``'s root message is one its descriptor set defines, in the
    file it names (what a broker checks of a PROTOBUF_NATIVE schema)."""
    doc = json.loads(data)
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(doc["fileDescriptorSet"]))
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    message = pool.FindMessageTypeByName(doc["rootMessageTypeName"])
    assert message.file.name == doc["rootFileDescriptorName"]


def test_a_protobuf_native_schema_is_kept_as_it_is() -> None:
    """The JSON around a PROTOBUF_NATIVE descriptor was scrubbed while the
    descriptor was kept: its root message ``com.acme.billing.Invoice``
    became ``com.tenant-….ns-….Invoice``, a message the descriptor does not
    define, so the copy's schema was refused on replay."""
    data = protobuf_native_data()
    root_message_resolves(data)
    names = Pseudonyms(KEY)
    schema = pb.Schema(name="invoices", type=pb.Schema.ProtobufNative, schema_data=data)
    copied = copied_schema(producer(schema), names)
    assert "acme" in names.table["tenant"]  # so it was scrubbed from the JSON
    assert copied.schema_data == data
    root_message_resolves(copied.schema_data)


def test_a_key_value_schemas_protobuf_native_part_is_kept_as_it_is() -> None:
    """A KEY_VALUE schema whose properties say a part is PROTOBUF_NATIVE:
    that part is kept, the other scrubbed, their lengths made again."""
    native = protobuf_native_data()
    avro = json.dumps({"type": "record", "name": "Key", "namespace": "acme.keys",
                       "fields": []}).encode()  # fmt: skip
    data = b"".join(len(p).to_bytes(4, "big") + p for p in (avro, native))
    schema = pb.Schema(name="kv", type=pb.Schema.KeyValue, schema_data=data)
    schema.properties.extend([
        pb.KeyValue(key="key.schema.type", value="AVRO"),
        pb.KeyValue(key="value.schema.type", value="PROTOBUF_NATIVE"),
        pb.KeyValue(key="kv.encoding.type", value="SEPARATED"),
    ])  # fmt: skip
    names = Pseudonyms(KEY)
    copied = copied_schema(producer(schema), names).schema_data
    key_size = int.from_bytes(copied[:4], "big")
    key_part, rest = copied[4 : 4 + key_size], copied[4 + key_size :]
    assert int.from_bytes(rest[:4], "big") == len(rest) - 4
    assert b"acme" not in key_part
    assert rest[4:] == native


# An Avro name, and a namespace: names joined by dots (Avro 1.11, "Names").
AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AVRO_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def avro_names(schema: object) -> list[tuple[str, str]]:
    """Every (what, value) of an Avro schema that its name grammar rules:
    full names, namespaces, field names, enum symbols, aliases."""
    found: list[tuple[str, str]] = []
    if isinstance(schema, list):
        for item in schema:
            found += avro_names(item)
    elif isinstance(schema, dict):
        if "namespace" in schema:
            found.append(("namespace", schema["namespace"]))
        if schema.get("type") in ("record", "error", "enum", "fixed"):
            found.append(("fullname", schema["name"]))
        found += [("fullname", alias) for alias in schema.get("aliases", [])]
        found += [("name", symbol) for symbol in schema.get("symbols", [])]
        for field in schema.get("fields", []):
            found.append(("name", field["name"]))
            found += [("name", alias) for alias in field.get("aliases", [])]
            found += avro_names(field["type"])
        for key in ("items", "values"):
            if key in schema:
                found += avro_names(schema[key])
    return found


def assert_avro_names_valid(schema: object) -> None:
    for what, value in avro_names(schema):
        grammar = AVRO_NAME if what == "name" else AVRO_NAMESPACE
        assert grammar.fullmatch(value), (what, value)


def invoice_schema() -> dict[str, object]:
    """An Avro schema whose names hold the tenant (``acme``) and the
    namespace (``billing``) of ``TOPIC``."""
    return {
        "type": "record", "name": "Invoice", "namespace": "com.acme.billing",
        "aliases": ["com.acme.billing.Bill"],
        "fields": [
            {"name": "customer", "type": {
                "type": "record", "name": "acmeCustomer", "namespace": "com.acme",
                "fields": [{"name": "billing_id", "type": "string"}]}},
            {"name": "status", "type": {"type": "enum", "name": "com.acme.Status",
                                        "symbols": ["acme", "billing", "other"]}},
            {"name": "acme", "aliases": ["billing"], "type": {
                "type": "array", "items": {"type": "fixed", "name": "billing", "size": 4}}},
        ],
    }  # fmt: skip


def test_avro_and_json_schemas_names_stay_avro_names() -> None:
    """A pseudonym holds ``-``, which no Avro name may: ``com.acme.billing``
    (``acme`` the tenant) became ``com.tenant-….ns-…``, which a broker's
    Avro parser refuses on replay. In a schema's definition a pseudonym is
    written with ``_`` for ``-`` (``schema_name``), the same one everywhere."""
    original = invoice_schema()
    assert_avro_names_valid(original)
    fastavro.parse_schema(original)
    for kind in (pb.Schema.Avro, pb.Schema.Json):
        names = Pseudonyms(KEY)
        data = json.dumps(original).encode()
        schema = pb.Schema(name="invoices", type=kind, schema_data=data)
        copied = json.loads(copied_schema(producer(schema), names).schema_data)
        assert "acme" not in json.dumps(copied) and "billing" not in json.dumps(copied)
        assert_avro_names_valid(copied)
        fastavro.parse_schema(copied)
        tenant = schema_name(names.name("tenant", "acme"))
        namespace = schema_name(names.name("namespace", "billing"))
        assert copied["namespace"] == f"com.{tenant}.{namespace}"
        assert copied["fields"][0]["type"]["name"] == f"{tenant}Customer"
        assert copied["fields"][1]["type"]["symbols"] == [tenant, namespace, "other"]


def test_a_key_value_schemas_avro_parts_names_stay_avro_names() -> None:
    """The same in each part of a KEY_VALUE schema."""
    part = json.dumps(invoice_schema()).encode()
    data = b"".join(len(p).to_bytes(4, "big") + p for p in (part, part))
    schema = pb.Schema(name="kv", type=pb.Schema.KeyValue, schema_data=data)
    copied = copied_schema(producer(schema), Pseudonyms(KEY)).schema_data
    key_size = int.from_bytes(copied[:4], "big")
    key_part, value_part = copied[4 : 4 + key_size], copied[8 + key_size :]
    assert key_part == value_part
    assert_avro_names_valid(json.loads(key_part))


def test_schema_name_is_the_pseudonym_with_underscores() -> None:
    """The form a schema's definition holds: stable, the same pseudonym."""
    names = Pseudonyms(KEY)
    pseudonym = names.name("tenant", "acme")
    assert schema_name(pseudonym) == pseudonym.replace("-", "_")
    assert AVRO_NAME.fullmatch(schema_name(names.name("namespace", "billing")))


def test_a_schemas_properties_are_scrubbed_not_replaced() -> None:
    """A schema's properties say how a broker reads its definition (a
    KEY_VALUE schema's parts' types and encoding, an Avro schema's
    ``__alwaysAllowNull``): their values became ``value-…``, which a
    broker cannot read (``SchemaType.valueOf``), so the copy's KEY_VALUE
    schema was refused on replay; and ``key.schema.type`` (it holds
    ``key``) became the credential marker. The properties Pulsar defines
    are scrubbed as free text, as the definition is; any other as a
    property still, a credential's value by the marker."""
    avro = json.dumps({"type": "record", "name": "Key", "fields": []}).encode()
    data = b"".join(len(p).to_bytes(4, "big") + p for p in (avro, avro))
    schema = pb.Schema(name="kv", type=pb.Schema.KeyValue, schema_data=data)
    props = {
        "key.schema.type": "AVRO", "value.schema.type": "JSON", "kv.encoding.type": "SEPARATED",
        "key.schema.name": "acme-keys", "__alwaysAllowNull": "true", "api-token": "SECRET99",
        "key.schema.properties": json.dumps({"__alwaysAllowNull": "true", "owner": "alice"}),
        "value.schema.properties": "{}", "owner": "alice",
    }  # fmt: skip
    schema.properties.extend([pb.KeyValue(key=k, value=v) for k, v in props.items()])
    names = Pseudonyms(KEY)
    copied = {kv.key: kv.value for kv in copied_schema(producer(schema), names).properties}
    tenant, alice = names.name("tenant", "acme"), names.name("value", "alice")
    assert copied == {
        **props, "key.schema.name": f"{tenant}-keys", "api-token": "<redacted>", "owner": alice,
        "key.schema.properties": json.dumps({"__alwaysAllowNull": "true", "owner": alice},
                                            separators=(",", ":")),
    }  # fmt: skip
    assert "SECRET99" not in names.originals()
