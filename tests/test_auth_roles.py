"""The role a client's credential names, as Sluice passes it on in proxy
mode: on the web port it becomes a header (``X-Original-Principal``), so a
role no header can carry is refused there as a bad credential (401), not
left to break the request."""

from __future__ import annotations

import time
from pathlib import Path

import h11
import pytest

from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.pulsar.auth import AuthError, ProxyAuth

SECRET = b"s" * 32


def proxy_auth(tmp_path: Path) -> ProxyAuth:
    key, own = tmp_path / "secret.key", tmp_path / "own.token"
    key.write_bytes(SECRET)
    own.write_text("OWN\n")
    return ProxyAuth.load(secret_key=key, public_key=None, role_claim="sub", own_token=own,
                          tls_roles=True, forward_auth_data=False)  # fmt: skip


def request(headers: list[tuple[bytes, bytes]]) -> h11.Request:
    """The request as Sluice's HTTP listener builds it for the broker."""
    return h11.Request(method="GET", target="/admin/v2/clusters",
                       headers=[(b"host", b"broker"), *headers])  # fmt: skip


@pytest.mark.parametrize(
    "role",
    [
        "app\r\nX-Original-Principal: admin",  # a header of its own
        "app\nadmin",
        "app\x00",
        " admin",  # whitespace a header value cannot start or end with
        "admin\t",
    ],
)
def test_a_role_no_header_can_carry_is_refused_on_the_web_port(role: str, tmp_path: Path) -> None:
    """Before, such a role (signed into a token by the key or an issuer:
    ``sub`` or a role claim some identity providers let users choose)
    reached h11, which refused to write the request: the connection ended
    with an internal error and no answer, and the log called it a bug."""
    auth = proxy_auth(tmp_path)
    token = hs256_token(SECRET, role, time.time() + 60)
    assert auth.authenticate("token", token.encode(), None).role == role  # the binary port's
    with pytest.raises(AuthError, match="cannot be sent as a header"):
        auth.web_credentials(f"Bearer {token}", None)


@pytest.mark.parametrize("role", ["app", "team/app", "app@example.com", "r\u00f4le", "a b"])
def test_roles_a_header_carries_go_on_as_they_are(role: str, tmp_path: Path) -> None:
    auth = proxy_auth(tmp_path)
    token = hs256_token(SECRET, role, time.time() + 60)
    client, headers = auth.web_credentials(f"Bearer {token}", None)
    assert client.role == role
    assert (b"x-original-principal", role.encode("latin-1")) in headers
    request(headers)  # h11 writes it


def broker_reads(headers: list[tuple[bytes, bytes]]) -> str:
    """``X-Original-Principal`` as the broker's web server (Jetty) reads a
    header value: each byte one character (ISO-8859-1)."""
    (value,) = [v for n, v in headers if n == b"x-original-principal"]
    return value.decode("latin-1")


def test_a_role_beyond_ascii_reaches_the_broker_as_the_same_role(tmp_path: Path) -> None:
    """Before, the role went as UTF-8: "r\u00f4le" reached the broker as
    "r\u00c3\u00b4le", another role, the one a client named so holds on the
    binary port (where original_principal is UTF-8, read as such)."""
    auth = proxy_auth(tmp_path)
    for role in ("r\u00f4le", "r\u00c3\u00b4le"):
        token = hs256_token(SECRET, role, time.time() + 60)
        assert broker_reads(auth.web_credentials(f"Bearer {token}", None)[1]) == role


@pytest.mark.parametrize("role", ["\u5f79\u5272", "app\u2028", "r\u00f4le\u20ac"])
def test_a_role_beyond_iso_8859_1_is_refused_on_the_web_port(role: str, tmp_path: Path) -> None:
    """No header value the broker reads is that role: refused (401), as a
    role with control characters is, not sent as bytes the broker reads as
    another."""
    auth = proxy_auth(tmp_path)
    token = hs256_token(SECRET, role, time.time() + 60)
    assert auth.authenticate("token", token.encode(), None).role == role  # the binary port's
    with pytest.raises(AuthError, match="beyond ISO-8859-1"):
        auth.web_credentials(f"Bearer {token}", None)


def test_the_client_does_not_choose_the_provider_that_checks_sluices_credential(
    tmp_path: Path,
) -> None:
    """The broker's web port checks a request with the provider its
    X-Pulsar-Auth-Method-Name names. The client's went on beside Sluice's
    own credential: ``tls`` made the broker take Sluice's certificate on
    that hop for the request, whatever token the client sent."""
    from sluice.protocols.http import with_credentials

    auth = proxy_auth(tmp_path)
    token = hs256_token(SECRET, "app", time.time() + 60)
    sent = [(b"Authorization", f"Bearer {token}".encode()),
            (b"X-Pulsar-Auth-Method-Name", b"tls"), (b"accept", b"*/*")]  # fmt: skip
    _, own = auth.web_credentials(f"Bearer {token}", None)
    relayed = with_credentials(sent, own)
    methods = [v for n, v in relayed if n.lower() == b"x-pulsar-auth-method-name"]
    assert methods == [b"token"]  # Sluice's own: a token
    assert (b"authorization", b"Bearer OWN") in relayed
    # A WebSocket upgrade keeps the client's checked token: named as one.
    upgraded = with_credentials(sent, own, upgrade=True)
    methods = [v for n, v in upgraded if n.lower() == b"x-pulsar-auth-method-name"]
    assert methods == [b"token"]
    request(relayed)
