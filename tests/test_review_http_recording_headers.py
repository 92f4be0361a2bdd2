"""Review: every header whose name names a credential is left out of an
``http`` record (``names_a_credential``), in any letter case, repeated.

``redact_headers`` (sluice/protocols/http/recorded.py) decides by its own
pattern, which lacks names ``names_a_credential`` knows (``pwd``,
``passphrase``, ``bearer``) and lets any ``Sec-WebSocket-*`` name through.
No process is started: headers go through what the HTTP recorder keeps.
"""

from __future__ import annotations

import pytest

from sluice.protocols.credentials import names_a_credential
from sluice.protocols.http.recorded import MARKER, redact_headers
from sluice.proxy.http_recording import Body
from sluice.recording.format import PayloadPolicy

SECRET = "review-header-secret-0071"
NAMES = ["X-Pwd", "X-Broker-Passphrase", "X-Bearer", "Sec-WebSocket-Token"]


@pytest.mark.parametrize("name", NAMES)
def test_a_header_named_like_a_credential_is_redacted(name: str) -> None:
    assert names_a_credential(name)
    headers = [(name.encode(), SECRET.encode()), (name.upper().encode(), SECRET.encode())]
    shown = redact_headers(headers)
    assert shown == [[name, MARKER], [name.upper(), MARKER]]
    record, redacted = Body(PayloadPolicy.FULL, 1 << 20).record(headers)
    assert SECRET not in repr(record)
    assert redacted


@pytest.mark.parametrize(
    "name",
    ["Authorization", "proxy-authorization", "COOKIE", "Set-Cookie", "X-Pulsar-Auth-Method-Name",
     "Sec-WebSocket-Protocol", "X-Api-Key"],
)  # fmt: skip
def test_the_usual_credential_headers_are_redacted_in_any_case_and_repeated(name: str) -> None:
    headers = [(name.encode(), SECRET.encode()), (name.lower().encode(), SECRET.encode())]
    assert [value for _, value in redact_headers(headers)] == [MARKER, MARKER]


def test_a_websocket_nonce_is_kept() -> None:
    shown = redact_headers([(b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ==")])
    assert shown == [["Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="]]
