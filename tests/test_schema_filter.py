"""sluice.filters.schema: the ``schema`` filter's hook, message by message.

Messages are built as Pulsar's clients send them (the facts a protocol core
hands a filter); no process is started."""

from __future__ import annotations

import base64
import struct

from sluice.filters.schema import SchemaSettings, SchemaValidation
from sluice.protocols.filtering import PASS, Message, Reject, Schema, Verdict

TOPIC = "persistent://acme/shop/orders"


def framed(first: bytes, second: bytes) -> bytes:
    return struct.pack(">i", len(first)) + first + struct.pack(">i", len(second)) + second


def key_value(encoding: str) -> Schema:
    """A KEY_VALUE schema: an INT32 key and a STRING value."""
    properties = {
        "key.schema.type": "INT32",
        "key.schema.properties": "{}",
        "value.schema.type": "STRING",
        "value.schema.properties": "{}",
        "kv.encoding.type": encoding,
    }
    return Schema("KEY_VALUE", framed(b"", b""), properties, (0).to_bytes(8, "big"))


def produce(schema: Schema, payload: bytes, key: str | None = None, **facts: bool) -> Verdict:
    check = SchemaValidation(SchemaSettings())
    message = Message("produce", TOPIC, payload, key=key, schema=schema, **facts)  # type: ignore[arg-type]
    return check.on_produce(message)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_key_is_read_only_where_the_schema_puts_a_value_in_it() -> None:
    """A key flagged base64 that is not base64 is nothing to a STRING topic
    or an INLINE key/value (the consumer never decodes it); in a SEPARATED
    key/value it is the key, which a consumer cannot read: refused, not
    raised (a raise is counted as the filter's error)."""
    for schema, payload in ((Schema("STRING", b""), b"ok"),
                            (key_value("INLINE"), framed(b"\0\0\0\1", b"v"))):  # fmt: skip
        for key in ("abc!", "é", "abcde", "YQ="):
            assert produce(schema, payload, key, key_is_base64=True) is PASS
    separated = key_value("SEPARATED")
    for key in ("abc!", "é", "abcde", "YQ="):
        got = produce(separated, b"v", key, key_is_base64=True)
        assert isinstance(got, Reject) and got.reason == "not_key_value", got
        assert "key: not base64" in got.message
    # Java's decoder takes base64 without its padding, as clients may send it.
    assert produce(separated, b"v", b64(b"\0\0\0\7").rstrip("="), key_is_base64=True) is PASS
    assert produce(separated, b"v", b64(b"\0\0\0\7"), key_is_base64=True) is PASS
    got = produce(separated, b"v", b64(b"\0\0\7"), key_is_base64=True)
    assert isinstance(got, Reject) and got.reason == "wrong_size"
    assert got.message.endswith("key: INT32 value: expected 4 bytes, got 3")


def test_a_separated_key_value_tombstone_has_its_key_checked() -> None:
    """Pulsar's Java client sends KeyValue(key, null) on a SEPARATED topic as
    null_value with the key in the message key: the key is still checked,
    and nothing else (the empty payload is no value)."""
    separated = key_value("SEPARATED")
    good, bad = b64(b"\0\0\0\7"), b64(b"\0\0\7")
    assert produce(separated, b"", good, key_is_base64=True, null=True) is PASS
    got = produce(separated, b"", bad, key_is_base64=True, null=True)
    assert isinstance(got, Reject) and got.reason == "wrong_size"
    assert got.message.endswith("key: INT32 value: expected 4 bytes, got 3")
    got = produce(separated, b"", "abc!", key_is_base64=True, null=True)
    assert isinstance(got, Reject) and got.reason == "not_key_value"
    # No key (null_partition_key) and no value: nothing to check.
    assert produce(separated, b"", None, null=True) is PASS
    # Where the key is no part of the value, a tombstone passes whatever its key.
    assert produce(key_value("INLINE"), b"", bad, key_is_base64=True, null=True) is PASS
    assert produce(Schema("INT32", b""), b"", bad, key_is_base64=True, null=True) is PASS
