"""A JSON schema's bytes field holding an array of byte values.

Pulsar's Java client reads a JSON payload's ``byte[]`` field with Jackson
databind's ``PrimitiveArrayDeserializers.ByteDeser`` (2.17, the line Pulsar
4.0 uses): base64 text, or a JSON array whose items are integers that fit a
byte (-128 to 255, ``getByteValue``), which it reads as those bytes. So
``{"b": [104, 105]}`` is read as ``b"hi"``; Sluice refuses it as
``wrong_type`` (a valid message refused)."""

from __future__ import annotations

import json

import pytest

from sluice.filters.schemas import Mismatch, validator
from sluice.protocols.filtering import Schema

DEFINITION = json.dumps({
    "type": "record", "name": "R", "fields": [
        {"name": "b", "type": ["null", "bytes"], "default": None},
    ],
}).encode()  # fmt: skip


def _check(value: object) -> Mismatch | None:
    return validator(Schema("JSON", DEFINITION, {}, None))(json.dumps({"b": value}).encode(), None)


@pytest.mark.parametrize("value", [[104, 105], [], [-128, 0, 255]])
def test_an_array_of_byte_values_jackson_reads_passes(value: list[int]) -> None:
    assert _check(value) is None


@pytest.mark.parametrize(
    "value", [[256], [-129], ["x"], {"a": 1}, [True], [1, False], [[1]], [1, 2, 300]]
)
def test_an_array_jackson_cannot_read_as_bytes_is_refused(value: object) -> None:
    found = _check(value)
    assert found is not None


def test_the_refusal_says_which_item_is_not_a_byte() -> None:
    found = _check([1, 256])
    assert found is not None
    assert found.reason == "wrong_type"
    assert found.message.startswith("field 'b[1]': expected a byte value (-128 to 255), got ")


def test_a_value_neither_text_nor_array_says_what_a_bytes_field_takes() -> None:
    found = _check(5)
    assert found is not None
    assert found.message.startswith("field 'b': expected null or string or array of byte values")
