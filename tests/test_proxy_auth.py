"""--auth-mode proxy without a broker: the token checks (keys in the formats
Pulsar's tools write), the core's handshake, refresh and upstream CONNECT,
and the settings' one-line errors. Against Apache Pulsar:
tests/test_apache_pulsar.py."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from sluice.addresses import Address
from sluice.brokers.apache_pulsar import hs256_token
from sluice.errors import ConfigError
from sluice.protocols.core import Authenticated, Close, Conn, OnInvalid, OpenUpstream, Peer, Send
from sluice.protocols.pulsar import decode_stream, pb
from sluice.protocols.pulsar.auth import (
    AuthError,
    ProxyAuth,
    TokenVerifier,
    UpstreamAuth,
)
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from tests.test_pulsar_core import Recording, connect_body, frame_bytes, sent

SECRET = b"0123456789abcdef0123456789abcdef"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(alg: str, claims: dict[str, Any], key: Any) -> str:
    """A JWT signed with a private key (RS*, ES*), for the verifier to check."""
    head = f"{b64(json.dumps({'alg': alg}).encode())}.{b64(json.dumps(claims).encode())}"
    digest = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
    if alg.startswith("RS"):
        signature = key.sign(head.encode(), padding.PKCS1v15(), digest)
    else:
        r, s = decode_dss_signature(key.sign(head.encode(), ec.ECDSA(digest)))
        size = (key.curve.key_size + 7) // 8
        signature = r.to_bytes(size, "big") + s.to_bytes(size, "big")
    return f"{head}.{b64(signature)}"


def public_der(key: Any, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return path


# --- the verifier -----------------------------------------------------------------------


def test_hs256_tokens_as_the_broker_reads_them(tmp_path: Path) -> None:
    (tmp_path / "secret.key").write_bytes(SECRET)
    verifier = TokenVerifier.secret_key(tmp_path / "secret.key")
    now = time.time()
    assert verifier.verify(hs256_token(SECRET, "app"), now) == ("app", None)
    assert verifier.verify(hs256_token(SECRET, "app", now + 60), now) == ("app", int(now + 60))
    with pytest.raises(AuthError, match="expired"):
        verifier.verify(hs256_token(SECRET, "app", now - 1), now)
    with pytest.raises(AuthError, match="bad signature"):
        verifier.verify(hs256_token(b"another key", "app"), now)
    for garbage in ("", "a.b", "x.y.z", "e30.e30.e30"):
        with pytest.raises(AuthError):
            verifier.verify(garbage, now)


@pytest.mark.parametrize("alg", ["RS256", "RS512", "ES256", "ES384"])
def test_public_key_tokens_der_and_pem(alg: str, tmp_path: Path) -> None:
    if alg.startswith("RS"):
        key: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        key = ec.generate_private_key(ec.SECP256R1() if alg == "ES256" else ec.SECP384R1())
    der = TokenVerifier.public_key(public_der(key, tmp_path / "public.key"))
    pem_file = tmp_path / "public.pem"
    pem_file.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    pem = TokenVerifier.public_key(pem_file)
    now = time.time()
    token = signed(alg, {"sub": "app", "exp": int(now + 60)}, key)
    for verifier in (der, pem):
        assert verifier.verify(token, now) == ("app", int(now + 60))
    tampered = token.rsplit(".", 1)[0] + "." + b64(b"\0" * 64)
    with pytest.raises(AuthError, match="bad signature"):
        der.verify(tampered, now)
    # The algorithm must be the key's: an HS token "signed" with the public
    # key's bytes is the classic forgery.
    public_bytes = (tmp_path / "public.key").read_bytes()
    with pytest.raises(AuthError, match="does not match"):
        der.verify(hs256_token(public_bytes, "admin"), now)


def test_claims_not_before_role_claim_and_none_algorithm(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    verifier = TokenVerifier.public_key(public_der(key, tmp_path / "k"), role_claim="role")
    now = time.time()
    assert verifier.verify(signed("ES256", {"role": "ops", "sub": "x"}, key), now)[0] == "ops"
    with pytest.raises(AuthError, match="no role in claim 'role'"):
        verifier.verify(signed("ES256", {"sub": "x"}, key), now)
    with pytest.raises(AuthError, match="not valid yet"):
        verifier.verify(signed("ES256", {"role": "ops", "nbf": now + 60}, key), now)
    with pytest.raises(AuthError, match="not a time"):
        verifier.verify(signed("ES256", {"role": "ops", "exp": "soon"}, key), now)
    head, body = json.dumps({"alg": "none"}).encode(), json.dumps({"role": "ops"}).encode()
    unsigned = f"{b64(head)}.{b64(body)}."
    with pytest.raises(AuthError, match="not accepted"):
        verifier.verify(unsigned, now)


def test_an_audience_is_checked_when_given(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    path = public_der(key, tmp_path / "k")
    verifier = TokenVerifier.public_key(path, audience="orders-cluster")
    now = time.time()
    for aud in ("orders-cluster", ["other", "orders-cluster"]):
        assert verifier.verify(signed("ES256", {"sub": "app", "aud": aud}, key), now)[0] == "app"
    for claims in ({"sub": "app", "aud": "other"}, {"sub": "app"}):
        with pytest.raises(AuthError, match="audience"):
            verifier.verify(signed("ES256", claims, key), now)
    # Without --auth-token-audience, aud is not looked at (the broker's default too).
    unchecked = TokenVerifier.public_key(path)
    assert unchecked.verify(signed("ES256", {"sub": "a", "aud": "x"}, key), now)[0] == "a"


def test_hostile_tokens_are_refused_not_raised(tmp_path: Path) -> None:
    (tmp_path / "secret.key").write_bytes(SECRET)
    verifier = TokenVerifier.secret_key(tmp_path / "secret.key")
    deep = b64(b"[" * 100_000)
    valid = hs256_token(SECRET, "app")
    head = b64(json.dumps({"alg": "HS256"}).encode())
    body = b64(b'{"sub": "a", "exp": 1e400}')
    huge_exp = head + "." + body + ".c2ln"
    for token in (f"{deep}.{deep}.x", "a" * 20_000, valid + "!!", huge_exp):
        with pytest.raises(AuthError):
            verifier.verify(token, time.time())


def test_sluices_own_token_is_read_again_when_its_file_changes(tmp_path: Path) -> None:
    core, _ = proxy_core(tmp_path)
    auth = core.settings.auth
    assert auth is not None and auth.own.data == hs256_token(SECRET, "sluice").encode()
    assert auth.own_token is not None
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice-2") + "\n")
    auth.own_token._checked = 0.0  # as if a second had passed
    assert auth.own.data == hs256_token(SECRET, "sluice-2").encode()
    (tmp_path / "sluice.token").write_text("")  # a broken rotation keeps the last good one
    auth.own_token._checked = 0.0
    assert auth.own.data == hs256_token(SECRET, "sluice-2").encode()


def test_key_files_that_do_not_load_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "junk").write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="empty"):
        TokenVerifier.secret_key(tmp_path / "empty")
    with pytest.raises(ConfigError, match="not a public key"):
        TokenVerifier.public_key(tmp_path / "junk")
    with pytest.raises(ConfigError, match="No such file"):
        TokenVerifier.secret_key(tmp_path / "missing")


# --- the core ---------------------------------------------------------------------------


def own_frames(actions: list[Any]) -> list[Any]:
    return sent(actions, Peer.CLIENT)


def proxy_core(tmp_path: Path, **options: Any) -> tuple[PulsarConnection, Recording]:
    (tmp_path / "secret.key").write_bytes(SECRET)
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice") + "\n")
    auth = ProxyAuth.load(secret_key=tmp_path / "secret.key", public_key=None,
                          role_claim="sub", own_token=tmp_path / "sluice.token",
                          tls_roles=False, **{"forward_auth_data": False, **options})  # fmt: skip
    rec = Recording()
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, auth),
        Routing(parse_broker_url("pulsar://127.0.0.1:6650")),
        rec,
    )
    return core, rec


def test_a_bad_token_gets_the_brokers_error_and_a_close(tmp_path: Path) -> None:
    core, rec = proxy_core(tmp_path)
    connect = connect_body(auth_method_name="token", auth_data=hs256_token(b"x", "app").encode())
    out = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    (error,) = own_frames(out)
    assert error.name == "ERROR" and error.body.error == pb.AuthenticationError
    assert error.body.message == "Failed to authenticate"
    assert isinstance(out[-1], Close) and out[-1].reason == "auth"
    assert Authenticated("token", "failed") in rec.events


def test_the_relayed_connect_is_sluices_naming_the_client(tmp_path: Path) -> None:
    core, rec = proxy_core(tmp_path, forward_auth_data=True)
    token = hs256_token(SECRET, "app")
    connect = connect_body(auth_method_name="token", auth_data=token.encode(),
                           proxy_to_broker_url="127.0.0.1:6650")  # fmt: skip
    (opened,) = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    assert isinstance(opened, OpenUpstream)
    (upstream,) = decode_stream(opened.hello, 1 << 20)
    sent = upstream.body
    assert sent.auth_method_name == "token"
    assert sent.auth_data == hs256_token(SECRET, "sluice").encode()
    assert (sent.original_principal, sent.original_auth_method) == ("app", "token")
    assert sent.original_auth_data == token  # --forward-auth-data
    assert Authenticated("token", "ok") in rec.events
    # The broker challenging Sluice's login is answered with Sluice's token.
    challenge = pb.CommandAuthChallenge(challenge=pb.AuthData(auth_method_name="token"))
    out = core.receive_broker(frame_bytes("AUTH_CHALLENGE", challenge), 0.1)
    (answer,) = [a for a in out if isinstance(a, Send)]
    (response,) = decode_stream(answer.data, 1 << 20)
    assert response.name == "AUTH_RESPONSE"
    assert response.body.response.auth_data == hs256_token(SECRET, "sluice").encode()


def test_an_expired_token_is_challenged_and_a_silent_client_closed(tmp_path: Path) -> None:
    core, rec = proxy_core(tmp_path)
    token = hs256_token(SECRET, "app", time.time() + 2)  # whole seconds: 1 to 2 s left
    hello = frame_bytes("CONNECT", connect_body(auth_method_name="token", auth_data=token.encode()))
    core.receive_client(hello, 0.0)
    assert core.keepalive(0.5, 10.0) == []
    (challenge,) = own_frames(core.keepalive(2.0, 10.0))
    assert challenge.name == "AUTH_CHALLENGE"
    assert challenge.body.challenge.auth_data == b"PulsarAuthRefresh"
    # A fresh token of the same role: kept; of another role: refused.
    fresh = hs256_token(SECRET, "app", time.time() + 60)
    answer = pb.CommandAuthResponse(response=pb.AuthData(auth_method_name="token",
                                                         auth_data=fresh.encode()))  # fmt: skip
    assert core.receive_client(frame_bytes("AUTH_RESPONSE", answer), 2.5) == []
    assert Authenticated("token", "refreshed") in rec.events
    assert core.keepalive(12.0, 10.0) == []  # valid for a minute now
    # Expired again and silent for an interval: closed as a broker would.
    core, rec = proxy_core(tmp_path)
    core.receive_client(hello, 0.0)
    assert own_frames(core.keepalive(2.0, 10.0))
    out = core.keepalive(12.5, 10.0)
    assert isinstance(out[-1], Close) and out[-1].reason == "auth"
    assert Authenticated("token", "expired") in rec.events


# --- settings ---------------------------------------------------------------------------


def test_settings_say_what_is_missing() -> None:
    broker = parse_broker_url("pulsar://127.0.0.1:6650")
    listen = Address("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="needs a way to check clients"):
        ProxyConfig(broker=broker, listen=listen, auth_mode="proxy",
                    broker_auth_token_file=Path("t"))  # fmt: skip
    with pytest.raises(ConfigError, match="own credentials"):
        ProxyConfig(broker=broker, listen=listen, auth_mode="proxy",
                    auth_token_secret_key=Path("k"))  # fmt: skip
    with pytest.raises(ConfigError, match="only with --auth-mode proxy"):
        ProxyConfig(broker=broker, listen=listen, forward_auth_data=True)
    with pytest.raises(ConfigError, match="is for Pulsar: a Cursus broker has no proxy roles"):
        ProxyConfig(broker=broker, listen=listen, protocol="cursus", auth_mode="proxy",
                    auth_token_secret_key=Path("k"), broker_auth_token_file=Path("t"))  # fmt: skip
    assert repr(UpstreamAuth("token", b"secret", "app")).count("secret") == 0


def test_the_command_line_reports_a_missing_key_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [".venv/bin/sluice", "proxy", "--broker", "pulsar://127.0.0.1:1", "--auth-mode", "proxy",
         "--auth-token-secret-key", str(tmp_path / "nope"), "--broker-auth-token-file",
         str(tmp_path / "nope-either"), "--no-check-broker"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--auth-token-secret-key" in result.stderr and "Traceback" not in result.stderr
