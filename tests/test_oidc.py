"""OpenID Connect in proxy mode without an issuer: tokens of an allowed
issuer checked against its key set as Apache Pulsar's provider does, when
keys are wanted, the core waiting for them, Sluice's own client-credentials
token, and the settings' one-line errors. Against Ory Hydra and Apache
Pulsar: tests/test_oidc_e2e.py."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sluice.errors import ConfigError
from sluice.protocols.core import Ask, Authenticated, Close, Conn, OnInvalid, Peer, Send
from sluice.protocols.oidc import (
    ClientCredentials,
    KeysNeeded,
    OidcSettings,
    OidcVerifier,
    TokenRefused,
)
from sluice.protocols.pulsar import Type, command, decode_stream, encode, pb
from sluice.protocols.pulsar.auth import ProxyAuth
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.oidc import FetchError, _fetch, client_context
from tests.helpers.support import https_server
from tests.test_pulsar_core import Recording, connect_body

ISSUER = "https://idp.example/realm"
NOW = 1_800_000_000.0


class Issuer:
    """An identity provider's keys, as its JWKS publishes them."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.add("rsa-1", rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def add(self, kid: str, key: Any) -> None:
        self.keys[kid] = key

    def discovery(self, issuer: str = ISSUER) -> bytes:
        return json.dumps({"issuer": issuer, "jwks_uri": f"{ISSUER}/jwks.json"}).encode()

    def jwks(self) -> bytes:
        entries = []
        for kid, key in self.keys.items():
            algorithm = jwt.get_algorithm_by_name(
                "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
            )
            entry = json.loads(algorithm.to_jwk(key.public_key()))
            entries.append(entry | {"kid": kid, "use": "sig"})
        return json.dumps({"keys": entries}).encode()

    def token(self, kid: str = "rsa-1", alg: str | None = None, **claims: Any) -> str:
        key = self.keys[kid]
        alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
        body = {"iss": ISSUER, "aud": ["pulsar"], "sub": "app", "exp": NOW + 300, "iat": NOW,
                "nbf": NOW}  # fmt: skip
        body |= claims
        return jwt.encode({k: v for k, v in body.items() if v is not None}, key,
                          algorithm=alg, headers={"kid": kid})  # fmt: skip


def verifier(issuer: Issuer, **settings: Any) -> OidcVerifier:
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",), **settings))
    v.fetching(ISSUER, NOW)
    v.discovered(ISSUER, issuer.discovery())
    v.keys(ISSUER, issuer.jwks(), NOW)
    return v


def refused(v: OidcVerifier, token: str, now: float = NOW) -> str:
    with pytest.raises(TokenRefused) as caught:
        v.verify(token, now)
    return str(caught.value)


def test_a_token_of_an_allowed_issuer_names_its_role_and_expiry() -> None:
    idp = Issuer()
    idp.add("ec-1", ec.generate_private_key(ec.SECP256R1()))
    v = verifier(idp)
    assert v.verify(idp.token(), NOW) == ("app", NOW + 300)
    assert v.verify(idp.token("ec-1"), NOW)[0] == "app"
    # The role claim may be another, and a list (its first is the role).
    v = verifier(idp, role_claim="groups")
    assert v.verify(idp.token(groups=["ops", "dev"]), NOW)[0] == "ops"
    assert "no role in claim 'groups'" in refused(v, idp.token())


def test_what_the_broker_refuses_is_refused_with_its_reason() -> None:
    idp, stranger = Issuer(), Issuer()
    v = verifier(idp)
    assert "issuer 'https://else.example' is not allowed" in refused(
        v, idp.token(iss="https://else.example")
    )
    assert refused(v, idp.token(aud="other")) == "the token is not for an allowed audience"
    assert refused(v, idp.token(aud=None)) == "the token has no aud claim"
    # Required by the broker too.
    assert refused(v, idp.token(iat=None)) == "the token has no iat claim"
    assert refused(v, idp.token(nbf=None)) == "the token has no nbf claim"
    assert refused(v, idp.token(sub=None)) == "the token has no sub claim"
    assert refused(v, idp.token(exp=NOW - 1)) == "the token has expired"
    assert refused(v, idp.token(exp=None)) == "the token has no exp claim"
    assert refused(v, idp.token(nbf=NOW + 60)) == "the token is not valid yet"
    assert "issued in the future" in refused(v, idp.token(iat=NOW + 60))
    # Signed by another key under the same kid.
    assert refused(v, stranger.token()) == "bad signature"
    # HS256 with the public key as the secret: never an accepted algorithm.
    hs = jwt.encode({"iss": ISSUER, "aud": "pulsar", "sub": "app", "exp": NOW + 9}, "k" * 32,
                    algorithm="HS256", headers={"kid": "rsa-1"})  # fmt: skip
    assert "algorithm 'HS256' is not accepted" in refused(v, hs)
    assert refused(v, "not.a.jwt") == "a JWT part does not decode"
    # Leeway: an expired token within it passes (to be refreshed at once,
    # as by the broker, whose refresh check allows none).
    lenient = verifier(idp, leeway=30)
    assert lenient.verify(idp.token(exp=NOW - 10), NOW) == ("app", NOW - 10)


def test_a_token_whose_algorithm_does_not_fit_a_key_of_no_named_algorithm_is_refused() -> None:
    """A key set may leave ``alg`` out (RFC 7517; some issuers do, as this
    one): the key's type says which algorithms fit it (any RS* an RSA key,
    the ES* of an EC key's curve), and a token naming another is refused
    as any bad token, before its signature is checked. (Checked with the
    key, such a token raised TypeError: anybody, with no valid token, made
    each connection end with a traceback and no answer.)"""
    idp = Issuer()
    idp.add("ec-1", ec.generate_private_key(ec.SECP256R1()))
    assert all("alg" not in entry for entry in json.loads(idp.jwks())["keys"])
    v = verifier(idp)
    body = {"iss": ISSUER, "aud": ["pulsar"], "sub": "app", "exp": NOW + 300, "iat": NOW,
            "nbf": NOW}  # fmt: skip

    def forged(alg: str, key: Any, kid: str) -> str:
        return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})

    own_ec = ec.generate_private_key(ec.SECP256R1())
    assert refused(v, forged("ES256", own_ec, "rsa-1")) == (
        "algorithm ES256 does not fit the issuer's key (RS256, RS384, RS512)"
    )
    own_rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(v, forged("RS256", own_rsa, "ec-1")) == (
        "algorithm RS256 does not fit the issuer's key (ES256)"
    )
    p384 = ec.generate_private_key(ec.SECP384R1())
    assert refused(v, forged("ES384", p384, "ec-1")) == (
        "algorithm ES384 does not fit the issuer's key (ES256)"
    )
    # Those that fit still pass (RS384 with the RSA key too).
    assert v.verify(idp.token("rsa-1", alg="RS384"), NOW)[0] == "app"
    assert v.verify(idp.token("ec-1"), NOW)[0] == "app"
    # A CONNECT carrying one is answered as the broker answers a bad token.
    conn, _ = core(ProxyAuth("token", OwnToken(), oidc=v))
    actions = conn.receive_client(connect(forged("ES256", own_ec, "rsa-1")), time.monotonic())
    assert sent_types(actions) == ["ERROR"]
    closed = actions[-1]
    assert isinstance(closed, Close) and "does not fit" in closed.message


def test_an_issuer_over_https_must_name_its_keys_over_https() -> None:
    """The issuer's keys are what every token is checked with: one whose
    discovery document names a key set over http, when https is required
    (without --auth-oidc-allow-http), is refused, as an http issuer is
    (it was taken: keys fetched in the clear, open to being replaced)."""
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",)))
    v.fetching(ISSUER, NOW)
    document = json.dumps({"issuer": ISSUER, "jwks_uri": "http://idp.example/jwks"}).encode()
    with pytest.raises(TokenRefused, match=r"names a jwks_uri over http .* https is required"):
        v.discovered(ISSUER, document)
    lenient = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",),
                                        require_https=False))  # fmt: skip
    lenient.fetching(ISSUER, NOW)
    assert lenient.discovered(ISSUER, document) == "http://idp.example/jwks"


def test_keys_are_fetched_first_on_rotation_and_on_schedule_not_on_every_miss() -> None:
    idp = Issuer()
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",), miss_refresh=60))
    # Nothing fetched yet: the first token asks for the keys.
    with pytest.raises(KeysNeeded) as needed:
        v.verify(idp.token(), NOW)
    assert needed.value.issuer == ISSUER
    v.fetching(ISSUER, NOW)
    v.discovered(ISSUER, idp.discovery())
    v.keys(ISSUER, idp.jwks(), NOW)
    assert v.verify(idp.token(), NOW)[0] == "app"
    # The issuer rotates in a key: a token naming it asks for the keys again,
    # but not more often than miss_refresh (a forged kid cannot make every
    # CONNECT a fetch).
    idp.add("rsa-2", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    assert "has no key 'rsa-2'" in refused(v, idp.token("rsa-2"), NOW + 30)
    with pytest.raises(KeysNeeded):
        v.verify(idp.token("rsa-2"), NOW + 61)
    v.fetching(ISSUER, NOW + 61)
    v.keys(ISSUER, idp.jwks(), NOW + 61)
    assert v.verify(idp.token("rsa-2", exp=NOW + 400), NOW + 62)[0] == "app"
    # With miss_refresh 0 (the broker's "at once"), every unknown kid asks,
    # but the check after the fetch never asks again: it refuses.
    eager = verifier(idp, miss_refresh=0)
    idp.add("rsa-9", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(KeysNeeded):
        eager.verify(idp.token("rsa-9"), NOW)
    with pytest.raises(TokenRefused, match="has no key 'rsa-9'"):
        eager.verify(idp.token("rsa-9"), NOW, fetched=True)
    # Keys older than refresh_after are fetched again (on schedule: due()).
    assert not v.due(ISSUER, NOW + 62)
    assert v.due(ISSUER, NOW + 61 + v.settings.refresh_after)


def test_an_issuer_that_cannot_be_fetched_refuses_its_tokens_saying_why() -> None:
    idp = Issuer()
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",)))
    v.fetching(ISSUER, NOW)
    with pytest.raises(TokenRefused, match="names issuer 'https://else'"):
        v.discovered(ISSUER, idp.discovery("https://else"))
    v.failed(ISSUER, "https://idp.example/realm/.well-known/openid-configuration: refused", NOW)
    assert "could not be fetched: https://idp" in refused(v, idp.token(), NOW + 1)
    # Tried again, once RETRY_FAILED has passed.
    with pytest.raises(KeysNeeded):
        v.verify(idp.token(), NOW + 10)
    for bad in (b"[]", b"{", json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}).encode()):
        with pytest.raises(TokenRefused):
            v.keys(ISSUER, bad, NOW)


def test_rsa_keys_under_2048_bits_in_a_key_set_are_not_used() -> None:
    """As in a key file: a token signed by a 1024-bit key is refused, and a
    key set holding only such keys says so."""
    idp = Issuer()
    idp.add("weak", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    v = verifier(idp)
    assert v.keys(ISSUER, idp.jwks(), NOW) == 1  # rsa-1 only
    assert refused(v, idp.token("weak"), NOW)
    assert v.verify(idp.token(), NOW)[0] == "app"
    del idp.keys["rsa-1"]
    with pytest.raises(TokenRefused, match=r"no RSA or EC signing key \(1 RSA under 2048 bits"):
        v.keys(ISSUER, idp.jwks(), NOW)


def test_settings_mistakes_are_one_line_each() -> None:
    def mistake(**changes: Any) -> str:
        base: dict[str, Any] = {"issuers": (ISSUER,), "audiences": ("pulsar",)}
        with pytest.raises(ConfigError) as caught:
            OidcSettings(**(base | changes)).check()
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert "--auth-oidc-audiences is needed" in mistake(audiences=())
    assert "must use https" in mistake(issuers=("http://idp.example",))
    assert "not an http(s) URL" in mistake(issuers=("idp.example",))
    assert "at least 0" in mistake(leeway=-1)
    OidcSettings(("http://127.0.0.1:4444/",), ("pulsar",), require_https=False).check()

    def proxy_mistake(**fields: Any) -> str:
        base: dict[str, Any] = {"broker": parse_broker_url("pulsar://b:6650"), "auth_mode": "proxy"}
        with pytest.raises(ConfigError) as caught:
            ProxyConfig(**(base | fields))
        return str(caught.value)

    assert "--auth-oidc-issuers" in proxy_mistake(broker_auth_token_file=Path("t"))
    assert "one own credential" in proxy_mistake(
        auth_oidc_issuers=(ISSUER,), broker_auth_token_file=Path("t"),
        broker_auth_oauth2_issuer=ISSUER,
    )  # fmt: skip
    assert "only with --auth-mode proxy" in proxy_mistake(
        auth_mode="passthrough", auth_oidc_issuers=(ISSUER,)
    )
    # Sluice's own client secret goes to its issuer: https unless allowed.
    secret = Path(__file__)  # (any file: the scheme is refused before it is read)
    plain = "http://idp.example/realm"
    own: dict[str, Any] = {
        "auth_oidc_issuers": (ISSUER,), "auth_oidc_audiences": ("pulsar",),
        "broker_auth_oauth2_issuer": plain, "broker_auth_oauth2_credentials": secret,
    }  # fmt: skip
    assert "must use https (Sluice's client secret goes to it)" in proxy_mistake(**own)
    # Allowed: on to reading the file, which is no credentials file.
    allowed = proxy_mistake(**own, auth_oidc_allow_http=True)
    assert "must use https" not in allowed and str(secret) in allowed, allowed


def test_client_credentials_ask_for_a_token_and_know_when_to_ask_again(tmp_path: Path) -> None:
    key_file = tmp_path / "credentials.json"
    key_file.write_text(json.dumps({"client_id": "sluice", "client_secret": "s3cret"}))
    own = ClientCredentials.load(ISSUER, key_file, audience="pulsar")
    assert "s3cret" not in repr(own)
    assert own.current() == b""
    assert own.discovery_url == f"{ISSUER}/.well-known/openid-configuration"
    own.discovered(json.dumps({"token_endpoint": f"{ISSUER}/token"}).encode())
    assert own.token_endpoint == f"{ISSUER}/token"
    assert own.request() == (
        b"grant_type=client_credentials&client_id=sluice&client_secret=s3cret&audience=pulsar"
    )
    assert own.took(json.dumps({"access_token": "T", "expires_in": 100}).encode(), NOW) == 100
    assert own.current() == b"T"
    assert own.refresh_at() == NOW + 80
    with pytest.raises(TokenRefused, match="no access token: 'invalid_client'"):
        own.took(json.dumps({"error": "invalid_client"}).encode(), NOW)
    assert own.current() == b"T"  # the last good one is kept
    key_file.write_text("{}")
    with pytest.raises(ConfigError, match="no client_id"):
        ClientCredentials.load(ISSUER, key_file)


# --- the core waits for the keys ----------------------------------------------------


def core(auth: ProxyAuth) -> tuple[PulsarConnection, Recording]:
    rec = Recording()
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, auth)
    conn = PulsarConnection(Conn(1, "127.0.0.1:5000", "plain", "pulsar"), settings,
                            Routing(parse_broker_url("pulsar://b:6650")), rec)  # fmt: skip
    return conn, rec


def connect(token: str) -> bytes:
    body = connect_body(auth_method_name="token", auth_data=token.encode())
    return encode(command(Type.CONNECT, body))


def sent_types(actions: list[Any]) -> list[str]:
    out = []
    for action in actions:
        if isinstance(action, Send) and action.to is Peer.CLIENT:
            out += [f.name for f in decode_stream(action.data)]
    return out


class OwnToken:
    def current(self) -> bytes:
        return b"own"


def test_a_connect_waits_for_its_issuers_keys_then_is_answered() -> None:
    idp = Issuer()
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",)))
    auth = ProxyAuth("token", OwnToken(), oidc=v)
    conn, rec = core(auth)
    now = time.monotonic()
    fresh = idp.token(exp=time.time() + 60, iat=time.time(), nbf=time.time())
    actions = conn.receive_client(connect(fresh), now)
    asks = [a for a in actions if isinstance(a, Ask)]
    assert len(asks) == 1 and isinstance(asks[0].request, KeysNeeded)
    assert sent_types(actions) == []
    # A PING sent meanwhile waits behind the CONNECT.
    assert conn.receive_client(encode(command(Type.PING, pb.CommandPing())), now) == []
    # The proxy fetched the keys; the core checks again and answers both.
    v.fetching(ISSUER, time.time())
    v.discovered(ISSUER, idp.discovery())
    v.keys(ISSUER, idp.jwks(), time.time())
    answered = conn.answered(asks[0].token, None, now)  # type: ignore[arg-type]
    assert sent_types(answered) == ["CONNECTED", "PONG"]
    assert [e.outcome for e in rec.of(Authenticated)] == ["ok"]


def test_a_connect_whose_issuer_cannot_be_fetched_is_refused_as_by_the_broker() -> None:
    idp = Issuer()
    v = OidcVerifier(OidcSettings(issuers=(ISSUER,), audiences=("pulsar",)))
    conn, _ = core(ProxyAuth("token", OwnToken(), oidc=v))
    now = time.monotonic()
    (ask,) = [a for a in conn.receive_client(connect(idp.token()), now) if isinstance(a, Ask)]
    v.fetching(ISSUER, time.time())
    v.failed(ISSUER, "connection refused", time.time())
    answered = conn.answered(ask.token, None, now)  # type: ignore[arg-type]
    assert sent_types(answered) == ["ERROR"]
    error = next(iter(decode_stream(next(a for a in answered if isinstance(a, Send)).data)))
    assert error.body.error == pb.AuthenticationError
    assert error.body.message == "Failed to authenticate"
    assert isinstance(answered[-1], Close)


def test_keys_fetched_over_https_are_not_taken_from_a_redirect_to_http(tmp_path: Path) -> None:
    """An https issuer whose answer redirects to plain HTTP: refused, and
    the plain server never asked; a redirect to https is followed."""
    asked: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(f"{self.headers['Host']}{self.path}")
            if self.path.startswith("/to-"):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/to-").replace("|", "/"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    with https_server(tmp_path, Answer) as (secure, ca_file):
        try:
            context = client_context(ca_file)
            https, http_ = (f"localhost:{s.server_port}" for s in (secure, plain))
            down = f"https://{https}/to-http:||{http_}|jwks"
            with pytest.raises(FetchError, match=r"redirected to 'http://.*', not https"):
                _fetch(down, None, context, 10)
            assert not any(a.startswith(http_) for a in asked), asked
            assert _fetch(f"https://{https}/to-https:||{https}|jwks", None, context, 10) == b"{}"
            assert asked[-1] == f"{https}/jwks"
        finally:
            plain.shutdown()
            plain.server_close()
