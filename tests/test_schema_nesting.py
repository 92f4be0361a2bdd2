"""Schemas and payloads nested deep: checked in bounded time and stack.

A recursive Avro schema (a record that holds itself, through a union, an
array or a map) lets a payload nest as deep as its bytes allow, two bytes a
level: a producer must not be able to crash or hold the proxy with one."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import fastavro
import pytest

from sluice.filters.schemas import Mismatch, SchemaUnsupported, validator
from sluice.protocols.filtering import Schema

LIST: dict[str, Any] = {
    "type": "record",
    "name": "Node",
    "namespace": "ex",
    "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
}

TREE: dict[str, Any] = {
    "type": "record",
    "name": "Tree",
    "fields": [
        {"name": "label", "type": "string"},
        {"name": "children", "type": {"type": "array", "items": "Tree"}},
        {"name": "named", "type": {"type": "map", "values": "Tree"}},
    ],
}


def avro(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def chain(levels: int) -> dict[str, Any]:
    node: dict[str, Any] | None = None
    for v in range(levels):
        node = {"v": v, "next": node}
    assert node is not None
    return node


def test_a_recursive_schema_checks_what_its_writer_writes() -> None:
    check = validator(Schema("AVRO", json.dumps(LIST).encode()))
    assert check(avro(LIST, chain(50)), None) is None
    tree = {"label": "a", "children": [{"label": "b", "children": [], "named": {}}], "named": {
        "c": {"label": "c", "children": [], "named": {}}}}  # fmt: skip
    assert validator(Schema("AVRO", json.dumps(TREE).encode()))(avro(TREE, tree), None) is None
    bad = avro(LIST, chain(50))[:-1]
    found = check(bad, None)
    assert found is not None and found.reason == "not_avro"
    assert found.message.startswith("field 'next.next.")


@pytest.mark.parametrize("levels", [1_000, 200_000])
@pytest.mark.parametrize("whole", [True, False])
def test_a_payload_nested_past_any_stack_is_refused_in_bounded_time(
    levels: int, whole: bool
) -> None:
    """Two bytes a level (branch 1: a Node; v = 1), ended (branch 0) or cut
    short: before, 10,000 levels crashed the process (the compiled reader's
    C stack), and a thousand cut short took seconds to locate."""
    check = validator(Schema("AVRO", json.dumps(LIST).encode()))
    payload = b"\x02\x02" * levels + (b"\x00" if whole else b"")
    started = time.monotonic()
    found = check(payload, None)
    assert time.monotonic() - started < 2.0
    assert isinstance(found, Mismatch) and found.reason == "not_avro"
    assert "nested deeper" in found.message


def test_a_tree_nested_through_arrays_is_bounded_too() -> None:
    # label "", one child (block of 1), ... then an empty array and map at the bottom.
    level = b"\x00" + b"\x02"
    payload = level * 100_000 + b"\x00\x00" + b"\x00\x00" * 100_000
    found = validator(Schema("AVRO", json.dumps(TREE).encode()))(payload, None)
    assert isinstance(found, Mismatch) and "nested deeper" in found.message


def test_a_definition_nested_past_the_json_reader_is_not_checkable() -> None:
    definition = '{"type":"array","items":' * 100_000 + '"int"' + "}" * 100_000
    with pytest.raises(SchemaUnsupported, match="nested too deep"):
        validator(Schema("AVRO", definition.encode()))
    with pytest.raises(SchemaUnsupported, match="nested too deep"):
        validator(Schema("JSON", definition.encode()))
    with pytest.raises(SchemaUnsupported, match="PROTOBUF_NATIVE schema definition"):
        validator(Schema("PROTOBUF_NATIVE", definition.encode()))
    nested_properties = {
        "key.schema.type": "STRING",
        "value.schema.type": "STRING",
        "key.schema.properties": "[" * 100_000 + "]" * 100_000,
    }
    kv = Schema("KEY_VALUE", b"\0\0\0\0\0\0\0\0", nested_properties)
    with pytest.raises(SchemaUnsupported, match=r"key\.schema\.properties"):
        validator(kv)
