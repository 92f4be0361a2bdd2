"""A JSON schema's bytes field as Pulsar's Python client writes it.

Since pulsar-client 3.4.0 (``Bytes.python_type`` is ``(bytes, str)``), the
Python client's ``JsonSchema`` writes a ``Bytes()`` field as the bytes'
UTF-8 text, not base64 (``_get_serialized_value``: ``o.decode()``), and
reads any text back (``Bytes.validate_type``: ``val.encode()``). So
``b"hello world"`` goes out as ``"hello world"`` and comes back as
``b"hello world"``. 8bc8517 refuses bytes text that is not base64 on the
grounds that Python reads no bytes field from JSON; it does, so a message
the Python client wrote, and reads, is refused as ``wrong_type``."""

from __future__ import annotations

import pytest
from pulsar.schema import Bytes, JsonSchema, Record

from sluice.filters.schemas import validator
from sluice.protocols.filtering import Schema


class _Blob(Record):  # type: ignore[misc]  # pulsar ships no types
    b = Bytes()


@pytest.mark.parametrize("value", [b"hello world", b"a", b"id-42"])
def test_a_bytes_field_the_python_client_wrote_passes(value: bytes) -> None:
    schema = JsonSchema(_Blob)
    payload = schema.encode(_Blob(b=value))
    assert schema.decode(payload).b == value  # the client reads it back
    check = validator(Schema("JSON", schema.schema_info().schema().encode(), {}, None))
    assert check(payload, None) is None
