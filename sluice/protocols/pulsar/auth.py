"""Authentication at the proxy (``--auth-mode proxy``), sans-I/O.

In *passthrough* mode (the default) Sluice hands the client's CONNECT
credentials to the broker and the broker authenticates every client. In
*proxy* mode Sluice authenticates the client itself and connects to the
broker with credentials of its own, a role the broker lists in its
``proxyRoles``, naming the client's role in ``original_principal`` (and
its auth method in ``original_auth_method``; its credentials in
``original_auth_data`` only when asked to forward them). The broker then
authorizes the client's role. That is the protocol's mode for proxies.

What a client may authenticate with here:

- ``token``: a JWT, signed HS256/384/512 with a secret key, or
  RS256/384/512 or ES256/384/512 with a private key whose public key Sluice
  holds: the key files Pulsar's token provider reads (``tokenSecretKey``:
  the raw secret bytes; ``tokenPublicKey``: the public key, DER as Pulsar's
  tools write it, or PEM). ``exp`` and ``nbf`` are honoured; the role is the
  ``sub`` claim or the one configured.
- ``tls``: the client's TLS certificate, verified against
  ``--tls-client-ca`` by the listener; the role is its subject's CN.

Nothing here ever logs or returns a credential: errors name what was wrong,
never the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from sluice.errors import ConfigError
from sluice.protocols.pulsar import pulsar_api_pb2 as pb

# What a broker answers a CONNECT that fails authentication (and what the
# client gets from Sluice in proxy mode): ERROR AuthenticationError.
FAILED = "Failed to authenticate"
# The auth data of a refresh challenge, as brokers send it.
REFRESH = b"PulsarAuthRefresh"

_HASHES: dict[str, Callable[[], Any]] = {
    "256": hashlib.sha256,
    "384": hashlib.sha384,
    "512": hashlib.sha512,
}
_DIGESTS: dict[str, hashes.HashAlgorithm] = {
    "256": hashes.SHA256(),
    "384": hashes.SHA384(),
    "512": hashes.SHA512(),
}
_CURVES = {"256": ec.SECP256R1, "384": ec.SECP384R1, "512": ec.SECP521R1}


# Longer tokens are refused unread (a JWT is a few hundred bytes).
MAX_TOKEN = 16 * 1024


class AuthError(Exception):
    """Why a client's credentials were refused (never holds them)."""


@dataclass(frozen=True)
class UpstreamAuth:
    """What goes into a CONNECT to the broker: credentials, and in proxy
    mode the client's principal. Hashable: upstream connections that carry
    lookups are kept per value."""

    method: str
    data: bytes
    original_principal: str | None = None
    original_method: str | None = None
    original_data: str | None = None

    def apply(self, connect: pb.CommandConnect) -> None:
        connect.auth_method_name = self.method
        connect.auth_data = self.data
        if self.original_principal is not None:
            connect.original_principal = self.original_principal
        if self.original_method is not None:
            connect.original_auth_method = self.original_method
        if self.original_data is not None:
            connect.original_auth_data = self.original_data

    def response(self) -> pb.CommandAuthResponse:
        """The answer to a broker's AUTH_CHALLENGE: these credentials again."""
        return pb.CommandAuthResponse(
            response=pb.AuthData(auth_method_name=self.method, auth_data=self.data),
            protocol_version=max(pb.ProtocolVersion.values()),
        )

    def __repr__(self) -> str:  # never the credentials
        return f"UpstreamAuth({self.method!r}, principal={self.original_principal!r})"


@dataclass(frozen=True)
class Identity:
    """A client Sluice authenticated: its role, how, and until when (wall
    clock seconds; None: no expiry)."""

    role: str
    method: str
    data: bytes = field(repr=False)
    expires: float | None = None


class TokenVerifier:
    """Checks JWTs against one key, as Pulsar's token provider does."""

    def __init__(
        self, key: bytes | Any, *, role_claim: str = "sub", audience: str | None = None
    ) -> None:
        self._key = key
        self._secret = isinstance(key, bytes)
        self.role_claim = role_claim
        self.audience = audience  # when set, the token's aud must name it (tokenAudience)

    @classmethod
    def secret_key(
        cls, path: Path, role_claim: str = "sub", audience: str | None = None
    ) -> TokenVerifier:
        """HS256/384/512 with the secret in ``path`` (its raw bytes)."""
        data = _read(path, "--auth-token-secret-key")
        if not data:
            raise ConfigError(f"--auth-token-secret-key {path}: the file is empty")
        return cls(data, role_claim=role_claim, audience=audience)

    @classmethod
    def public_key(
        cls, path: Path, role_claim: str = "sub", audience: str | None = None
    ) -> TokenVerifier:
        """RS*/ES* with the public key in ``path`` (DER or PEM)."""
        data = _read(path, "--auth-token-public-key")
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                key = serialization.load_pem_public_key(data)
            else:
                key = serialization.load_der_public_key(data)
        except ValueError as exc:
            raise ConfigError(f"--auth-token-public-key {path}: not a public key ({exc})") from None
        if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
            raise ConfigError(f"--auth-token-public-key {path}: an RSA or EC key is needed")
        return cls(key, role_claim=role_claim, audience=audience)

    def verify(self, token: str, now: float) -> tuple[str, float | None]:
        """The token's role and expiry; AuthError when it is not valid at ``now``."""
        if len(token) > MAX_TOKEN:
            raise AuthError(f"token over {MAX_TOKEN} bytes")
        parts = token.strip().split(".")
        if len(parts) != 3:
            raise AuthError("not a JWT")
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except (ValueError, binascii.Error, RecursionError):
            raise AuthError("a JWT part does not decode") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise AuthError("a JWT part is not a JSON object")
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise AuthError("no signature algorithm")
        self._check_signature(alg, f"{parts[0]}.{parts[1]}".encode(), signature)
        exp, nbf = claims.get("exp"), claims.get("nbf")
        for name, value in (("exp", exp), ("nbf", nbf)):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if value is not None and not (number and math.isfinite(value) and abs(value) < 1e15):
                raise AuthError(f"claim {name} is not a time")
        if exp is not None and now >= exp:
            raise AuthError("the token has expired")
        if nbf is not None and now < nbf:
            raise AuthError("the token is not valid yet")
        if self.audience is not None:
            aud = claims.get("aud")
            named = aud if isinstance(aud, list) else [aud]
            if self.audience not in named:
                raise AuthError("the token is not for this audience")
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role.strip():
            raise AuthError(f"no role in claim {self.role_claim!r}")
        return role, float(exp) if exp is not None else None

    def _check_signature(self, alg: str, signed: bytes, signature: bytes) -> None:
        family, bits = alg[:2], alg[2:]
        if bits not in _HASHES:
            raise AuthError(f"algorithm {alg!r} is not accepted")
        if self._secret:
            if family != "HS":
                raise AuthError(f"algorithm {alg} does not match the secret key")
            expected = hmac.new(self._key, signed, _HASHES[bits]).digest()
            if not hmac.compare_digest(expected, signature):
                raise AuthError("bad signature")
            return
        chosen = _DIGESTS[bits]
        try:
            if family == "RS" and isinstance(self._key, rsa.RSAPublicKey):
                self._key.verify(signature, signed, padding.PKCS1v15(), chosen)
            elif family == "ES" and isinstance(self._key, ec.EllipticCurvePublicKey):
                if not isinstance(self._key.curve, _CURVES[bits]):
                    raise AuthError(f"algorithm {alg} does not match the key's curve")
                half = len(signature) // 2
                if len(signature) % 2 or not half:
                    raise AuthError("bad signature")
                r = int.from_bytes(signature[:half], "big")
                s = int.from_bytes(signature[half:], "big")
                self._key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(chosen))
            else:
                raise AuthError(f"algorithm {alg} does not match the public key")
        except InvalidSignature:
            raise AuthError("bad signature") from None


class OwnToken:
    """Sluice's own token, from its file, read again when the file changes
    (a rotated Kubernetes Secret, a renewed token): checked at most once a
    second, and a file that cannot be read keeps the last good token."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.token = self._read()

    def _read(self) -> bytes:
        st = self.path.stat()
        token = _read(self.path, "--broker-auth-token-file").strip()
        if token.startswith(b"token:"):
            token = token[len(b"token:") :].strip()
        if not token:
            raise ConfigError(f"--broker-auth-token-file {self.path}: the file is empty")
        self._stamp = (st.st_mtime_ns, st.st_size)
        return token

    def current(self) -> bytes:
        now = time.monotonic()
        if now - self._checked >= 1.0:
            self._checked = now
            try:
                st = self.path.stat()
                if (st.st_mtime_ns, st.st_size) != self._stamp:
                    self.token = self._read()
            except (OSError, ConfigError):
                pass  # keep the last good one; the broker will say if it expired
        return self.token


@dataclass(frozen=True)
class ProxyAuth:
    """``--auth-mode proxy``: how clients are authenticated, and what Sluice
    tells the broker."""

    own_method: str  # Sluice's credentials (a proxy role at the broker): token | tls
    own_token: OwnToken | None = None
    tokens: TokenVerifier | None = None
    tls_roles: bool = False  # clients may authenticate with a TLS certificate
    forward_auth_data: bool = False

    @property
    def own(self) -> UpstreamAuth:
        """Sluice's credentials now (its token file is re-read when it changes)."""
        token = self.own_token.current() if self.own_token is not None else b""
        return UpstreamAuth(self.own_method, token)

    @classmethod
    def load(
        cls,
        *,
        secret_key: Path | None,
        public_key: Path | None,
        role_claim: str,
        own_token: Path | None,
        audience: str | None = None,
        tls_roles: bool,
        forward_auth_data: bool,
    ) -> ProxyAuth:
        """From the key and token files (ConfigError: one line saying which
        file is wrong). Without ``own_token``, Sluice's credential is the
        TLS client certificate it presents to the broker."""
        tokens = None
        if secret_key is not None:
            tokens = TokenVerifier.secret_key(secret_key, role_claim, audience)
        elif public_key is not None:
            tokens = TokenVerifier.public_key(public_key, role_claim, audience)
        if own_token is not None:
            try:
                return cls("token", OwnToken(own_token), tokens, tls_roles, forward_auth_data)
            except OSError as exc:
                raise ConfigError(
                    f"--broker-auth-token-file {own_token}: {exc.strerror or exc}"
                ) from None
        return cls("tls", None, tokens, tls_roles, forward_auth_data)

    @property
    def methods(self) -> list[str]:
        return [m for m, on in (("token", self.tokens), ("tls", self.tls_roles)) if on]

    def authenticate(
        self, method: str, data: bytes, peer_role: str | None, now: float | None = None
    ) -> Identity:
        """The client's identity from its CONNECT (or AUTH_RESPONSE)
        credentials; AuthError otherwise. ``peer_role``: the CN of a
        verified client certificate, if the client sent one."""
        now = time.time() if now is None else now
        if method == "token" and self.tokens is not None:
            text = data.decode(errors="replace")
            if text.startswith("token:"):  # the client's own prefix, as Pulsar allows
                text = text[len("token:") :]
            role, expires = self.tokens.verify(text, now)
            return Identity(role, method, data, expires)
        if method == "tls" and self.tls_roles:
            if not peer_role:
                raise AuthError("no verified client certificate with a CN")
            return Identity(peer_role, method, data)
        if not method:
            raise AuthError("no credentials")
        raise AuthError(f"auth method {method[:40]!r} is not accepted (accepted: "
                        f"{', '.join(self.methods) or 'none'})")  # fmt: skip

    def upstream(self, client: Identity) -> UpstreamAuth:
        """Sluice's credentials, naming ``client`` as the original principal."""
        forwarded = client.data.decode(errors="replace") if self.forward_auth_data else None
        own = self.own
        return UpstreamAuth(own.method, own.data, client.role, client.method, forwarded)


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None


def _unb64(part: str) -> bytes:
    """base64url without padding, strictly: nothing but its alphabet."""
    if not _B64URL.fullmatch(part):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


_B64URL = re.compile(r"[A-Za-z0-9_-]*")
