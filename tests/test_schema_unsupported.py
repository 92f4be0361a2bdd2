"""A schema the ``schema`` filter cannot check: said in a bounded line.

A definition is whatever a producer registered with the broker; what the
filter says of one it cannot read goes to the client (``unsupported =
reject``) and to the log, so it must not carry the definition whole."""

from __future__ import annotations

import json
import logging

import pytest

from sluice.filters.schema import SchemaSettings, SchemaValidation
from sluice.protocols.filtering import Message, Reject, Schema

TOPIC = "persistent://acme/shop/orders"


def test_an_unreadable_definition_is_said_in_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Valid JSON, no Avro schema: an unknown type name 100,000 characters long,
    # with line breaks in it.
    definition = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": "x\n" * 50_000}]}).encode()  # fmt: skip
    check = SchemaValidation(SchemaSettings(unsupported="reject"))
    message = Message("produce", TOPIC, b"\x02", schema=Schema("AVRO", definition))
    with caplog.at_level(logging.WARNING, logger="sluice.filters"):
        verdict = check.on_produce(message)
    assert isinstance(verdict, Reject) and verdict.reason == "schema_unsupported"
    assert verdict.message.startswith("the AVRO schema cannot be checked: ")
    assert len(verdict.message) < 400 and "\n" not in verdict.message
    (said,) = [r.getMessage() for r in caplog.records]
    assert len(said) < 600 and "\n" not in said
