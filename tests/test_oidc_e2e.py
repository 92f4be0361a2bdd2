"""OpenID Connect in proxy mode, end to end: Ory Hydra hands out tokens by
the client-credentials grant, the official Python client authenticates with
``AuthenticationOauth2``, and Apache Pulsar 4.0.8 checks tokens with its own
OpenID Connect provider (beside its token provider, for the admin token).
Sluice, in ``--auth-mode proxy``, checks clients itself and logs in to the
broker with a token of its own from Hydra: a client is allowed and refused
through Sluice exactly as at the broker directly, a key rotated at the
issuer while clients stay connected is taken in, and expired tokens are
refreshed (the client's and Sluice's own)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import free_port
from tests.conftest import start_apache_pulsar
from tests.helpers.hydra import Hydra
from tests.helpers.support import QUIET, ProxyProcess
from tests.test_apache_pulsar import (
    TOKEN_PROVIDER,
    Tokens,
    assert_all_valid,
    consume_exactly,
    recording_proxy,
    unique,
)
from tests.test_dashboards import scrape

OIDC_PROVIDER = "org.apache.pulsar.broker.authentication.oidc.AuthenticationProviderOpenID"
TOKEN_CLIENT = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
# Tokens of the short-lived issuer expire after this long (Hydra's access-token TTL).
SHORT_TTL = 4


class Issuers:
    """Two Hydra issuers: ``idp`` (tokens good for an hour) and ``short``
    (tokens good for SHORT_TTL seconds); the clients each knows, by role,
    with their key files."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.idp = Hydra(tmp)
        self.short = Hydra(tmp, access_token_ttl=f"{SHORT_TTL}s")
        self.files: dict[tuple[str, str], Path] = {}

    def key_file(self, hydra: Hydra, role: str, audience: str = "pulsar") -> Path:
        """The key file of client ``role`` at ``hydra`` (made once)."""
        key = (hydra.issuer, role)
        if key not in self.files:
            directory = self.tmp / f"keys-{hydra.port}"
            directory.mkdir(exist_ok=True)
            self.files[key] = hydra.key_file(directory, role, audience)
        return self.files[key]

    def client_auth(self, hydra: Hydra, role: str, audience: str = "pulsar") -> Any:
        """The Python client's ``AuthenticationOauth2`` for ``role``."""
        path = self.key_file(hydra, role, audience)
        return pulsar.AuthenticationOauth2(json.dumps(
            {"issuer_url": hydra.issuer, "private_key": f"file://{path}", "audience": "pulsar"}
        ))  # fmt: skip

    def close(self) -> None:
        self.idp.close()
        self.short.close()


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApachePulsar, Issuers]]:
    """Apache Pulsar trusting both issuers (audience ``pulsar``), with
    authorization: role ``app`` may produce and consume in public/default,
    ``stranger`` may not; ``sluice`` is a proxy role."""
    tmp = tmp_path_factory.mktemp("oidc")
    issuers = Issuers(tmp)
    tokens = Tokens(tmp)
    try:
        broker = start_apache_pulsar(
            tmp,
            admin_token=tokens.admin,
            settings={
                "authenticationEnabled": True,
                "authorizationEnabled": True,
                "authenticationProviders": f"{TOKEN_PROVIDER},{OIDC_PROVIDER}",
                "tokenSecretKey": f"file://{tokens.key_file}",
                "openIDAllowedTokenIssuers": f"{issuers.idp.issuer},{issuers.short.issuer}",
                "openIDAllowedAudiences": "pulsar",
                "openIDRequireIssuersUseHttps": False,
                # A kid the cached key set lacks fetches it again at once.
                "openIDKeyIdCacheMissRefreshSeconds": 0,
                "superUserRoles": "admin,sluice",
                "proxyRoles": "sluice",
                "brokerClientAuthenticationPlugin": TOKEN_CLIENT,
                "brokerClientAuthenticationParameters": f"token:{tokens.admin}",
                "authenticationRefreshCheckSeconds": 1,
            },
        )
    except BaseException:
        issuers.close()
        raise
    broker.admin_json("POST", "/admin/v2/namespaces/public/default/permissions/app",
                      ["produce", "consume"])  # fmt: skip
    yield broker, issuers
    broker.close()
    issuers.close()


def sluice_oidc(
    broker: ApachePulsar, issuers: Issuers, own: Hydra, tmp_path: Path, *extra: str
) -> tuple[ProxyProcess, int, Path]:
    """Sluice in proxy mode accepting both issuers' tokens, with its own
    token from ``own`` (client ``sluice``)."""
    return recording_proxy(
        broker.url, tmp_path, "--auth-mode", "proxy",
        "--auth-oidc-issuers", f"{issuers.idp.issuer},{issuers.short.issuer}",
        "--auth-oidc-audiences", "pulsar", "--auth-oidc-allow-http",
        "--auth-oidc-miss-refresh", "0",
        "--broker-auth-oauth2-issuer", own.issuer,
        "--broker-auth-oauth2-credentials", str(issuers.key_file(own, "sluice")),
        "--broker-auth-oauth2-audience", "pulsar", *extra,
    )  # fmt: skip


def client(url: str, auth: Any, timeout: int = 30) -> pulsar.Client:
    return pulsar.Client(url, authentication=auth, operation_timeout_seconds=timeout,
                         logger=QUIET)  # fmt: skip


def outcome(url: str, auth: Any, topic: str | None = None, timeout: int = 6) -> str:
    """What a client with ``auth`` gets producing: 'accepted' or the error's kind."""
    c = client(url, auth, timeout)
    try:
        c.create_producer(topic or unique("oidc"))
    except Exception as exc:
        return type(exc).__name__
    finally:
        c.close()
    return "accepted"


def round_trip(url: str, auth: Any, count: int = 10) -> list[bytes]:
    c = client(url, auth)
    try:
        topic = unique("oidc-rt")
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic, batching_enabled=False)
        sent = [f"m-{i}".encode() for i in range(count)]
        for body in sent:
            producer.send(body)
        return consume_exactly(consumer, count) if sent else []
    finally:
        c.close()


def http_status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def forged_token(issuer: str, kid: str) -> str:
    """A token naming an allowed issuer and one of its kids, signed by another key."""
    now = int(time.time())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"iss": issuer, "sub": "app", "aud": ["pulsar"], "iat": now, "nbf": now,
              "exp": now + 600}  # fmt: skip
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def test_oauth2_clients_are_allowed_and_refused_through_sluice_as_at_the_broker(
    oidc: tuple[ApachePulsar, Issuers], tmp_path: Path
) -> None:
    broker, issuers = oidc
    idp = issuers.idp
    http_port = free_port()
    proxy, admin, record = sluice_oidc(
        broker, issuers, idp, tmp_path,
        "--http-listen", f"127.0.0.1:{http_port}", "--broker-http", broker.http_url,
    )  # fmt: skip
    try:
        app = issuers.client_auth(idp, "app")
        assert round_trip(proxy.url, app) == [f"m-{i}".encode() for i in range(10)]
        # Refused the same way, directly and through Sluice: a role without
        # permission (authorization), a token for another audience, a token
        # signed by a key the issuer never had under its own kid, a token of
        # an issuer the broker does not trust.
        stranger = issuers.client_auth(idp, "stranger")
        elsewhere = Hydra(tmp_path)
        try:
            cases = {
                "stranger": stranger,
                "other audience": issuers.client_auth(idp, "wrong-aud", audience="other"),
                "forged": pulsar.AuthenticationToken(
                    forged_token(idp.issuer, idp.signing_keys()[0])
                ),
                "untrusted issuer": issuers.client_auth(elsewhere, "app"),
            }
            for name, auth in cases.items():
                direct, through = outcome(broker.url, auth), outcome(proxy.url, auth)
                assert direct != "accepted", name
                assert through == direct, (name, direct, through)
        finally:
            elsewhere.close()
        # The web port: the same token, the same answers.
        token = idp.token(json.loads(issuers.key_file(idp, "app").read_text()))
        topics = "/admin/v2/persistent/public/default"
        for bearer in (token, None, forged_token(idp.issuer, idp.signing_keys()[0])):
            direct_status = http_status(f"{broker.http_url}{topics}", bearer)
            assert http_status(f"http://127.0.0.1:{http_port}{topics}", bearer) == direct_status
        metrics = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    ok = metrics[("sluice_auth_total", (("method", "token"), ("outcome", "ok")))]
    failed = metrics[("sluice_auth_total", (("method", "token"), ("outcome", "failed")))]
    assert ok >= 2 and failed >= 2, metrics
    assert_all_valid(record)
    # The client's token is kept nowhere.
    for path in [proxy.log_path, *record.rglob("*")]:
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def test_a_key_rotated_at_the_issuer_while_clients_stay_connected_and_tokens_refresh(
    oidc: tuple[ApachePulsar, Issuers], tmp_path: Path
) -> None:
    """The client's tokens (the short-lived issuer's) expire every few
    seconds: Sluice challenges the client, as a broker would, and the client
    fetches a new token from Hydra. Midway the issuer rotates its signing
    key: the client's next token names a kid Sluice has not seen, whose key
    Sluice fetches, and the connections go on."""
    broker, issuers = oidc
    short = issuers.short
    proxy, admin, record = sluice_oidc(broker, issuers, issuers.idp, tmp_path,
                                       "--keepalive-interval", "1")  # fmt: skip
    try:
        c = client(proxy.url, issuers.client_auth(short, "app"))
        try:
            topic = unique("oidc-rotated")
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer = c.create_producer(topic, batching_enabled=False)
            sent: list[bytes] = []
            rotated_at = time.monotonic() + 2 * SHORT_TTL
            deadline = time.monotonic() + 5 * SHORT_TTL
            rotated = False
            while time.monotonic() < deadline:
                if not rotated and time.monotonic() >= rotated_at:
                    short.rotate("rotated-2")
                    rotated = True
                sent.append(f"r-{len(sent)}".encode())
                producer.send(sent[-1])
                time.sleep(0.2)
            assert consume_exactly(consumer, len(sent)) == sent
            # A new client after the rotation connects too.
            assert outcome(proxy.url, issuers.client_auth(short, "app")) == "accepted"
        finally:
            c.close()
        metrics = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert short.signing_keys()[0] == "rotated-2"
    refreshed = metrics[("sluice_auth_total", (("method", "token"), ("outcome", "refreshed")))]
    assert refreshed >= 4, metrics  # each connection at least twice, after the rotation too
    failed = metrics.get(("sluice_auth_total", (("method", "token"), ("outcome", "failed"))), 0)
    assert failed == 0, metrics
    log = proxy.log()
    fetched = log.count(f"OpenID Connect issuer {short.issuer}: ")
    assert fetched >= 2, log  # at start, and for the rotated key
    frames = assert_all_valid(record)
    # The producer and the consumer lived on their first connections.
    for command in ("PRODUCER", "SUBSCRIBE"):
        assert len([f for f in frames if f["cmd"] == command and f.get("topic") == topic]) == 1


def test_sluice_fetches_its_own_token_again_before_it_expires(
    oidc: tuple[ApachePulsar, Issuers], tmp_path: Path
) -> None:
    """Sluice's own token from the short-lived issuer: over several of its
    lifetimes, every lookup (which goes upstream with Sluice's token) is
    answered. (The broker closes a proxied connection whose proxy's own
    credential expired, as it does for its own proxy, unless the client's
    credentials are forwarded: that is why a long-lived own token is the
    norm; docs/proxy.md says so.)"""
    broker, issuers = oidc
    short = issuers.short
    proxy, _, _ = sluice_oidc(broker, issuers, short, tmp_path)
    try:
        app = issuers.client_auth(issuers.idp, "app")
        c = client(proxy.url, app)
        try:
            deadline = time.monotonic() + 4 * SHORT_TTL
            topics = 0
            while time.monotonic() < deadline:
                producer = c.create_producer(unique("oidc-own"), batching_enabled=False)
                producer.send(b"x")
                producer.close()
                topics += 1
                time.sleep(0.3)
        finally:
            c.close()
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.log()
    fetched = log.count(f"own token from OAuth2 issuer {short.issuer}")
    assert fetched >= 4, log  # at start, then before each expiry
    assert "not fetched" not in log, log
    assert topics >= 10


def test_a_reload_whose_own_token_does_not_come_is_refused_and_keeps_the_one_in_force(
    oidc: tuple[ApachePulsar, Issuers], tmp_path: Path
) -> None:
    """Sluice's own client secret rewritten in place with one the issuer
    refuses: the reload (SIGHUP) reads it again, fetches a token with it
    before putting it in force, gets none, and is refused, one line
    saying why; Sluice goes on logging in to the broker with the token it
    had, so a client is still answered. The secret put back as it was:
    unchanged. (A secret rewritten under its name went unnoticed; and an
    OAuth2 setting whose token did not come was put in force with an
    empty token.)"""
    broker, issuers = oidc
    own = tmp_path / "sluice.json"
    good = issuers.key_file(issuers.idp, "sluice").read_text()
    own.write_text(good)
    proxy, _, _ = sluice_oidc(broker, issuers, issuers.idp, tmp_path,
                              "--broker-auth-oauth2-credentials", str(own))  # fmt: skip

    def reloaded(outcome: str) -> str:
        """SIGHUP, and the log line of the reload it caused."""

        def lines() -> list[str]:
            return [x for x in proxy.log().splitlines() if "configuration reload (" in x]

        before = len(lines())
        os.kill(proxy.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while len(now := lines()) == before:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        assert f"): {outcome}" in now[before], now[before]
        return now[before]

    try:
        app = issuers.client_auth(issuers.idp, "app")
        assert outcome(proxy.url, app) == "accepted"
        own.write_text(json.dumps(json.loads(good) | {"client_secret": "not-the-secret"}))
        line = reloaded("refused")
        assert f"Sluice's own token from OAuth2 issuer {issuers.idp.issuer}" in line, line
        assert "could not be fetched" in line
        assert outcome(proxy.url, app) == "accepted"  # the token in force kept
        own.write_text(good)
        reloaded("unchanged")
        assert outcome(proxy.url, app) == "accepted"
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()
