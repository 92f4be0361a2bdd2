"""Review: proxy mode, web port. A WebSocket upgrade keeps the client's own
``Authorization`` (docs/proxy.md: "so that the broker's WebSocket service
grants the session what the client's role may do, never what Sluice's
may") and drops Sluice's own credential and ``X-Original-Principal``.

When the client's own credential is not in the request that goes on, the
upgrade reaches the broker carrying no credential of the client's and no
principal at all: on an ``https://`` ``--broker-http`` Sluice's hop
presents Sluice's own TLS client certificate (its credential when no
``--broker-auth-token-file`` is given), and the broker's WebSocket service
authenticates the session as Sluice's proxy role. Two ways a client gets
there, each with nothing but its own valid credential:

- it proved its role with its TLS client certificate only (no
  ``Authorization``): a certificate cannot be carried on;
- it sent a valid token and ``Connection: Upgrade, Authorization``: the
  token is checked (read before the Connection header's names go), then
  ``unlisted`` drops ``Authorization`` as hop-by-hop.

sluice/protocols/http/__init__.py:277-281 (``with_credentials``, upgrade)
and sluice/proxy/http.py:836-842 (``_authenticated``).
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import h11
import pytest
import trio
import trio.testing

from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.http import unlisted
from sluice.protocols.pulsar.auth import AuthError, ProxyAuth, TokenVerifier
from sluice.proxy import http as http_module
from sluice.proxy.backend import Unauthorized
from sluice.proxy.http import HttpRelay, Refusal

SECRET = b"0123456789abcdef0123456789abcdef"


def sluice_on_its_certificate(tmp_path: Path) -> ProxyAuth:
    """Proxy mode with Sluice's credential its TLS client certificate (no
    own token): clients by token or by certificate."""
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    return ProxyAuth("tls", None, TokenVerifier.secret_key(key), tls_roles=True)


def relay_for(auth: ProxyAuth) -> HttpRelay:
    relay = object.__new__(HttpRelay)

    async def credentials(
        authorization: str | None, peer_role: str | None
    ) -> list[tuple[bytes, bytes]] | None:
        try:
            return auth.web_credentials(authorization, peer_role)[1]
        except AuthError as exc:
            raise Unauthorized(str(exc)) from None

    relay.credentials = credentials
    return relay


def upgrade(*extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"sluice:8080"),
        (b"upgrade", b"websocket"),
        (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ=="),
        (b"sec-websocket-version", b"13"),
        *extra,
    ]


def goes_on(relay: HttpRelay, headers: list[tuple[bytes, bytes]], stream: object) -> object:
    """What ``_authenticated`` makes of the upgrade, as the listener calls it:
    the Authorization read first, then the Connection header's names dropped."""
    authorization = next((v for n, v in headers if n.lower() == b"authorization"), None)
    request = h11.Request(method=b"GET", target=b"/ws/v2/consumer/persistent/t/n/x/s",
                          headers=unlisted(headers))  # fmt: skip

    async def run() -> object:
        try:
            sent, _ = await relay._authenticated(request, stream, authorization)  # type: ignore[arg-type]
        except Refusal as refusal:
            return refusal
        return [(bytes(n).lower(), bytes(v)) for n, v in sent.headers]

    return trio.run(run)


def names_the_client(outcome: object, token: bytes | None) -> bool:
    """Refused, or the upgrade goes on with the client's own token (or its
    role named): never with no credential of the client's at all."""
    if isinstance(outcome, Refusal):
        return True
    assert isinstance(outcome, list)
    authorization = [v for n, v in outcome if n == b"authorization"]
    principal = [v for n, v in outcome if n == b"x-original-principal"]
    return (token is not None and authorization == [b"Bearer " + token]) or principal == [b"app"]


def test_a_token_is_what_goes_on(tmp_path: Path) -> None:
    """The case that works: the token checked is the one that goes on."""
    relay = relay_for(sluice_on_its_certificate(tmp_path))
    token = hs256_token(SECRET, "app", time.time() + 60).encode()
    outcome = goes_on(relay, upgrade((b"connection", b"Upgrade"),
                                     (b"authorization", b"Bearer " + token)), object())  # fmt: skip
    assert names_the_client(outcome, token)


def test_a_token_named_hop_by_hop_is_not_dropped_after_it_was_checked(tmp_path: Path) -> None:
    relay = relay_for(sluice_on_its_certificate(tmp_path))
    token = hs256_token(SECRET, "app", time.time() + 60).encode()
    outcome = goes_on(relay, upgrade((b"connection", b"Upgrade, Authorization"),
                                     (b"authorization", b"Bearer " + token)), object())  # fmt: skip
    assert names_the_client(outcome, token), outcome


def test_a_certificate_client_upgrade_is_not_sent_as_sluice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = relay_for(sluice_on_its_certificate(tmp_path))
    monkeypatch.setattr(http_module, "certificate_cn", lambda stream: "app")
    transport, _ = trio.testing.memory_stream_pair()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    stream = trio.SSLStream(transport, context, server_side=True)
    outcome = goes_on(relay, upgrade((b"connection", b"Upgrade")), stream)
    assert names_the_client(outcome, None), outcome
