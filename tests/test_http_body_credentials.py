"""A body that starts like JSON but is no JSON document is not recorded.

The broker's JSON reader is lenient where Python's is strict: it reads
the first value of a body and ignores what follows it, and may allow a
trailing comma or a comment. Such a body holds credentials the broker
takes but ``json.loads`` cannot find, so its bytes must never be kept
(its digest is, as for any body that cannot be checked). No process is
started: bodies go through what the HTTP recorder keeps of them.
"""

from __future__ import annotations

import hashlib

import pytest

from sluice.protocols.http.recorded import redact_body
from sluice.proxy.http_recording import Body
from sluice.recording.format import PayloadPolicy

SECRET = b"lenient-json-secret-0061"
LENIENT = (
    b'{"token": "' + SECRET + b'"} and more',  # a first value, then anything
    b'{"role": "app"}\n{"password": "' + SECRET + b'"}',  # two documents
    b'{"token": "' + SECRET + b'",}',  # a trailing comma
    b'{"token": "' + SECRET + b'" /* a comment */}',
    b"{'token': '" + SECRET + b"'}",  # single quotes
    b'[{"password": "' + SECRET + b'", "x": "\xff"}]',  # not UTF-8
)


@pytest.mark.parametrize("body", LENIENT)
def test_json_that_does_not_parse_is_not_kept(body: bytes) -> None:
    assert redact_body(body, "application/json") == (None, False)
    assert redact_body(body) == (None, False)  # a WebSocket message: no type


@pytest.mark.parametrize("body", LENIENT)
def test_a_recorded_request_keeps_only_its_digest(body: bytes) -> None:
    recorded = Body(PayloadPolicy.FULL, limit=1 << 20)
    recorded.add(body)
    out, _ = recorded.record([(b"content-type", b"application/json")])
    assert "raw" not in out
    assert out["p"] == [len(body), hashlib.sha256(body).digest()]
    assert SECRET not in repr(out).encode()


def test_json_that_parses_is_still_kept_and_redacted() -> None:
    assert redact_body(b'{"role": "app"}') == (b'{"role": "app"}', False)
    assert redact_body(b' {"token": "' + SECRET + b'"}') == (b'{"token":"<redacted>"}', True)


def test_a_multipart_part_that_starts_like_json_but_does_not_parse_keeps_the_body_out() -> None:
    body = (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="functionConfig"\r\n'
        b"Content-Type: application/json\r\n\r\n"
        b'{"tenant": "t"}\n{"secrets": {"db": "' + SECRET + b'"}}\r\n'
        b"--b--\r\n"
    )
    assert redact_body(body, "multipart/form-data; boundary=b") == (None, False)
