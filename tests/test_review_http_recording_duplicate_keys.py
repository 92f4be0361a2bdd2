"""Review: a JSON body that names a credential key twice keeps neither value.

``json.loads`` keeps the last of duplicate keys; where that one is empty
(or already ``<redacted>``) nothing is replaced, and ``redact_body``
(sluice/protocols/http/recorded.py) keeps the body's bytes as they came,
the first value in the clear. A reader that takes the first of duplicate
keys (or all of them) gets the secret. No process is started: bodies go
through what the HTTP recorder keeps of them (and WebSocket frames too).
"""

from __future__ import annotations

import pytest

from sluice.protocols.http.recorded import redact_body
from sluice.proxy.http_recording import Body
from sluice.recording.format import PayloadPolicy

SECRET = b"review-duplicate-key-secret-0072"
BODIES = [
    b'{"token": "' + SECRET + b'", "token": ""}',
    b'{"a": {"password": "' + SECRET + b'", "password": null}}',
    b'[{"client_secret": "' + SECRET + b'", "client_secret": "<redacted>"}]',
]


@pytest.mark.parametrize("body", BODIES)
def test_a_credential_key_given_twice_keeps_neither_value(body: bytes) -> None:
    raw, _ = redact_body(body, "application/json")
    assert raw is None or SECRET not in raw
    recorded = Body(PayloadPolicy.FULL, 1 << 20)
    recorded.add(body)
    record, _ = recorded.record([(b"Content-Type", b"application/json")])
    assert SECRET not in repr(record).encode()


def test_a_dropped_duplicate_holding_a_credential_is_not_kept() -> None:
    body = b'{"a": {"token": "' + SECRET + b'"}, "a": 1}'
    assert redact_body(body, "application/json") == (None, False)


def test_a_key_given_twice_without_credentials_is_kept() -> None:
    body = b'{"role": "a", "role": "b"}'
    assert redact_body(body, "application/json") == (body, False)
