"""A message flagged null_value that carries a payload is no tombstone to
every reader: the C++-based clients (Python, Node.js) hand its bytes to
the application (``data()``), and the broker stores them. The schema
filter passed every null-flagged message unchecked, so a schemaless
producer could store any bytes in a topic with a schema by flagging them
null. Such a payload is checked as any other; a tombstone as clients
send it (no bytes) still passes."""

from __future__ import annotations

from sluice.protocols.filtering import PASS, Reject, Schema
from tests.test_schema_filter import produce

INT32 = Schema("INT32", b"")


def test_a_null_flagged_message_with_bytes_is_checked() -> None:
    got = produce(INT32, b"not an int", null=True)
    assert isinstance(got, Reject) and got.reason == "wrong_size"


def test_a_null_flagged_message_with_good_bytes_passes() -> None:
    assert produce(INT32, b"\x00\x00\x00\x07", null=True) is PASS


def test_a_tombstone_without_bytes_passes() -> None:
    assert produce(INT32, b"", null=True) is PASS
