"""sluice.filters.schemas: payloads checked against Pulsar schemas, type by type."""

from __future__ import annotations

import base64
import enum
import io
import json
import re
import struct
from typing import Any

import fastavro
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message as ProtoMessage

from sluice.filters.schemas import Mismatch, SchemaUnsupported, Validator, validator
from sluice.protocols.filtering import Schema

# -- helpers -----------------------------------------------------------------

ADDRESS: dict[str, Any] = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}],
}

USER: dict[str, Any] = {
    "type": "record",
    "name": "User",
    "namespace": "ex",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "address", "type": ADDRESS},
        # A nullable record, named by reference to the one defined above.
        {"name": "home", "type": ["null", "Address"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def avro(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def user(**changes: Any) -> dict[str, Any]:
    datum: dict[str, Any] = {
        "id": 7,
        "name": "ada",
        "email": None,
        "address": {"city": "Oslo", "zip": 150},
        "home": None,
        "tags": [],
    }
    datum.update(changes)
    return datum


def check(schema: Schema, payload: bytes, key: bytes | None = None) -> Mismatch | None:
    return validator(schema)(payload, key)


def mismatch(schema: Schema, payload: bytes, key: bytes | None = None) -> Mismatch:
    found = check(schema, payload, key)
    assert found is not None, f"{payload!r} passed"
    return found


AVRO_USER = Schema("AVRO", json.dumps(USER).encode())

# -- AVRO --------------------------------------------------------------------


def test_avro_payloads_written_for_the_schema_pass() -> None:
    check_user = validator(AVRO_USER)
    home = {"city": "Bergen", "zip": 5003}
    for datum in (user(), user(email="a@b.c", tags=["x", "y"]), user(home=home)):
        assert check_user(avro(USER, datum), None) is None


def test_avro_garbage_names_the_first_field() -> None:
    found = mismatch(AVRO_USER, b"")
    assert found.reason == "not_avro"
    assert found.message.startswith("field 'id':") and "ends early" in found.message


def test_avro_truncated_payload_names_the_nested_field() -> None:
    good = avro(USER, user())
    # The payload ends with address.zip (150: two varint bytes), home's null
    # branch and the empty tags array: cut into the zip.
    found = mismatch(AVRO_USER, good[:-3])
    assert found.reason == "not_avro"
    assert found.message.startswith("field 'address.zip': cannot read int")


def test_avro_trailing_bytes() -> None:
    found = mismatch(AVRO_USER, avro(USER, user()) + b"\x00\x00")
    assert found.reason == "trailing_bytes"
    assert found.message.startswith("value: 2 bytes left after the record ex.User")


def test_avro_payload_of_another_schema_names_the_field() -> None:
    other = {
        "type": "record",
        "name": "Other",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "label", "type": "string"},
            {"name": "count", "type": "int"},
        ],
    }
    # count=5 is read where User has its email union: branch 5 of 2.
    found = mismatch(AVRO_USER, avro(other, {"id": 1, "label": "x", "count": 5}))
    assert found.reason == "not_avro"
    assert found.message == "field 'email': union branch 5 does not exist in null or string"


def test_avro_bad_text_inside_a_nullable_record_is_named() -> None:
    good = avro(USER, user(home={"city": "Rome", "zip": 1}))
    bad = good.replace(b"Rome", b"R\xffme")
    found = mismatch(AVRO_USER, bad)
    assert found.reason == "not_avro"
    assert found.message.startswith("field 'home.city':")
    assert "UTF-8" in found.message


def test_avro_schema_that_is_not_a_record() -> None:
    check_text = validator(Schema("AVRO", b'"string"'))
    assert check_text(avro("string", "hi"), None) is None
    found = check_text(b"\x04\xff\xfe", None)
    assert found is not None and found.reason == "not_avro"
    assert found.message.startswith("value: cannot read string")


def test_avro_enum_index_out_of_range() -> None:
    color = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
    schema = {"type": "record", "name": "Paint", "fields": [{"name": "color", "type": color}]}
    check_paint = validator(Schema("AVRO", json.dumps(schema).encode()))
    assert check_paint(avro(schema, {"color": "GREEN"}), None) is None
    found = check_paint(b"\x04", None)  # index 2
    assert found == Mismatch("not_avro", "field 'color': symbol 2 does not exist in enum Color")


def test_avro_logical_types_are_checked_as_their_encoding() -> None:
    stamp = {"type": "long", "logicalType": "timestamp-millis"}
    schema = {"type": "record", "name": "Event", "fields": [{"name": "at", "type": stamp}]}
    plain = {"type": "record", "name": "Event", "fields": [{"name": "at", "type": "long"}]}
    check_event = validator(Schema("AVRO", json.dumps(schema).encode()))
    # Past the year 9999: valid Avro that a datetime conversion would refuse.
    assert check_event(avro(plain, {"at": 2**62}), None) is None
    assert check_event(b"", None) is not None


def test_avro_validator_is_reusable_after_a_failure() -> None:
    check_user = validator(AVRO_USER)
    good = avro(USER, user())
    assert check_user(b"\x01", None) is not None
    assert check_user(good, None) is None
    assert check_user(good[:3], None) is not None


# -- JSON --------------------------------------------------------------------

JSON_USER_DEFINITION: dict[str, Any] = {
    "type": "record",
    "name": "User",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"]},
        {"name": "score", "type": "double", "default": 0.0},
        {"name": "address", "type": ADDRESS},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}, "default": {}},
    ],
}
JSON_USER = Schema("JSON", json.dumps(JSON_USER_DEFINITION).encode())


def json_user(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": 1,
        "name": "ada",
        "email": "a@b.c",
        "score": 2,
        "address": {"city": "Oslo", "zip": 150},
        "tags": ["x"],
        "kind": "B",
        "attrs": {"n": 3},
    }
    doc.update(changes)
    return doc


def encoded(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_json_good_documents_pass() -> None:
    check_user = validator(JSON_USER)
    assert check_user(encoded(json_user()), None) is None
    assert check_user(encoded(json_user(email=None, score=1.5, extra={"x": 1})), None) is None
    # Pulsar's JSON writer leaves nulls out; defaulted fields may be absent too.
    sparse = json_user()
    for name in ("email", "score", "attrs"):
        del sparse[name]
    assert check_user(encoded(sparse), None) is None


def test_json_missing_required_field() -> None:
    doc = json_user()
    del doc["name"]
    found = mismatch(JSON_USER, encoded(doc))
    assert found.reason == "missing_field"
    assert found.message == "field 'name': missing (expected string)"


def test_json_missing_nested_field() -> None:
    found = mismatch(JSON_USER, encoded(json_user(address={"city": "Oslo"})))
    assert found.reason == "missing_field"
    assert found.message.startswith("field 'address.zip': missing")


def test_json_wrong_type_names_the_field() -> None:
    found = mismatch(JSON_USER, encoded(json_user(id="abc")))
    assert found == Mismatch("wrong_type", "field 'id': expected int, got string 'abc'")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": True}, "id"),  # a boolean is no integer
        ({"id": 1.5}, "id"),
        ({"id": 2**31}, "id"),
        ({"score": "high"}, "score"),
        ({"email": 5}, "email"),
        ({"email": {"a": 1}}, "email"),
        ({"address": {"city": "Oslo", "zip": "0150"}}, "address.zip"),
        ({"address": [1]}, "address"),
        ({"tags": ["x", 2]}, "tags[1]"),
        ({"kind": "C"}, "kind"),
        ({"attrs": {"n": "3"}}, "attrs[n]"),
    ],
)
def test_json_wrong_types(changes: dict[str, Any], field: str) -> None:
    found = mismatch(JSON_USER, encoded(json_user(**changes)))
    assert found.reason == "wrong_type"
    assert found.message.startswith(f"field '{field}': ")


@pytest.mark.parametrize("payload", [b"{not json", b'{"id": 1', b"\xff{}", b"", b'{"id": NaN}'])
def test_json_not_json(payload: bytes) -> None:
    found = mismatch(JSON_USER, payload)
    assert found.reason == "not_json"
    assert found.message.startswith("value: ")


def test_json_nullable_field_names_both_types() -> None:
    found = mismatch(JSON_USER, encoded(json_user(email=5)))
    assert found.message == "field 'email': expected null or string, got number 5"


def test_json_top_level_must_be_an_object() -> None:
    found = mismatch(JSON_USER, b"[1, 2]")
    assert found == Mismatch("wrong_type", "value: expected object, got array")


# -- PROTOBUF_NATIVE ---------------------------------------------------------

F = descriptor_pb2.FieldDescriptorProto


def order_files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    """orders.proto (proto3, package ex) imports items.proto."""
    items = descriptor_pb2.FileDescriptorProto(name="items.proto", package="ex", syntax="proto3")
    item = items.message_type.add(name="Item")
    item.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    orders = descriptor_pb2.FileDescriptorProto(
        name="orders.proto", package="ex", syntax="proto3", dependency=["items.proto"]
    )
    order = orders.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    order.field.add(
        name="item", number=3, type=F.TYPE_MESSAGE, type_name=".ex.Item", label=F.LABEL_OPTIONAL
    )
    order.field.add(
        name="lines", number=4, type=F.TYPE_MESSAGE, type_name=".ex.Item", label=F.LABEL_REPEATED
    )
    return orders, items


def native_schema(
    files: list[descriptor_pb2.FileDescriptorProto],
    root: str = "ex.Order",
    root_file: str = "orders.proto",
) -> Schema:
    fds = descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()
    doc = {
        "fileDescriptorSet": base64.b64encode(fds).decode(),
        "rootMessageTypeName": root,
        "rootFileDescriptorName": root_file,
    }
    return Schema("PROTOBUF_NATIVE", json.dumps(doc).encode())


def message_class(files: list[descriptor_pb2.FileDescriptorProto], name: str) -> type[ProtoMessage]:
    pool = descriptor_pool.DescriptorPool()
    for f in files:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def test_protobuf_native_good_messages_pass() -> None:
    orders, items = order_files()
    # Root file first: the validator adds the import before it.
    check_order = validator(native_schema([orders, items]))
    order = message_class([items, orders], "ex.Order")
    good = order(id="o-1", qty=3)
    good.item.sku = "s-1"  # type: ignore[attr-defined]
    good.lines.add(sku="s-2")  # type: ignore[attr-defined]
    assert check_order(good.SerializeToString(), None) is None
    assert check_order(b"", None) is None  # proto3: every field at its default


def test_protobuf_native_bytes_that_do_not_parse() -> None:
    orders, items = order_files()
    found = mismatch(native_schema([orders, items]), b"\xff\xff\xff\xff")
    assert found.reason == "not_protobuf"
    assert found.message.startswith("value: not a ex.Order message")


def test_protobuf_native_unknown_field_number() -> None:
    orders, items = order_files()
    order = message_class([items, orders], "ex.Order")
    payload = order(id="o-1").SerializeToString() + b"\x48\x01"  # field 9, varint 1
    found = mismatch(native_schema([orders, items]), payload)
    assert found.reason == "unknown_field"
    assert found.message == "unknown field number 9 (varint) in ex.Order"


def test_protobuf_native_unknown_field_in_a_nested_message() -> None:
    orders, items = order_files()
    # lines[0] = Item{sku: "a", 7: 1}: field 4, length 5.
    payload = b"\x22\x05\x0a\x01a\x38\x01"
    found = mismatch(native_schema([orders, items]), payload)
    assert found.reason == "unknown_field"
    assert found.message == "unknown field number 7 (varint) in field 'lines[0]'"


def test_protobuf_native_proto2_required_field() -> None:
    file = descriptor_pb2.FileDescriptorProto(name="p2.proto", package="ex", syntax="proto2")
    msg = file.message_type.add(name="Ping")
    msg.field.add(name="seq", number=1, type=F.TYPE_INT64, label=F.LABEL_REQUIRED)
    msg.field.add(name="note", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    check_ping = validator(native_schema([file], "ex.Ping", "p2.proto"))
    ping = message_class([file], "ex.Ping")
    assert check_ping(ping(seq=1).SerializeToString(), None) is None
    found = check_ping(ping(note="x").SerializePartialToString(), None)
    assert found == Mismatch("missing_field", "field 'seq': required but missing")


def test_protobuf_native_broken_definitions() -> None:
    orders, items = order_files()
    with pytest.raises(SchemaUnsupported, match=re.escape("'items.proto' is not in the set")):
        validator(native_schema([orders]))
    with pytest.raises(SchemaUnsupported, match=re.escape("root message 'ex.Nope'")):
        validator(native_schema([orders, items], root="ex.Nope"))
    with pytest.raises(SchemaUnsupported, match=re.escape("not in 'orders.proto'")):
        validator(native_schema([orders, items], root="ex.Item"))
    with pytest.raises(SchemaUnsupported, match="not the expected JSON document"):
        validator(Schema("PROTOBUF_NATIVE", b'{"fileDescriptorSet": ""}'))
    bad_base64 = b'{"fileDescriptorSet": "%%%", "rootMessageTypeName": "a.B",'
    bad_base64 += b' "rootFileDescriptorName": "a.proto"}'
    with pytest.raises(SchemaUnsupported, match="not a serialized FileDescriptorSet"):
        validator(Schema("PROTOBUF_NATIVE", bad_base64))


# -- fixed-width types and STRING --------------------------------------------

SIZES = {
    "BOOLEAN": 1,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FLOAT": 4,
    "DOUBLE": 8,
    "DATE": 8,
    "TIME": 8,
    "TIMESTAMP": 8,
    "INSTANT": 12,
    "LOCAL_DATE": 8,
    "LOCAL_TIME": 8,
    "LOCAL_DATE_TIME": 16,
}


@pytest.mark.parametrize(("kind", "size"), sorted(SIZES.items()))
def test_fixed_sizes(kind: str, size: int) -> None:
    check_value = validator(Schema(kind, b""))
    assert check_value(b"\x01" * size, None) is None
    for wrong in (size - 1, size + 1):
        found = check_value(b"\x01" * wrong, None)
        assert found == Mismatch("wrong_size", f"{kind} value: expected {size} bytes, got {wrong}")


def test_fixed_width_values_as_pulsar_encodes_them() -> None:
    assert check(Schema("INT32", b""), struct.pack(">i", -5)) is None
    assert check(Schema("DOUBLE", b""), struct.pack(">d", 2.5)) is None
    assert check(Schema("INSTANT", b""), struct.pack(">qi", 1_700_000_000, 5)) is None
    assert check(Schema("LOCAL_DATE_TIME", b""), struct.pack(">qq", 19_000, 10**12)) is None
    # Pulsar's BooleanSchema checks the size only and reads any non-zero byte as true.
    assert check(Schema("BOOLEAN", b""), b"\x02") is None


def test_string_utf8() -> None:
    text = Schema("STRING", b"")
    assert check(text, "héllo wörld".encode()) is None
    found = mismatch(text, b"ok\xc3(")
    assert found.reason == "not_utf8"
    assert found.message.startswith("STRING value: byte 2 is not valid UTF-8")


def test_string_charset_property() -> None:
    latin1 = Schema("STRING", b"", {"__charset": "ISO-8859-1"})
    assert check(latin1, b"caf\xe9") is None
    ascii_only = Schema("STRING", b"", {"__charset": "US-ASCII"})
    assert mismatch(ascii_only, b"caf\xe9").reason == "not_utf8"
    with pytest.raises(SchemaUnsupported, match="unknown charset"):
        validator(Schema("STRING", b"", {"__charset": "no-such-charset"}))


@pytest.mark.parametrize("kind", ["NONE", "BYTES", "AUTO_CONSUME"])
def test_types_without_a_layout_accept_anything(kind: str) -> None:
    check_any = validator(Schema(kind, b"whatever"))
    assert check_any(b"\xff\x00 anything", None) is None
    assert check_any(b"", b"key") is None


# -- KEY_VALUE ---------------------------------------------------------------


def framed(first: bytes | None, second: bytes | None) -> bytes:
    """Two parts behind 4-byte big-endian lengths, -1 for a null part."""
    out = b""
    for part in (first, second):
        out += struct.pack(">i", -1) if part is None else struct.pack(">i", len(part)) + part
    return out


def key_value(
    encoding: str,
    key: tuple[str, bytes] = ("STRING", b""),
    value: tuple[str, bytes] = ("AVRO", json.dumps(USER).encode()),
    key_properties: dict[str, str] | None = None,
) -> Validator:
    properties = {
        "key.schema.type": key[0],
        "key.schema.properties": json.dumps(key_properties or {}),
        "value.schema.type": value[0],
        "value.schema.properties": "{}",
        "kv.encoding.type": encoding,
    }
    return validator(Schema("KEY_VALUE", framed(key[1], value[1]), properties))


def test_key_value_inline() -> None:
    check_kv = key_value("INLINE")
    good_value = avro(USER, user())
    assert check_kv(framed(b"k-1", good_value), None) is None
    assert check_kv(framed(None, good_value), None) is None  # a null key
    assert check_kv(framed(b"k-1", None), None) is None  # a null value

    found = check_kv(framed(b"k\xff", good_value), None)
    assert found is not None and found.reason == "not_utf8"
    assert found.message.startswith("key: STRING value: byte 1")

    found = check_kv(framed(b"k-1", good_value[:-3]), None)
    assert found is not None and found.reason == "not_avro"
    assert found.message.startswith("value: field 'address.zip': ")


def test_key_value_inline_framing() -> None:
    check_kv = key_value("INLINE")
    good = framed(b"k", avro(USER, user()))
    for broken in (b"\x00\x00", good[:-1], struct.pack(">i", -2) + good[4:]):
        found = check_kv(broken, None)
        assert found is not None and found.reason == "not_key_value"
        assert found.message.startswith("key/value: ")
    found = check_kv(good + b"\x00", None)
    assert found == Mismatch("trailing_bytes", "key/value: 1 byte left after the value")


def test_key_value_separated() -> None:
    check_kv = key_value("SEPARATED", key=("AVRO", json.dumps(ADDRESS).encode()))
    good_key = avro(ADDRESS, {"city": "Oslo", "zip": 1})
    good_value = avro(USER, user())
    assert check_kv(good_value, good_key) is None
    assert check_kv(good_value, None) is None  # Pulsar's client sends a null key as none

    found = check_kv(good_value, good_key + b"\x00")
    assert found is not None and found.reason == "trailing_bytes"
    assert found.message.startswith("key: ")

    found = check_kv(b"\x00", good_key)
    assert found is not None and found.reason == "not_avro"
    assert found.message.startswith("value: field 'name': ")


def test_key_value_parts_keep_their_properties() -> None:
    check_kv = key_value(
        "SEPARATED", value=("STRING", b""), key_properties={"__charset": "ISO-8859-1"}
    )
    assert check_kv(b"ok", b"\xe9") is None  # Latin-1 key
    found = check_kv(b"\xe9", b"ok")  # the value stays UTF-8
    assert found is not None and found.message.startswith("value: STRING value")


def test_key_value_broken_definitions() -> None:
    with pytest.raises(SchemaUnsupported, match="encoding 'SIDEWAYS'"):
        key_value("SIDEWAYS")
    with pytest.raises(SchemaUnsupported, match="KEY_VALUE value: AVRO"):
        key_value("INLINE", value=("AVRO", b"{"))
    with pytest.raises(SchemaUnsupported, match="definition: key length 9 does not fit"):
        validator(Schema("KEY_VALUE", b"\x00\x00\x00\x09ab", {}))


# -- schemas that cannot be checked ------------------------------------------


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (Schema("AVRO", b"{not json"), "not JSON"),
        (Schema("AVRO", b'{"type": "record", "fields": []}'), "not an Avro schema"),
        (
            Schema(
                "AVRO",
                b'{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}',
            ),
            "not an Avro schema",
        ),
        # Pulsar's old JSON schemas were JSON Schema documents, not Avro.
        (Schema("JSON", b'{"type": "object", "properties": {}}'), "not an Avro schema"),
        (Schema("PROTOBUF", json.dumps(USER).encode()), "cannot be checked"),
        (Schema("EXTERNAL", b""), "cannot be checked"),
    ],
)
def test_schema_unsupported(schema: Schema, why: str) -> None:
    with pytest.raises(SchemaUnsupported, match=why):
        validator(schema)


@pytest.mark.parametrize(
    "definition",
    [
        {"type": "array", "items": "null"},
        {"type": "record", "name": "R", "fields": [
            {"name": "a", "type": {"type": "array", "items": {
                "type": "record", "name": "E", "fields": [{"name": "n", "type": "null"}]}}},
        ]},
        {"type": "map", "values": {"type": "array", "items": {"type": "fixed", "name": "F",
                                                              "size": 0}}},
        # An Avro error is a record by another name.
        {"type": "array", "items": {"type": "error", "name": "E", "fields": []}},
        {"type": "array", "items": {"type": "record", "name": "R", "fields": [
            {"name": "e", "type": {"type": "error", "name": "E", "fields": []}}]}},
        {"type": "error", "name": "W", "fields": [
            {"name": "a", "type": {"type": "array", "items": "null"}}]},
    ],
)  # fmt: skip
def test_arrays_of_items_that_take_no_bytes_are_not_checked(definition: Any) -> None:
    # A payload of a few bytes could claim billions of such items, each read
    # one by one: the proxy's thread would be held by one message.
    with pytest.raises(SchemaUnsupported, match="items that take no bytes"):
        validator(Schema("AVRO", json.dumps(definition).encode()))


def test_maps_and_arrays_of_real_items_are_checked() -> None:
    definition = {"type": "record", "name": "R", "fields": [
        {"name": "m", "type": {"type": "map", "values": "null"}},
        {"name": "a", "type": {"type": "array", "items": "int"}},
    ]}  # fmt: skip
    check = validator(Schema("AVRO", json.dumps(definition).encode()))
    assert check(b"\x00\x00", None) is None


def test_a_long_map_key_is_cut_short_in_the_message() -> None:
    """The key is the producer's data: a rejection names where, briefly."""
    definition = {"type": "record", "name": "R", "fields": [
        {"name": "m", "type": {"type": "map", "values": "int"}},
    ]}  # fmt: skip
    check = validator(Schema("JSON", json.dumps(definition).encode()))
    found = check(json.dumps({"m": {"k" * 100_000: "not an int"}}).encode(), None)
    assert found is not None and found.reason == "wrong_type"
    assert found.message == f"field 'm[{'k' * 37}...]': expected int, got string 'not an int'"


def test_json_enum_as_the_python_client_writes_it() -> None:
    """Pulsar's Python client writes an enum field as its member's value (a
    number for ``class Color(Enum): red = 1``), and reads that back; Jackson
    reads a number as the symbol's position. Both pass; other types do not."""
    from pulsar.schema import CustomEnum, JsonSchema, Record

    class Color(enum.Enum):
        red = 1
        green = 2

    class Paint(Record):  # type: ignore[misc]  # pulsar ships no types
        color = CustomEnum(Color, required=True)

    schema = JsonSchema(Paint)
    check_paint = validator(Schema("JSON", schema.schema_info().schema().encode()))
    written = schema.encode(Paint(color=Color.green))
    assert json.loads(written) == {"color": 2}
    assert check_paint(written, None) is None
    assert check_paint(b'{"color": "red"}', None) is None
    for wrong in (b'{"color": "blue"}', b'{"color": 1.5}', b'{"color": true}'):
        found = check_paint(wrong, None)
        assert found is not None and found.reason == "wrong_type", wrong
        assert found.message.startswith("field 'color': expected one of 'red', 'green'")


def test_json_non_finite_numbers_as_jackson_writes_them() -> None:
    """Pulsar's Java JSON writer (Jackson, WRITE_NAN_AS_STRINGS on by
    default) writes a double that is NaN or infinite as text, and reads that
    text back; bare NaN is still no JSON, and other text no number."""
    definition = {"type": "record", "name": "Reading", "fields": [
        {"name": "celsius", "type": "double"},
        {"name": "ratio", "type": ["null", "float"], "default": None},
    ]}  # fmt: skip
    check_reading = validator(Schema("JSON", json.dumps(definition).encode()))
    for text in ("NaN", "Infinity", "-Infinity"):
        assert check_reading(encoded({"celsius": text, "ratio": text}), None) is None
    for wrong in ("nan", "inf", "12.5", ""):
        found = check_reading(encoded({"celsius": wrong}), None)
        assert found is not None and found.reason == "wrong_type", wrong
        assert found.message.startswith("field 'celsius': expected double, got string")
    for other in ({"x": 1}, [1], True, None):
        found = check_reading(encoded({"celsius": other}), None)
        assert found is not None and found.reason == "wrong_type", other
    found = check_reading(b'{"celsius": NaN}', None)
    assert found is not None and found.reason == "not_json"


def test_a_refusal_names_a_credential_field_but_never_shows_its_value() -> None:
    # The refusal is the client's SEND_ERROR, which Sluice records and logs.
    avro = {"type": "record", "name": "Login", "fields": [
        {"name": "user", "type": "string"},
        {"name": "password", "type": "int"},
        {"name": "apiKey", "type": "int"},
        {"name": "tokens", "type": {"type": "map", "values": "int"}},
    ]}  # fmt: skip
    check = validator(Schema("JSON", json.dumps(avro).encode()))
    base = {"user": "u", "password": 1, "apiKey": 2, "tokens": {}}

    def refused(**fields: Any) -> str:
        found = check(json.dumps(base | fields).encode(), None)
        assert found is not None
        return found.message

    assert refused(password="hunter2-SECRET") == ("field 'password': expected int, got a string")
    assert refused(apiKey=2**40) == "field 'apiKey': its value is out of range for int"
    assert refused(tokens={"session": "s3cr3t"}) == (
        "field 'tokens[session]': expected int, got a string"
    )
    # Other fields still show what came, to help the producer's author.
    assert refused(user=5) == "field 'user': expected string, got number 5"
