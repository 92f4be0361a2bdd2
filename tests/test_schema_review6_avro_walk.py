"""The Avro check reads a payload with fastavro's compiled reader, then walks
it for a negative union branch or enum index and for a varint longer than
Java's Avro decoder reads (``avro_indexes``), instead of reading every
payload with fastavro's Python reader (some 6 times slower on large
payloads).

What it refuses must be what the Python reader over a decoder that refuses
a negative index, an int or index past 5 bytes and a long, length or count
past 10 refuses (the reference: tests/test_filters_review5_avro.py and
tests/test_review7_avro_varint_length.py have cases by hand): these tests
hold the two to each other on payloads written from random data, then with
one byte changed or one varint padded."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import hypothesis.strategies as st
import pytest
from fastavro import _read_py
from fastavro.io.binary_decoder import BinaryDecoder
from hypothesis import HealthCheck, given, settings

from sluice.filters.avro_indexes import walker
from sluice.filters.schemas import validator
from sluice.protocols.filtering import Schema

SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

ADDRESS = {
    "type": "record",
    "name": "Address",
    "namespace": "ex",
    "fields": [
        {"name": "city", "type": ["null", "string"]},
        {"name": "zip", "type": ["null", "int", "bytes"]},
    ],
}
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
SCHEMAS: dict[str, Any] = {
    "nullable": {
        "type": "record",
        "name": "R",
        "fields": [{"name": "f", "type": ["null", "string"]}],
    },
    "nested": {
        "type": "record",
        "name": "N",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "home", "type": ["null", ADDRESS]},
            {"name": "work", "type": ["null", "ex.Address"]},
            {"name": "color", "type": COLOR},
            {"name": "ok", "type": "boolean"},
            {"name": "h", "type": {"type": "fixed", "name": "H", "size": 3}},
        ],
    },
    "collections": {
        "type": "record",
        "name": "C",
        "fields": [
            {"name": "tags", "type": {"type": "array", "items": ["null", "string", "double"]}},
            {"name": "colors", "type": {"type": "map", "values": COLOR}},
            {"name": "plain", "type": {"type": "array", "items": "string"}},
            {"name": "more", "type": {"type": "array", "items": ["null", "Color"]}},
            {"name": "maybe", "type": ["null", {"type": "array", "items": "float"}]},
        ],
    },
    "top_union": ["null", "long", {"type": "enum", "name": "E", "symbols": ["X"]}],
}


class _Strict(BinaryDecoder):
    def __init__(self, stream: io.BytesIO) -> None:
        super().__init__(stream)  # type: ignore[no-untyped-call]
        self.stream = stream

    def _at_most(self, length: int) -> int:
        start = self.stream.tell()
        value: int = super().read_long()  # type: ignore[no-untyped-call]
        if self.stream.tell() - start > length:
            raise ValueError("too long for Java")
        return value

    def read_long(self) -> int:
        return self._at_most(10)

    def read_int(self) -> int:
        return self._at_most(5)

    def read_index(self) -> int:
        index = self.read_int()
        if index < 0:
            raise IndexError(index)
        return index

    def read_enum(self) -> int:
        return self.read_index()


def _reference(parsed: Any, named: Any, payload: bytes) -> bool:
    """Whether fastavro's Python reader, refusing a negative index, reads
    the whole payload."""
    stream = io.BytesIO(payload)
    options = {"return_record_name": False, "return_record_name_override": False,
               "handle_unicode_errors": "strict", "return_named_type": False,
               "return_named_type_override": False}  # fmt: skip
    try:
        _read_py.read_data(  # type: ignore[no-untyped-call]
            _Strict(stream), parsed, {"writer": named, "reader": {}}, None, options
        )
    except Exception:
        return False
    return stream.tell() == len(payload)


def _values(node: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    if isinstance(node, list):
        return st.one_of([_values(branch, named) for branch in node])
    if isinstance(node, str):
        if node in named:
            return _values(named[node], named)
        return {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "string": st.text(max_size=8),
            "bytes": st.binary(max_size=8),
        }[node]
    kind = node["type"]
    if kind == "record":
        named[node["name"]] = node
        if "namespace" in node:
            named[f"{node['namespace']}.{node['name']}"] = node
        return st.fixed_dictionaries({f["name"]: _values(f["type"], named) for f in node["fields"]})
    if kind == "enum":
        named[node["name"]] = node
        return st.sampled_from(node["symbols"])
    if kind == "fixed":
        return st.binary(min_size=node["size"], max_size=node["size"])
    if kind == "array":
        return st.lists(_values(node["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=4), _values(node["values"], named), max_size=3)
    return _values(kind, named)


def _payloads(schema: Any) -> st.SearchStrategy[bytes]:
    parsed = fastavro.parse_schema(schema)

    def written(value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        return out.getvalue()

    # Named types are registered as their strategies are built: build first.
    values = _values(schema, {})
    return values.map(written)


# A byte to put somewhere: negative indexes (-1, -2, -3), small positive
# ones, a byte that continues a varint, and anything.
_BYTES = st.one_of(st.sampled_from([0x01, 0x03, 0x05, 0x00, 0x02, 0x04, 0x80]), st.integers(0, 255))


def _padded(payload: bytes, at: int, extra: int) -> bytes:
    """``payload`` with the varint that ends at ``at`` (when one does) made
    ``extra`` bytes longer, its value kept: what fastavro reads alike and
    Java's decoder fails on past 5 bytes (ints, indexes) or 10 (longs)."""
    pad = bytes([payload[at] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"
    return payload[:at] + pad + payload[at + 1 :]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@SETTINGS
@given(data=st.data())
def test_the_check_refuses_what_the_python_reader_refuses(name: str, data: st.DataObject) -> None:
    schema = SCHEMAS[name]
    payload = data.draw(_payloads(schema))
    change = data.draw(st.sampled_from(["none", "byte", "pad"]))
    if change != "none" and payload:
        at = data.draw(st.integers(0, len(payload) - 1))
        if change == "byte":
            payload = payload[:at] + bytes([data.draw(_BYTES)]) + payload[at + 1 :]
        elif payload[at] < 0x80:
            payload = _padded(payload, at, data.draw(st.integers(1, 10)))
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema, named_schemas=named)
    check = validator(Schema("AVRO", json.dumps(schema).encode(), {}, None))
    assert (check(payload, None) is None) == _reference(parsed, named, payload)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@SETTINGS
@given(data=st.data())
def test_the_walk_finds_the_negative_index_the_python_reader_refuses(
    name: str, data: st.DataObject
) -> None:
    schema = SCHEMAS[name]
    payload = data.draw(_payloads(schema))
    if payload:
        at = data.draw(st.integers(0, len(payload) - 1))
        if data.draw(st.booleans()) or payload[at] >= 0x80:
            payload = payload[:at] + bytes([data.draw(_BYTES)]) + payload[at + 1 :]
        else:
            payload = _padded(payload, at, data.draw(st.integers(1, 10)))
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema, named_schemas=named)
    stream = io.BytesIO(payload)
    try:
        fastavro.schemaless_reader(stream, parsed, None)
    except Exception:
        return  # the walk runs only over what the compiled reader reads
    if stream.tell() != len(payload):
        return
    walk = walker(parsed, named)
    assert walk is not None
    assert walk(payload) is (not _reference(parsed, named, payload))


def test_a_schema_without_a_union_or_an_enum_is_not_walked() -> None:
    schema = {"type": "record", "name": "P", "fields": [{"name": "a", "type": "string"}]}
    named: dict[str, Any] = {}
    assert walker(fastavro.parse_schema(schema, named_schemas=named), named) is None


def test_a_negative_index_in_a_large_array_is_found() -> None:
    schema = SCHEMAS["collections"]
    value: dict[str, Any] = {
        "tags": ["x"] * 5000,
        "colors": {},
        "plain": [],
        "more": [],
        "maybe": None,
    }
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    payload = bytearray(out.getvalue())
    last = payload.rindex(b"\x02\x02x")  # the last item: branch 1, "x"
    payload[last] = 0x03  # branch -2: "string" counted from the end
    check = validator(Schema("AVRO", json.dumps(schema).encode(), {}, None))
    found = check(bytes(payload), None)
    assert found is not None
    assert found.reason == "not_avro"
    assert "tags" in found.message


def test_a_padded_index_in_a_large_array_is_found() -> None:
    """An index in 6 bytes (value 1, "string"): fastavro reads it, Java's
    readIndex fails past 5."""
    schema = SCHEMAS["collections"]
    value: dict[str, Any] = {
        "tags": ["x"] * 5000,
        "colors": {},
        "plain": [],
        "more": [],
        "maybe": None,
    }
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    payload = out.getvalue()
    last = payload.rindex(b"\x02\x02x")
    padded = payload[:last] + b"\x82\x80\x80\x80\x80\x00" + payload[last + 1 :]
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema, named_schemas=named)
    assert fastavro.schemaless_reader(io.BytesIO(padded), parsed, None) == value
    check = validator(Schema("AVRO", json.dumps(schema).encode(), {}, None))
    found = check(padded, None)
    assert found is not None
    assert found.reason == "not_avro"
    assert "tags" in found.message
