"""An OpenID Connect token's role claim read as Apache Pulsar's provider
(AuthenticationProviderOpenID.getRole, 4.0.8) reads it: a string, or a list
whose elements are each mapped to a string (a number or true/false as its
JSON text, as Java writes it), the first being the role; an empty list, a
null first element, or an object or list anywhere among the elements names
no role. The expected roles below are what the broker's own getRole
returned for the same claims."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sluice.protocols.core import Authenticated, Close, OpenUpstream
from sluice.protocols.pulsar import Type, command, decode_stream, encode
from sluice.protocols.pulsar.auth import ProxyAuth
from tests.test_oidc import NOW, Issuer, OwnToken, core, refused, verifier
from tests.test_pulsar_core import connect_body


def connect(token: str) -> bytes:
    """A client's CONNECT through Sluice to broker b:6650 (the core's)."""
    body = connect_body(auth_method_name="token", auth_data=token.encode(),
                        proxy_to_broker_url="b:6650")  # fmt: skip
    return encode(command(Type.CONNECT, body))


@pytest.mark.parametrize(
    ("groups", "role"),
    [
        (["ops", "dev"], "ops"),
        (["ops"], "ops"),
        (["ops", 1], "ops"),
        (["ops", None], "ops"),
        # Not strings: each element's JSON text, as Jackson maps it to a String.
        ([7, "ops"], "7"),
        ([-7], "-7"),
        ([12345678901234567890123], "12345678901234567890123"),
        ([True], "true"),
        ([False, "ops"], "false"),
        ([1.5], "1.5"),
        ([100.0], "100.0"),
        ([1e7], "1.0E7"),
        ([0.0009], "9.0E-4"),
        ([1e20], "1.0E20"),
    ],
)
def test_a_list_role_claim_names_its_first_element(groups: list[Any], role: str) -> None:
    idp = Issuer()
    v = verifier(idp, role_claim="groups")
    assert v.verify(idp.token(groups=groups), NOW) == (role, NOW + 300)


@pytest.mark.parametrize(
    "groups",
    [
        [],
        [None, "ops"],
        [{"name": "ops"}],
        [["ops"]],
        # One object or list anywhere: the broker cannot map the list, no role.
        ["ops", {"name": "dev"}],
        ["ops", ["dev"]],
        # NaN is not JSON: the broker cannot read the token; PyJWT's json can.
        ["ops", float("nan")],
        # A blank role is refused (Sluice's rule: it would name no client).
        [""],
        ["  ", "ops"],
    ],
)
def test_a_list_role_claim_without_a_role_is_refused(groups: list[Any]) -> None:
    idp = Issuer()
    v = verifier(idp, role_claim="groups")
    assert refused(v, idp.token(groups=groups)) == "no role in claim 'groups'"


def test_the_default_role_claim_sub_may_be_a_list_too() -> None:
    idp = Issuer()
    v = verifier(idp)
    assert v.verify(idp.token(sub=[42, "app"]), NOW)[0] == "42"
    assert refused(v, idp.token(sub=[])) == "no role in claim 'sub'"


def test_a_client_whose_role_claim_is_a_list_of_numbers_connects_under_the_first() -> None:
    """Through the core: the CONNECT of a token whose role claim is
    ``[7, "ops"]`` goes upstream naming role "7", as the broker would take
    it; one with an object among the elements is refused as a bad token."""
    idp = Issuer()
    auth = ProxyAuth("token", OwnToken(), oidc=verifier(idp, role_claim="groups"))
    now = time.time()
    times: dict[str, Any] = {"exp": now + 60, "iat": now, "nbf": now}
    conn, rec = core(auth)
    (opened,) = conn.receive_client(connect(idp.token(groups=[7, "ops"], **times)), 0.0)
    assert isinstance(opened, OpenUpstream)
    (hello,) = decode_stream(opened.hello)
    assert hello.body.original_principal == "7"
    assert rec.of(Authenticated) == [Authenticated("token", "ok")]

    conn, rec = core(auth)
    out = conn.receive_client(connect(idp.token(groups=["ops", {"x": 1}], **times)), 0.0)
    assert isinstance(out[-1], Close) and out[-1].reason == "auth"
    assert "no role in claim 'groups'" in out[-1].message
    assert rec.of(Authenticated) == [Authenticated("token", "failed")]
