"""User information in a URL a recording keeps is replaced, in a
scheme-relative URL (``//user:password@host/path``, which a ``Location``
or ``Referer`` header may hold) as in an absolute one. No process is
started."""

from __future__ import annotations

from sluice.protocols.http.recorded import MARKER, redact_headers, redact_target

SECRET = "url-password-0071"


def test_user_information_in_a_scheme_relative_url_is_replaced() -> None:
    url = f"//svc:{SECRET}@broker:8080/admin/v2/namespaces?token={SECRET}"
    assert redact_target(url) == f"//{MARKER}@broker:8080/admin/v2/namespaces?token={MARKER}"
    headers = [(b"Location", url.encode()), (b"Referer", url.encode())]
    shown = redact_headers(headers)
    assert all(SECRET not in value and MARKER in value for _, value in shown)


def test_user_information_in_an_absolute_url_is_still_replaced() -> None:
    assert redact_target(f"http://svc:{SECRET}@h:1/p?a=1") == f"http://{MARKER}@h:1/p?a=1"


def test_a_path_without_user_information_is_kept_as_it_came() -> None:
    for path in ("/admin/v2/persistent/t/n/x", "/a//u@h/x", "https://h/p//x@y?q=1", "//host/x"):
        assert redact_target(path) == path
