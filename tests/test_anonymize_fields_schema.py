"""``sluice record anonymize`` on a frame's schema (PRODUCER, SUBSCRIBE,
GET_SCHEMA's answer …), built here as a client sends it, without a broker:
the copy's schema must still be one a broker takes on replay."""

from __future__ import annotations

import base64
import json

from google.protobuf import descriptor_pb2, descriptor_pool

from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import encode, pb
from sluice.protocols.pulsar.anonymize import anonymized_frame
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
