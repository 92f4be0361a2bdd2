"""Credentials in an HTTP body are kept out of a recording whatever
encoding the body's JSON is in: with a UTF-8 byte order mark (which
RFC 8259 lets a reader ignore, and the broker's Jackson does), or in
UTF-16 / UTF-32 (which Jackson reads too). Such a body used to be seen as
not JSON, and recorded whole, its secrets in it."""

from __future__ import annotations

import codecs

import pytest

from sluice.protocols.http.recorded import redact_body
from sluice.proxy.http_recording import Body
from sluice.recording import format as fmt

DOCUMENT = '{"authParams": "token:s3cr3t", "n": 1}'
SCRUBBED = b'{"authParams":"<redacted>","n":1}'


@pytest.mark.parametrize(
    "body",
    [
        codecs.BOM_UTF8 + DOCUMENT.encode(),
        codecs.BOM_UTF8 + b" \r\n" + DOCUMENT.encode(),
        DOCUMENT.encode("utf-16"),  # with its byte order mark
        DOCUMENT.encode("utf-16-be"),
        DOCUMENT.encode("utf-16-le"),
        DOCUMENT.encode("utf-32"),
    ],
    ids=["utf-8-bom", "utf-8-bom-blank", "utf-16", "utf-16-be", "utf-16-le", "utf-32"],
)
def test_json_in_any_encoding_is_redacted(body: bytes) -> None:
    assert redact_body(body, "application/json") == (SCRUBBED, True)
    assert redact_body(body) == (SCRUBBED, True)  # a WebSocket message: no type


def test_a_bom_prefixed_body_is_recorded_without_its_credential() -> None:
    """Through the recorder's body: the secret's bytes are nowhere."""
    body = Body(fmt.PayloadPolicy.FULL, limit=1024)
    body.add(codecs.BOM_UTF8 + DOCUMENT.encode())
    record, redacted = body.record([(b"content-type", b"application/json")])
    assert redacted
    assert record["raw"] == SCRUBBED


def test_a_bom_prefixed_json_part_of_a_binary_type_is_looked_into() -> None:
    """A multipart part whose type says binary is still looked into when
    its bytes start like JSON, a byte order mark before them or not."""
    part = codecs.BOM_UTF8 + DOCUMENT.encode()
    body = (
        b"--b\r\nContent-Disposition: form-data; name=config\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n" + part + b"\r\n--b--\r\n"
    )
    raw, redacted = redact_body(body, "multipart/form-data; boundary=b")
    assert redacted and raw is not None
    assert b"s3cr3t" not in raw and SCRUBBED in raw


def test_a_bom_prefixed_form_is_redacted() -> None:
    body = codecs.BOM_UTF8 + b"role=app&password=s3cr3t"
    assert redact_body(body, "application/x-www-form-urlencoded") == (
        codecs.BOM_UTF8 + b"role=app&password=<redacted>",
        True,
    )


def test_what_is_not_json_stays_as_it_came() -> None:
    for body in (b"", b"x", b"\x00", b"\x00\x01\x02\x03", codecs.BOM_UTF8 + b"token: s3cr3t",
                 b"PK\x03\x04{", "plain".encode("utf-16")):  # fmt: skip
        assert redact_body(body) == (body, False), body
