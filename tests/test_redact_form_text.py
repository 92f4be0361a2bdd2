"""A body that is a form (``name=value&name=value``) holding a credential
is redacted whatever its declared type: an OAuth2 token request's
``client_secret`` sent as ``text/plain``, or with no ``Content-Type``, is
as secret as one sent as ``application/x-www-form-urlencoded``. A body
that is not a form (text, JSON, bytes) is kept byte for byte. No process
is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.protocols.http.recorded import MARKER, redact_body
from tests.test_http_recording import captured, posted

SECRET = "form-5ec7e7c0ffee4b1d"  # fixed: parametrize ids must match across xdist workers
OAUTH = f"grant_type=client_credentials&client_id=app-1&client_secret={SECRET}&scope=a%20b"
REDACTED = f"grant_type=client_credentials&client_id=app-1&client_secret={MARKER}&scope=a%20b"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "text/plain; charset=utf-8", "", "application/octet-stream"]
)
def test_a_form_with_a_credential_is_redacted_whatever_its_type(content_type: str) -> None:
    assert redact_body(OAUTH.encode(), content_type) == (REDACTED.encode(), True)
    body = f"username=u&password={SECRET}==\r\n".encode()
    assert redact_body(body, content_type) == (f"username=u&password={MARKER}\r\n".encode(), True)
    # As a lenient reader takes it: an empty field, one without a value.
    body = f"a=1&&flag&token={SECRET}".encode()
    assert redact_body(body, content_type) == (f"a=1&&flag&token={MARKER}".encode(), True)


def test_a_form_sent_as_a_form_is_still_redacted() -> None:
    assert redact_body(OAUTH.encode(), "application/x-www-form-urlencoded") == (
        REDACTED.encode(),
        True,
    )


@pytest.mark.parametrize(
    "body",
    [
        f"my password={SECRET} is kept".encode(),  # text: spaces
        f"a=1\npassword={SECRET}".encode(),  # two lines
        f"password: {SECRET}".encode(),
        f'"password={SECRET}"'.encode(),  # a JSON string
        f"<p>password={SECRET}</p>".encode(),
        b"\x00\x01" + f"password={SECRET}".encode(),  # bytes
        f"password={SECRET}".encode("utf-16"),
        f"password={SECRET}\xe9".encode("latin-1"),  # not ASCII
        b"a=1&password",  # a field without a value: nothing to hide
        b"client_id=app-1&scope=read",  # a form, but no credential
    ],
)
def test_a_body_that_is_not_a_form_with_a_credential_is_kept_as_it_came(body: bytes) -> None:
    for content_type in ("text/plain", ""):
        assert redact_body(body, content_type) == (body, False)


def test_a_recorded_text_plain_form_keeps_no_credential(tmp_path: Path) -> None:
    (record,) = captured(tmp_path, posted(OAUTH.encode(), b"text/plain", b"/oauth2/token"))
    assert record["req"]["raw"] == REDACTED.encode()
    assert record["redacted"] is True
