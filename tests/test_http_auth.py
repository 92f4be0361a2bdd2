"""``--auth-mode proxy`` on the HTTP listener, against Apache Pulsar 4.0.8
with authentication and authorization on (``auth_broker``: role ``app`` may
use public/default and not public/elsewhere; ``sluice`` is a proxy role and
a superuser, ``admin`` a superuser).

Sluice checks clients' tokens with a key of its own, which the broker does
not know: a client token that works through Sluice and not directly shows
that Sluice called the broker with its own credential."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import ApachePulsar, hs256_token
from tests.test_apache_pulsar import Tokens, auth_broker  # noqa: F401 (a fixture)
from tests.test_http import WebProxy, start_web_proxy


class Clients:
    """Tokens signed with Sluice's client key (unknown to the broker)."""

    def __init__(self, directory: Path) -> None:
        self.secret = secrets.token_bytes(32)
        self.key_file = directory / "clients.key"
        self.key_file.write_bytes(self.secret)

    def make(self, role: str) -> str:
        return hs256_token(self.secret, role)


Proxied = tuple[WebProxy, ApachePulsar, Tokens, Clients]


def call(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A GET's status and body, errors included."""
    request = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


def stats(broker: ApachePulsar, namespace: str) -> str:
    """A new topic in ``namespace`` (made by the superuser), its stats' path."""
    path = f"/admin/v2/persistent/{namespace}/auth-{uuid.uuid4().hex[:8]}"
    broker.admin_json("PUT", path)
    return path + "/stats"


@pytest.fixture
def proxied(auth_broker: tuple[ApachePulsar, Tokens], tmp_path: Path) -> Iterator[Proxied]:  # noqa: F811
    broker, tokens = auth_broker
    clients = Clients(tmp_path)
    own = tmp_path / "sluice.token"
    own.write_text(tokens.make("sluice") + "\n")
    web = start_web_proxy(
        broker, tmp_path, broker.http_url, "--auth-mode", "proxy",
        "--auth-token-secret-key", str(clients.key_file), "--broker-auth-token-file", str(own),
    )  # fmt: skip
    yield web, broker, tokens, clients
    web.proxy.kill()
    log = web.proxy.log()
    assert "Traceback" not in log, log
    assert own.read_text().strip() not in log and clients.make("app") not in log


def test_the_broker_authorizes_the_client_not_sluice(proxied: Proxied) -> None:
    """Sluice calls the broker as ``sluice`` (a superuser) naming the client
    in X-Original-Principal: the client may do through Sluice what its role
    may do at the broker, and nothing more."""
    web, broker, tokens, clients = proxied
    app = clients.make("app")
    allowed, refused = stats(broker, "public/default"), stats(broker, "public/elsewhere")
    # The broker does not know the client's token, nor Sluice's alone.
    assert call(broker.http_url, allowed, bearer(app))[0] == 401
    assert call(broker.http_url, allowed, bearer(tokens.make("sluice")))[0] == 401
    # What role app may do directly (with a token the broker signed), and not.
    assert call(broker.http_url, allowed, bearer(tokens.make("app")))[0] == 200
    direct = call(broker.http_url, refused, bearer(tokens.make("app")))[0]
    assert direct in (401, 403)
    # Through Sluice: the same, with the token only Sluice knows.
    assert call(web.url, allowed, bearer(app))[0] == 200
    assert call(web.url, refused, bearer(app))[0] == direct
    # The client cannot name someone else: its X-Original-Principal is replaced.
    assert call(web.url, refused, bearer(app, **{"X-Original-Principal": "admin"}))[0] == direct
    # A superuser client may.
    assert call(web.url, refused, bearer(clients.make("admin")))[0] == 200


def test_sluice_refuses_a_client_it_cannot_authenticate(proxied: Proxied) -> None:
    web, broker, tokens, _ = proxied
    path = stats(broker, "public/default")
    forged = tokens.make("app")  # the broker's, not the key Sluice checks with
    answers = [
        call(web.url, path),
        call(web.url, path, bearer(forged)),
        call(web.url, path, {"Authorization": "Basic YXBwOmFwcA=="}),
    ]
    assert [status for status, _ in answers] == [401, 401, 401], answers
    assert all(body.startswith("Sluice: authentication failed: ") for _, body in answers)
    assert "no credentials" in answers[0][1] and "Bearer" in answers[2][1]
    assert web.metric("sluice_http_refused_total", reason="unauthorized") == 3
    assert web.metric("sluice_http_requests_total", status="4xx") == 3
