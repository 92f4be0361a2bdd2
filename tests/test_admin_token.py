"""The admin token check (``authorize``): who may change state."""

from __future__ import annotations

import pytest

from sluice.proxy.admin import AdminRequest, Refused, authorize


def _request(authorization: str | None) -> AdminRequest:
    headers = {} if authorization is None else {"authorization": authorization}
    return AdminRequest("POST", "/faults", headers, b"")


@pytest.mark.parametrize("token", ["", " ", "\t"])
@pytest.mark.parametrize("sent", [None, "Bearer", "Bearer ", "bearer  ", "Bearer \t"])
def test_an_empty_token_configured_lets_no_one_change_state(token: str, sent: str | None) -> None:
    # An empty (or blank) token is no token: with it, an empty credential
    # ('Authorization: Bearer') compared equal and was let in.
    with pytest.raises(Refused) as info:
        authorize(_request(sent), token, "changing fault rules")
    assert info.value.status == 403 and "--admin-token-file" in info.value.message


@pytest.mark.parametrize("sent", ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret "])
def test_the_token_is_taken_in_any_scheme_case(sent: str) -> None:
    authorize(_request(sent), "s3cret", "changing fault rules")


@pytest.mark.parametrize("sent", [None, "Bearer", "Bearer s3cre", "Basic s3cret", "s3cret"])
def test_anything_but_the_token_is_refused(sent: str | None) -> None:
    with pytest.raises(Refused) as info:
        authorize(_request(sent), "s3cret", "changing fault rules")
    assert info.value.status == 401
