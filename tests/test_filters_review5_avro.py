"""An Avro payload whose union branch or enum index is negative.

Avro writes both as a zig-zag long; Java's Avro decoder (Pulsar's Java
client, and the broker's AUTO_CONSUME) takes the index as a list position
and fails on a negative one, so every consumer fails on such a message.
fastavro, which the schema filter reads payloads with, indexes the
branches or symbols as a Python list does: -1 is the last. A payload with
branch -1 of ["null", "string"] was read as a string and passed."""

from __future__ import annotations

import pytest

from sluice.filters.schemas import Mismatch, validator
from sluice.protocols.filtering import Schema

NULLABLE = (b'{"type": "record", "name": "R", "fields": ['
            b'{"name": "f", "type": ["null", "string"]}]}')  # fmt: skip
ENUM = (b'{"type": "record", "name": "R", "fields": [{"name": "k", '
        b'"type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}}]}')  # fmt: skip
# A schema that holds itself is read by fastavro's Python reader instead.
LIST = (b'{"type": "record", "name": "Node", "fields": [{"name": "v", "type": "int"}, '
        b'{"name": "next", "type": ["null", "Node"]}]}')  # fmt: skip


def _check(definition: bytes, payload: bytes) -> Mismatch | None:
    return validator(Schema("AVRO", definition, {}, None))(payload, None)


@pytest.mark.parametrize(
    ("definition", "payload"),
    [
        (NULLABLE, b"\x00"),  # branch 0: null
        (NULLABLE, b"\x02\x06abc"),  # branch 1: "abc"
        (ENUM, b"\x02"),  # symbol 1: B
        (LIST, b"\x02\x02\x04\x00"),  # 1 -> 2 -> null
    ],
)
def test_indices_in_range_pass(definition: bytes, payload: bytes) -> None:
    assert _check(definition, payload) is None


@pytest.mark.parametrize(
    ("definition", "payload", "said"),
    [
        # zig-zag: 0x01 is -1, 0x03 is -2
        (NULLABLE, b"\x01\x06abc", "field 'f': union branch -1 does not exist in null or string"),
        (NULLABLE, b"\x03", "field 'f': union branch -2 does not exist in null or string"),
        (ENUM, b"\x01", "field 'k': symbol -1 does not exist in enum K"),
        (LIST, b"\x02\x01\x04\x00", "field 'next': union branch -1 does not exist in null or Node"),
    ],
)
def test_a_negative_union_branch_or_enum_index_is_refused(
    definition: bytes, payload: bytes, said: str
) -> None:
    found = _check(definition, payload)
    assert found is not None
    assert (found.reason, found.message) == ("not_avro", said)
