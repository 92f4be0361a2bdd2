"""--auth-mode proxy without a broker: the token checks (keys in the formats
Pulsar's tools write), the core's handshake, refresh and upstream CONNECT,
and the settings' one-line errors. Against Apache Pulsar:
tests/test_apache_pulsar.py."""

from __future__ import annotations

import base64
import datetime
import json
import math
import ssl
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.addresses import Address
from sluice.brokers.apache_pulsar import hs256_token
from sluice.errors import ConfigError
from sluice.protocols.core import Authenticated, Close, Conn, OnInvalid, OpenUpstream, Peer, Send
from sluice.protocols.http import with_credentials
from sluice.protocols.pulsar import Type, command, decode_stream, encode, pb
from sluice.protocols.pulsar.auth import (
    AuthError,
    OwnToken,
    ProxyAuth,
    TokenVerifier,
    UpstreamAuth,
)
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsServerConfig
from sluice.proxy.pulsar import FrameStream
from sluice.proxy.server import Proxy
from tests.helpers.support import SLUICE
from tests.test_pulsar_core import Recording, connect_body, frame_bytes, proxied_core, sent

SECRET = b"0123456789abcdef0123456789abcdef"
# 512 bits: every HS algorithm reaches the claims.
HOSTILE_VERIFIER = TokenVerifier(SECRET * 2)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(
    alg: str,
    claims: dict[str, Any] | bytes,
    key: Any,
    *,
    header: dict[str, Any] | None = None,
    es_size: int | None = None,
) -> str:
    """A JWT signed properly (HS* with a secret, RS*, PS*, ES* with a private
    key), written here with ``cryptography`` rather than the library Sluice
    checks with; ``claims`` as bytes: the payload exactly (JSON that
    ``json.dumps`` would not write); ``es_size``: bytes per ES integer
    (default: the curve's, as RFC 7518 says)."""
    body = claims if isinstance(claims, bytes) else json.dumps(claims).encode()
    head = f"{b64(json.dumps({'alg': alg, **(header or {})}).encode())}.{b64(body)}"
    digest = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
    if alg.startswith("HS"):
        mac = hmac.HMAC(key, digest)
        mac.update(head.encode())
        signature = mac.finalize()
    elif alg.startswith("RS"):
        signature = key.sign(head.encode(), padding.PKCS1v15(), digest)
    elif alg.startswith("PS"):
        pss = padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size)
        signature = key.sign(head.encode(), pss, digest)
    else:
        r, s = decode_dss_signature(key.sign(head.encode(), ec.ECDSA(digest)))
        size = es_size or (key.curve.key_size + 7) // 8
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


def secret_verifier(tmp_path: Path, secret: bytes = SECRET) -> TokenVerifier:
    (tmp_path / "secret.key").write_bytes(secret)
    return TokenVerifier.secret_key(tmp_path / "secret.key")


@pytest.mark.parametrize(
    ("claims", "error"),
    [
        (b'{"sub": "a", "exp": 1e400}', "claim exp is not a time"),  # inf
        (b'{"sub": "a", "exp": NaN}', "claim exp is not a time"),
        (b'{"sub": "a", "nbf": -Infinity}', "claim nbf is not a time"),
        ({"sub": "a", "exp": 1e300}, "claim exp is not a time"),
        ({"sub": "a", "exp": True}, "claim exp is not a time"),
        ({"sub": "a", "exp": "soon"}, "claim exp is not a time"),
        ({"sub": "a", "nbf": [1]}, "claim nbf is not a time"),
        ({"sub": 7}, "no role in claim 'sub'"),
        ({"sub": "  "}, "no role in claim 'sub'"),
        ({"role": "a"}, "no role in claim 'sub'"),
        (b"[" * 11_000, "a JWT part does not decode"),  # deep JSON, under the size cap
        (b"[]", "a JWT part does not decode"),  # not an object
        (b"\xff\xfe", "a JWT part does not decode"),  # not UTF-8
    ],
)
def test_hostile_claims_signed_with_the_key_get_their_own_error(
    claims: dict[str, Any] | bytes, error: str, tmp_path: Path
) -> None:
    """Each token is signed with the configured key, so it reaches the check
    it is meant for (a fake signature would be refused before it)."""
    verifier = secret_verifier(tmp_path)
    token = signed("HS256", claims, SECRET)
    assert len(token) <= 16 * 1024
    with pytest.raises(AuthError) as refused:
        verifier.verify(token, time.time())
    assert str(refused.value) == error


def test_hostile_token_forms_are_refused_not_raised(tmp_path: Path) -> None:
    verifier = secret_verifier(tmp_path)
    valid = hs256_token(SECRET, "app")
    deep_header = f"{b64(b'[' * 11_000)}.{b64(b'{}')}.{b64(b'x')}"
    cases = {
        "a" * 20_000: "token over 16384 bytes",
        valid + "!!": "a JWT part does not decode",
        valid.replace(".", "=.", 1): "a JWT part does not decode",  # padded: another spelling
        deep_header: "a JWT part does not decode",
        "e30.e30.e30": "no signature algorithm",
        valid.rsplit(".", 1)[0] + ".": "bad signature",
    }
    for token, error in cases.items():
        with pytest.raises(AuthError) as refused:
            verifier.verify(token, time.time())
        assert str(refused.value) == error, token[:60]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
CLAIM_NAMES = st.sampled_from(["sub", "exp", "nbf", "aud", "iat", "role"]) | st.text(max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    header=st.dictionaries(
        st.sampled_from(["alg", "crit", "kid", "b64", "typ", "x"]), JSON, max_size=4
    ),
    claims=st.dictionaries(CLAIM_NAMES, JSON, max_size=6) | JSON,
    alg=st.sampled_from(["HS256", "HS384", "HS512"]),
)
def test_any_json_signed_with_the_key_is_an_answer_or_an_auth_error(
    header: dict[str, Any], claims: Any, alg: str
) -> None:
    """Whatever JSON a token carries, signed with the configured key so
    every check is reached: a role, or AuthError; never another exception."""
    body = json.dumps(claims).encode()  # Infinity and NaN included
    token = signed(alg, body, SECRET * 2, header=header)
    try:
        role, expires = HOSTILE_VERIFIER.verify(token, time.time())
    except AuthError as refused:
        assert len(str(refused)) < 320
    else:
        assert isinstance(role, str) and role.strip()
        assert expires is None or math.isfinite(expires)


def test_non_canonical_base64_is_refused(tmp_path: Path) -> None:
    """A signature of 32 bytes is 43 base64url characters with 2 bits
    unused: setting them spells the same bytes another way, which a lenient
    decoder accepts (and which would be one more spelling of one token)."""
    verifier = secret_verifier(tmp_path)
    token = hs256_token(SECRET, "app")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    other = alphabet[alphabet.index(token[-1]) ^ 1]
    spelled = token[:-1] + other
    assert base64.urlsafe_b64decode(spelled.rsplit(".", 1)[1] + "=") == base64.urlsafe_b64decode(
        token.rsplit(".", 1)[1] + "="
    )
    assert verifier.verify(token, time.time()) == ("app", None)
    with pytest.raises(AuthError, match=r"^a JWT part does not decode$"):
        verifier.verify(spelled, time.time())


def test_a_critical_header_sluice_does_not_know_is_refused(tmp_path: Path) -> None:
    verifier = secret_verifier(tmp_path)
    for crit in (["exp"], ["x-sluice-test"], "exp", []):
        token = signed("HS256", {"sub": "app"}, SECRET, header={"crit": crit, "exp": 1})
        with pytest.raises(AuthError, match="crit"):
            verifier.verify(token, time.time())
    # The extension's name is the client's: clipped in the reason (and so in the log).
    token = signed("HS256", {"sub": "app"}, SECRET, header={"crit": ["x" * 10_000]})
    with pytest.raises(AuthError) as refused:
        verifier.verify(token, time.time())
    assert len(str(refused.value)) < 200


def test_es_signatures_of_the_wrong_length_are_refused(tmp_path: Path) -> None:
    """RFC 7518: an ES256 signature is r and s in 32 bytes each, exactly."""
    key = ec.generate_private_key(ec.SECP256R1())
    verifier = TokenVerifier.public_key(public_der(key, tmp_path / "k"))
    assert verifier.verify(signed("ES256", {"sub": "app"}, key), time.time()) == ("app", None)
    for size in (33, 48):  # the same integers, zero-padded
        with pytest.raises(AuthError, match=r"^bad signature$"):
            verifier.verify(signed("ES256", {"sub": "app"}, key, es_size=size), time.time())


@pytest.mark.parametrize("alg", ["PS256", "PS384", "PS512"])
def test_rsa_pss_tokens_are_accepted_as_pulsar_does(alg: str, tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verifier = TokenVerifier.public_key(public_der(key, tmp_path / "k"))
    now = time.time()
    token = signed(alg, {"sub": "app", "exp": int(now + 60)}, key)
    assert verifier.verify(token, now) == ("app", int(now + 60))
    # PKCS#1 v1.5 under a PS name (and the reverse) is a bad signature.
    pkcs1 = signed("RS" + alg[2:], {"sub": "app"}, key)
    relabelled = signed(alg, {"sub": "app"}, key).rsplit(".", 1)[0] + "." + pkcs1.rsplit(".")[2]
    with pytest.raises(AuthError, match=r"^bad signature$"):
        verifier.verify(relabelled, now)


def test_a_public_key_given_as_the_secret_is_refused_at_start(tmp_path: Path) -> None:
    """With a public key file as --auth-token-secret-key, its bytes would be
    the HMAC secret, and anyone holding the public key could sign any role."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    forms = {
        "rsa.der": public_der(rsa_key, tmp_path / "rsa.der").read_bytes(),
        "ec.der": public_der(ec_key, tmp_path / "ec.der").read_bytes(),
        "rsa.pem": rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        "ec-private.pem": ec_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    }
    for name, data in forms.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ConfigError, match="not a secret") as refused:
            verifier = TokenVerifier.secret_key(path)
            forged = signed("HS256", {"sub": "admin"}, data)  # from public bytes only
            verifier.verify(forged, time.time())  # accepted as 'admin' before the fix
        assert str(path) in str(refused.value) and "--auth-token-public-key" in str(refused.value)


def test_keys_shorter_than_pulsar_allows_are_refused(tmp_path: Path) -> None:
    """jjwt, Pulsar's token library: a secret of at least 256 bits (and as
    many as the hash for HS384 and HS512), RSA of at least 2048 bits."""
    with pytest.raises(
        ConfigError, match=r"the secret is 31 bytes \(248 bits\); at least 32 bytes"
    ):
        secret_verifier(tmp_path, SECRET[:31])
    verifier = secret_verifier(tmp_path, SECRET)  # 32 bytes: HS256 only
    assert verifier.verify(signed("HS256", {"sub": "a"}, SECRET), time.time())[0] == "a"
    for alg in ("HS384", "HS512"):
        with pytest.raises(AuthError, match="does not fit"):
            verifier.verify(signed(alg, {"sub": "a"}, SECRET), time.time())
    long_secret = SECRET * 2
    verifier = secret_verifier(tmp_path, long_secret)
    assert verifier.verify(signed("HS512", {"sub": "a"}, long_secret), time.time())[0] == "a"
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(ConfigError, match="the RSA key is 1024 bits; at least 2048"):
        TokenVerifier.public_key(public_der(small, tmp_path / "small.der"))
    odd_curve = ec.generate_private_key(ec.SECP256K1())
    with pytest.raises(ConfigError, match="P-256, P-384 or P-521"):
        TokenVerifier.public_key(public_der(odd_curve, tmp_path / "k1.der"))


def test_a_refused_algorithm_is_clipped_in_the_reason(tmp_path: Path) -> None:
    """The reason goes to the log (one line per refused connection): a
    client's 10 KB algorithm name must not."""
    verifier = secret_verifier(tmp_path)
    long_alg = "X" * 10_000
    token = signed("HS256", {"sub": "a"}, SECRET).split(".", 1)[1]
    token = f"{b64(json.dumps({'alg': long_alg}).encode())}.{token}"
    with pytest.raises(AuthError) as refused:
        verifier.verify(token, time.time())
    reason = str(refused.value)
    assert reason.startswith("algorithm 'XXXX") and "(9936 more)" in reason
    assert len(reason) < 200
    with pytest.raises(AuthError, match=r"^algorithm RS256 does not match the secret key"):
        verifier.verify(signed("HS256", {"sub": "a"}, SECRET).replace(
            b64(b'{"alg": "HS256"}'), b64(b'{"alg": "RS256"}')), time.time())  # fmt: skip


def test_sluices_own_token_is_read_again_when_its_file_changes(tmp_path: Path) -> None:
    core, _ = proxy_core(tmp_path)
    auth = core.settings.auth
    assert auth is not None and auth.own.data == hs256_token(SECRET, "sluice").encode()
    own = auth.own_token
    assert isinstance(own, OwnToken)
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice-2") + "\n")
    own._checked = 0.0  # as if a second had passed
    assert auth.own.data == hs256_token(SECRET, "sluice-2").encode()
    (tmp_path / "sluice.token").write_text("")  # a broken rotation keeps the last good one
    own._checked = 0.0
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


def test_the_logged_reason_for_a_refused_client_is_clipped(tmp_path: Path) -> None:
    """The close's message is what the relay logs: a client's 10 KB
    algorithm name (or auth method) is shown clipped, on one line."""
    header = b64(json.dumps({"alg": "X" * 10_000 + "\n2026 forged log line"}).encode())
    token = f"{header}.{hs256_token(SECRET, 'app').split('.', 1)[1]}"
    for method, data in (("token", token.encode()), ("m" * 10_000, b"")):
        core, _ = proxy_core(tmp_path)
        connect = connect_body(auth_method_name=method, auth_data=data)
        out = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
        assert isinstance(out[-1], Close) and out[-1].reason == "auth"
        message = out[-1].message
        assert "more)" in message and "\n" not in message and len(message) < 200, message


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


def test_a_passthrough_connection_stays_so_when_a_reload_turns_proxy_mode_on(
    tmp_path: Path,
) -> None:
    """Connections already open keep what they were accepted with
    (docs/proxy.md, reload). One accepted in passthrough (its broker
    authenticated the client) goes on passing the broker's refresh
    challenge to the client and the client's answer to the broker once a
    reload has put proxy mode in force (the shared settings' ``auth``):
    Sluice neither answers with its own token (the broker may be one it
    does not trust) nor fails (it did: an assertion, the connection closed
    with a traceback)."""
    core, _ = proxied_core()
    core.settings.auth = proxy_core(tmp_path)[0].settings.auth  # what the reload puts in force
    assert core.settings.auth is not None
    refresh = pb.AuthData(auth_method_name="token", auth_data=b"PulsarAuthRefresh")
    challenge = frame_bytes("AUTH_CHALLENGE", pb.CommandAuthChallenge(challenge=refresh))
    out = core.receive_broker(challenge, 1.0)
    assert [(a.to, a.data) for a in out if isinstance(a, Send)] == [(Peer.CLIENT, challenge)]
    fresh = pb.AuthData(auth_method_name="token", auth_data=b"the client's token")
    answer = frame_bytes("AUTH_RESPONSE", pb.CommandAuthResponse(response=fresh))
    out = core.receive_client(answer, 2.0)
    assert [(a.to, a.data) for a in out if isinstance(a, Send)] == [(Peer.BROKER, answer)]
    assert not any(isinstance(a, Close) for a in out)


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


# --- a client certificate's role, over real TLS ----------------------------------------


def client_certificate(
    ca: trustme.CA, names: list[tuple[Any, str]], tmp_path: Path
) -> tuple[Path, Path]:
    """A client certificate signed by ``ca`` whose subject is ``names``, one
    RDN each, in this order in the certificate (trustme writes one CN)."""
    ca_key: Any = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in names]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "client.crt", tmp_path / "client.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_file, key_file


async def test_the_role_is_the_cn_the_broker_would_take(tmp_path: Path) -> None:
    """Pulsar's AuthenticationProviderTls takes the first CN of the subject
    as RFC 2253 writes it, which lists the RDNs last first: with two CNs,
    the one last in the certificate. Sluice names the same role upstream."""
    ca = trustme.CA()
    served = ca.issue_cert("localhost", "127.0.0.1")
    served.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    served.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert_file, key_file = client_certificate(
        ca,
        [(NameOID.COMMON_NAME, "first-in-certificate"), (NameOID.ORGANIZATION_NAME, "tests"),
         (NameOID.COMMON_NAME, "last-in-certificate")],
        tmp_path,
    )  # fmt: skip
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice"))
    connects: list[pb.CommandConnect] = []

    async def broker(stream: trio.SocketStream) -> None:
        """Records the CONNECT Sluice sends and answers it."""
        frames = FrameStream(stream)
        with trio.move_on_after(10):
            frame = await frames.receive_frame()
            if frame is not None and frame.name == "CONNECT":
                connects.append(frame.body)
                answer = pb.CommandConnected(server_version="recording", protocol_version=21)
                await frames.send(encode(command(Type.Value("CONNECTED"), answer)))
            await frames.receive_frame()  # until Sluice closes

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, broker, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        config = ProxyConfig(
            broker=parse_broker_url(f"pulsar://127.0.0.1:{port}"),
            listen=None,
            listen_tls=Address("127.0.0.1", 0),
            tls=TlsServerConfig(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.pem"),
            auth_mode="proxy",
            broker_auth_token_file=tmp_path / "sluice.token",
        )
        proxy: Proxy = await nursery.start(Proxy(config).run)
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        context.load_cert_chain(str(cert_file), str(key_file))
        address = proxy.addresses["tls"]
        with trio.fail_after(20):
            tcp = await trio.open_tcp_stream(address.host, address.port)
            stream = trio.SSLStream(tcp, context, server_hostname="localhost")
            client = FrameStream(stream)
            hello = pb.CommandConnect(client_version="tests", protocol_version=21,
                                      auth_method_name="tls",
                                      proxy_to_broker_url=f"127.0.0.1:{port}")  # fmt: skip
            await client.send(encode(command(Type.Value("CONNECT"), hello)))
            answer = await client.receive_frame()
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert answer is not None and answer.name == "CONNECTED", answer
    # (Its readiness probe is a CONNECT without credentials.)
    (upstream,) = [c for c in connects if c.HasField("original_principal")]
    assert (upstream.original_principal, upstream.original_auth_method) == (
        "last-in-certificate",
        "tls",
    )
    assert upstream.auth_data == hs256_token(SECRET, "sluice").encode()


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


@pytest.mark.parametrize(
    ("option", "key", "error"),
    [
        ("secret", "missing", "No such file"),
        ("secret", "short", "the secret is 16 bytes (128 bits); at least 32 bytes (256 bits) "
                            "are needed, as Pulsar's token library requires"),
        ("secret", "public", "this is a public or private key"),
        ("public", "rsa-1024", "the RSA key is 1024 bits; at least 2048 are needed"),
    ],
)  # fmt: skip
@pytest.mark.e2e
def test_the_command_line_reports_a_key_file_that_will_not_do(
    option: str, key: str, error: str, tmp_path: Path
) -> None:
    """Checked at start: one line naming the option and file, exit 2,
    before any client comes. The installed command (tests.helpers.support.SLUICE),
    not a path into one checkout."""
    path = tmp_path / key
    if key == "short":
        path.write_bytes(SECRET[:16])
    elif key == "public":
        public_der(ec.generate_private_key(ec.SECP256R1()), path)
    elif key == "rsa-1024":
        public_der(rsa.generate_private_key(public_exponent=65537, key_size=1024), path)
    flag = f"--auth-token-{option}-key"
    result = subprocess.run(
        [*SLUICE, "proxy", "--broker", "pulsar://127.0.0.1:1", "--auth-mode", "proxy",
         flag, str(path), "--broker-auth-token-file", str(tmp_path / "nope-either"),
         "--no-check-broker"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"{flag} {path}: {error}" in line


def test_web_credentials_stand_in_for_the_clients(tmp_path: Path) -> None:
    """Proxy mode on the web port: the client's Bearer token (or certificate
    role) checked; Sluice's own token and the client's role go on instead of
    whatever credentials the client sent."""
    key, own = tmp_path / "secret.key", tmp_path / "own.token"
    key.write_bytes(b"s" * 32)
    own.write_text("token:OWN\n")
    auth = ProxyAuth.load(secret_key=key, public_key=None, role_claim="sub", own_token=own,
                          tls_roles=True, forward_auth_data=False)  # fmt: skip
    client, headers = auth.web_credentials(f"Bearer {hs256_token(b's' * 32, 'app')}", None)
    assert client.role == "app"
    assert headers == [(b"authorization", b"Bearer OWN"), (b"x-pulsar-auth-method-name", b"token"),
                       (b"x-original-principal", b"app")]  # fmt: skip
    assert auth.web_credentials(None, "cert-cn")[0].role == "cert-cn"
    with pytest.raises(AuthError, match="no credentials"):
        auth.web_credentials(None, None)
    with pytest.raises(AuthError, match="not a Bearer token"):
        auth.web_credentials("Basic YXBwOmFwcA==", None)
    with pytest.raises(AuthError):
        auth.web_credentials(f"Bearer {hs256_token(b'x' * 32, 'app')}", None)
    sent = [(b"Authorization", b"Bearer theirs"), (b"X-Original-Principal", b"admin"),
            (b"accept", b"*/*")]  # fmt: skip
    assert with_credentials(sent, headers) == [(b"accept", b"*/*"), *headers]
    assert with_credentials(sent, None) == sent
