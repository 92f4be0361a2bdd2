"""Avro varints longer than Java's Avro decoder reads.

Java's ``BinaryDecoder`` (Pulsar's Java client) reads an int, a union
branch index (``readIndex``) and an enum symbol index (``readEnum``) with
``readInt``, which fails with "Invalid int encoding" past 5 bytes, and a
long with ``readLong``, which fails with "Invalid long encoding" past 10.
fastavro reads any of them as a long of any length, so the schema filter
passes payloads every Java consumer fails on, as it did negative indexes
before 0f8f627. The index walk (``avro_indexes``) reads every union and
enum index already, and could refuse one longer than 5 bytes there."""

from __future__ import annotations

import json

import pytest

from sluice.filters.schemas import validator
from sluice.protocols.filtering import Schema


def _padded(value: int, length: int) -> bytes:
    """``value`` (zigzag-encoded already) as a varint of ``length`` bytes."""
    out = bytearray()
    for i in range(length):
        group = (value >> (7 * i)) & 0x7F
        out.append(group | (0x80 if i < length - 1 else 0))
    return bytes(out)


def _check(field_type: object, payload: bytes) -> object:
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}
    return validator(Schema("AVRO", json.dumps(schema).encode(), {}, None))(payload, None)


UNION = ["null", "long"]
UNION_OF_RECORDS = [
    "null",
    {"type": "record", "name": "A", "fields": [{"name": "x", "type": "long"}]},
]
ENUM = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
INDEXED = pytest.mark.parametrize(
    "field_type", [UNION, UNION_OF_RECORDS, ENUM], ids=["leaf", "records", "enum"]
)


@INDEXED
def test_an_index_in_five_bytes_passes(field_type: object) -> None:
    assert _check(field_type, _padded(0, 5)) is None


@pytest.mark.xfail(
    strict=True,
    reason="sluice/filters/avro_indexes.py:45 (_read_long, used for indexes at :137, :196, "
    ":246): a union or enum index past 5 bytes passes; Java's readIndex/readEnum fail on it",
)
@INDEXED
@pytest.mark.parametrize("length", [6, 10])
def test_an_index_longer_than_java_reads_is_refused(field_type: object, length: int) -> None:
    found = _check(field_type, _padded(0, length))
    assert found is not None


@pytest.mark.xfail(
    strict=True,
    reason="sluice/filters/schemas.py:458: fastavro reads an int field as a long, so an "
    "int past 5 bytes or out of 32-bit range passes; Java's readInt fails on it",
)
@pytest.mark.parametrize("payload", [_padded(0, 6), _padded(2**41, 6)], ids=["zero", "2^40"])
def test_an_int_longer_than_java_reads_is_refused(payload: bytes) -> None:
    assert _check("int", payload) is not None


@pytest.mark.xfail(
    strict=True,
    reason="sluice/filters/schemas.py:458: fastavro reads a long of any length; "
    "Java's readLong fails past 10 bytes",
)
def test_a_long_longer_than_java_reads_is_refused() -> None:
    assert _check("long", _padded(0, 11)) is not None


def test_a_long_in_ten_bytes_passes() -> None:
    assert _check("long", _padded(0, 10)) is None
