"""A JSON schema's bytes and fixed fields, and its enums, held to what
Pulsar's clients can read back.

Bytes and fixed: Pulsar's Java client reads a JSON payload with Jackson,
which reads a byte array from base64 text (the standard alphabet, padding
required, white space allowed between groups of four). Pulsar's Python
client (pulsar-client 3.4.0 on) writes a ``Bytes()`` field as the bytes'
own UTF-8 text and reads any text back as its bytes. A value passes when
one client reads it, so any text passes, base64 or not; a value that is not
text (a number, an object) is refused.

Enums: Jackson reads an integer as the symbol's position and fails past the
last one; Pulsar's Python client writes an enum member's value and reads an
integer back as the member with that value, which the schema (symbols only)
does not tell. An integer out of Java's range may be a value Python reads,
so integers still pass."""

from __future__ import annotations

import json

import pytest

from sluice.filters.schemas import Mismatch, validator
from sluice.protocols.filtering import Schema

DEFINITION = json.dumps({
    "type": "record", "name": "R", "fields": [
        {"name": "b", "type": ["null", "bytes"], "default": None},
        {"name": "f", "type": ["null", {"type": "fixed", "name": "F", "size": 4}], "default": None},
        {"name": "d", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                        "precision": 5, "scale": 2}], "default": None},
        {"name": "k", "type": ["null", {"type": "enum", "name": "K", "symbols": ["A", "B"]}],
         "default": None},
    ],
}).encode()  # fmt: skip


def _check(value: dict[str, object]) -> Mismatch | None:
    return validator(Schema("JSON", DEFINITION, {}, None))(json.dumps(value).encode(), None)


@pytest.mark.parametrize(
    "text",
    ["", "aGVsbG8=", "aGVsbA==", "aGVs", "+/+/", " aGVs\nbG8=", "aGVsbA==aGVs", "aGV=bG8="],
)
def test_base64_that_jackson_reads_passes(text: str) -> None:
    assert _check({"b": text}) is None
    assert _check({"f": text}) is None


@pytest.mark.parametrize(
    "text",
    ["hello world", "aGVsbG8", "aGVsbA=", "aGVsb=G8", "aGVs!", "aGVs-_==", "a", "aG Vs"],
)
def test_text_that_is_not_base64_passes(text: str) -> None:
    """Not base64, so Jackson fails on it, but Pulsar's Python client wrote
    it (a ``Bytes()`` field as the bytes' text) and reads it back."""
    assert _check({"b": text}) is None
    assert _check({"f": text}) is None


@pytest.mark.parametrize("value", [5, 1.5, True, {"a": 1}])
def test_a_value_that_is_not_text_is_refused(value: object) -> None:
    for field in ("b", "f"):
        found = _check({field: value})
        assert found is not None, (field, value)
        assert found.reason == "wrong_type"
        assert found.message.startswith(f"field '{field}': expected ")


def test_a_decimal_still_takes_a_number_or_its_text() -> None:
    assert _check({"d": 12.5}) is None
    assert _check({"d": "12.50"}) is None


@pytest.mark.parametrize("index", [0, 1, 2, 7, -1])
def test_an_enum_still_takes_any_integer(index: int) -> None:
    assert _check({"k": index}) is None
