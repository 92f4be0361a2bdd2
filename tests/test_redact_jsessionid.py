"""A session id a servlet container puts in a path parameter
(``/admin/v2/tenants;jsessionid=…``, a matrix parameter) is a credential:
a recording and the log keep the path with its value replaced, as a
``?jsessionid=`` query's is, in the request's target and in the URLs of
``Location`` and ``Referer`` headers. The rest of the path is kept as it
came. No process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.protocols.http.recorded import MARKER, redact_headers, redact_target
from tests.test_http_recording import captured, posted

SESSION = "sess-5ec7e7c0ffee4b1d"  # fixed: parametrize ids must match across xdist workers


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (f"/admin/v2/tenants;jsessionid={SESSION}", f"/admin/v2/tenants;jsessionid={MARKER}"),
        (f"/admin/v2/tenants;JSESSIONID={SESSION}?a=1",
         f"/admin/v2/tenants;JSESSIONID={MARKER}?a=1"),
        (f"/admin/v2;jsessionid={SESSION}/tenants/t",
         f"/admin/v2;jsessionid={MARKER}/tenants/t"),
        (f"/admin/v2/tenants;v=2;jsession%69d={SESSION};x=y",
         f"/admin/v2/tenants;v=2;jsession%69d={MARKER};x=y"),
        (f"/admin/v2/tenants?jsessionid={SESSION}", f"/admin/v2/tenants?jsessionid={MARKER}"),
        (f"http://broker:8080/admin/v2/tenants;jsessionid={SESSION}",
         f"http://broker:8080/admin/v2/tenants;jsessionid={MARKER}"),
    ],
)  # fmt: skip
def test_a_session_id_in_a_path_parameter_is_replaced(target: str, expected: str) -> None:
    assert redact_target(target) == expected
    assert redact_target(target.encode()) == expected


def test_other_path_parameters_are_kept_as_they_came() -> None:
    for path in ("/admin/v2/tenants;v=2", "/a;b/c;d=e?f=g", "/a;=x", "/a;jsessionid"):
        assert redact_target(path) == path


def test_a_session_id_in_location_and_referer_is_replaced() -> None:
    url = f"http://broker:8080/admin/v2/tenants;jsessionid={SESSION}".encode()
    shown = redact_headers([(b"Location", url), (b"Referer", url)])
    assert all(SESSION not in value and f"jsessionid={MARKER}" in value for _, value in shown)


def test_a_recorded_exchange_keeps_no_session_id(tmp_path: Path) -> None:
    target = f"/admin/v2/tenants;jsessionid={SESSION}".encode()
    (record,) = captured(tmp_path, posted(b"{}", b"application/json", target))
    assert record["path"] == f"/admin/v2/tenants;jsessionid={MARKER}"
    assert record["redacted"] is True
