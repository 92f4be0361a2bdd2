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
  RS256/384/512, PS256/384/512 or ES256/384/512 with a private key whose
  public key Sluice holds: the key files Pulsar's token provider reads
  (``tokenSecretKey``: the raw secret bytes, at least 256 bits;
  ``tokenPublicKey``: the public key, DER as Pulsar's tools write it, or
  PEM; RSA of at least 2048 bits). PyJWT checks the token; ``exp`` and
  ``nbf`` are honoured; the role is the ``sub`` claim or the one configured.
  Or a JWT of an OpenID Connect issuer (``protocols/oidc.py``), checked against the
  keys the issuer publishes, as Pulsar's OpenID Connect provider does; a
  token naming an allowed issuer is checked that way, any other with the
  key file.
- ``tls``: the client's TLS certificate, verified against
  ``--tls-client-ca`` by the listener; the role is its subject's CN (the
  listener picks it as the broker does: the first CN of the subject as
  RFC 2253 writes it, the last in the certificate).

Nothing here ever logs or returns a credential: errors name what was wrong,
never the token.
"""

from __future__ import annotations

import base64
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sluice.errors import ConfigError
from sluice.logs import clipped
from sluice.protocols.oidc import MAX_TOKEN, MIN_RSA_BITS, OidcVerifier, TokenRefused
from sluice.protocols.pulsar import pulsar_api_pb2 as pb

# What a broker answers a CONNECT that fails authentication (and what the
# client gets from Sluice in proxy mode): ERROR AuthenticationError.
FAILED = "Failed to authenticate"
# The auth data of a refresh challenge, as brokers send it.
REFRESH = b"PulsarAuthRefresh"

# Pulsar's token library (jjwt) refuses shorter keys: a secret under 256
# bits (HS384 and HS512 need 384 and 512), an RSA key under 2048 bits
# (MIN_RSA_BITS, also for an issuer's key set).
_MIN_SECRET_BYTES = 32
_EC_ALGORITHM: dict[type[ec.EllipticCurve], str] = {
    ec.SECP256R1: "ES256",
    ec.SECP384R1: "ES384",
    ec.SECP521R1: "ES512",
}
# What an HTTP header value may be (RFC 9110, 5.5: visible characters,
# obs-text, and spaces or tabs between them), as h11 writes it.
_HEADER_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff]([\x20-\x7e\x80-\xff\t]*[\x21-\x7e\x80-\xff])?")
_KNOWN_ALGORITHMS = frozenset(
    f"{family}{bits}" for family in ("HS", "RS", "PS", "ES") for bits in ("256", "384", "512")
)


class AuthError(Exception):
    """Why a client's credentials were refused (never holds them). Its text
    goes to the log: values from the client in it are clipped, and the whole
    is bounded too."""

    def __init__(self, why: str) -> None:
        super().__init__(why if len(why) <= _MAX_REASON else f"{why[:_MAX_REASON]}...")


_MAX_REASON = 300


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
        self.name_client(connect)

    def name_client(
        self,
        request: pb.CommandConnect | pb.CommandLookupTopic | pb.CommandPartitionedTopicMetadata,
    ) -> None:
        """The ``original_*`` fields of a CONNECT, LOOKUP or PARTITIONED_METADATA."""
        if self.original_principal is not None:
            request.original_principal = self.original_principal
        if self.original_method is not None:
            request.original_auth_method = self.original_method
        if self.original_data is not None:
            request.original_auth_data = self.original_data

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
    """Checks JWTs against one key, as Pulsar's token provider does: PyJWT
    checks the token (its form, ``crit``, the signature, the key's length
    for the algorithm, the audience); what is Pulsar's is here (the key
    files, the algorithms a key admits, ``exp`` and ``nbf``, the role claim,
    the size cap)."""

    def __init__(
        self,
        key: bytes | rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
        *,
        role_claim: str = "sub",
        audience: str | None = None,
    ) -> None:
        self._key = key
        self.algorithms = _algorithms(key)
        self.role_claim = role_claim
        self.audience = audience  # when set, the token's aud must name it (tokenAudience)
        self._options: jwt.types.Options = {
            # exp and nbf are checked here, against the caller's clock; iat,
            # iss, sub and jti are not looked at, as by the broker.
            "verify_exp": False,
            "verify_nbf": False,
            "verify_iat": False,
            "verify_iss": False,
            "verify_sub": False,
            "verify_jti": False,
            "verify_aud": audience is not None,
            "enforce_minimum_key_length": True,  # HS384 needs 384 bits, HS512 512
        }

    @classmethod
    def secret_key(
        cls, path: Path, role_claim: str = "sub", audience: str | None = None
    ) -> TokenVerifier:
        """HS256/384/512 with the secret in ``path`` (its raw bytes, as the
        broker's ``tokenSecretKey`` file)."""
        option = "--auth-token-secret-key"
        data = _read(path, option)
        if not data:
            raise ConfigError(f"{option} {path}: the file is empty")
        hs256 = jwt.get_algorithm_by_name("HS256")
        try:
            hs256.prepare_key(data)
            if _is_key(data):  # what PyJWT does not see: DER private keys, base64
                raise jwt.InvalidKeyError
        except jwt.InvalidKeyError:
            raise ConfigError(
                f"{option} {path}: this is a public or private key (PEM, DER or SSH), not a "
                "secret; as a secret anyone holding it could sign tokens. Give a public key "
                "as --auth-token-public-key"
            ) from None
        if hs256.check_key_length(data) is not None:
            raise ConfigError(
                f"{option} {path}: the secret is {len(data)} bytes ({len(data) * 8} bits); "
                f"at least {_MIN_SECRET_BYTES} bytes ({_MIN_SECRET_BYTES * 8} bits) are needed, "
                "as Pulsar's token library requires"
            )
        return cls(data, role_claim=role_claim, audience=audience)

    @classmethod
    def public_key(
        cls, path: Path, role_claim: str = "sub", audience: str | None = None
    ) -> TokenVerifier:
        """RS*/PS* or ES* with the public key in ``path`` (DER, as Pulsar's
        tools write the broker's ``tokenPublicKey``, or PEM)."""
        option = "--auth-token-public-key"
        data = _read(path, option)
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                key = serialization.load_pem_public_key(data)
            else:
                key = serialization.load_der_public_key(data)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{option} {path}: not a public key ({exc})") from None
        if isinstance(key, rsa.RSAPublicKey):
            if jwt.get_algorithm_by_name("RS256").check_key_length(key) is not None:
                raise ConfigError(
                    f"{option} {path}: the RSA key is {key.key_size} bits; at least "
                    f"{MIN_RSA_BITS} are needed, as Pulsar's token library requires"
                )
        elif isinstance(key, ec.EllipticCurvePublicKey):
            if type(key.curve) not in _EC_ALGORITHM:
                raise ConfigError(
                    f"{option} {path}: an EC key on P-256, P-384 or P-521 is needed "
                    f"(ES256, ES384, ES512), not {key.curve.name}"
                )
        else:
            raise ConfigError(f"{option} {path}: an RSA or EC key is needed")
        return cls(key, role_claim=role_claim, audience=audience)

    def verify(self, token: str, now: float) -> tuple[str, float | None]:
        """The token's role and expiry; AuthError when it is not valid at ``now``."""
        if len(token) > MAX_TOKEN:
            raise AuthError(f"token over {MAX_TOKEN} bytes")
        token = token.strip()
        if "=" in token:  # one spelling: base64url without padding, as RFC 7515 writes it
            raise AuthError("a JWT part does not decode")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self.algorithms,
                options=self._options,
                audience=self.audience,
            )
        except jwt.InvalidAlgorithmError:
            raise AuthError(self._refused_algorithm(token)) from None
        except jwt.InvalidSignatureError:
            raise AuthError("bad signature") from None
        except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError):
            raise AuthError("the token is not for this audience") from None
        except jwt.InvalidKeyError as exc:  # the key too short for the token's algorithm
            raise AuthError(f"the key does not fit the token: {clipped(str(exc), 200)}") from None
        except jwt.DecodeError:
            raise AuthError("a JWT part does not decode") from None
        except jwt.PyJWTError as exc:
            raise AuthError(f"not a valid JWT: {clipped(str(exc))}") from None
        exp, nbf = claims.get("exp"), claims.get("nbf")
        for name, value in (("exp", exp), ("nbf", nbf)):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if value is not None and not (number and math.isfinite(value) and abs(value) < 1e15):
                raise AuthError(f"claim {name} is not a time")
        if exp is not None and now >= exp:
            raise AuthError("the token has expired")
        if nbf is not None and now < nbf:
            raise AuthError("the token is not valid yet")
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role.strip():
            raise AuthError(f"no role in claim {clipped(self.role_claim)}")
        return role, float(exp) if exp is not None else None

    def _refused_algorithm(self, token: str) -> str:
        """Why the token's algorithm is not one this key admits (the name
        clipped: it is the client's)."""
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.PyJWTError:
            alg = None
        if not isinstance(alg, str) or not alg:
            return "no signature algorithm"
        kind = "secret key" if isinstance(self._key, bytes) else "public key"
        if alg in _KNOWN_ALGORITHMS:
            accepted = ", ".join(self.algorithms)
            return f"algorithm {alg} does not match the {kind} (accepted: {accepted})"
        return f"algorithm {clipped(alg)} is not accepted"


def _is_key(data: bytes) -> bool:
    """Whether ``data`` is a public or private key, as DER or as the base64
    of DER or PEM (the broker's ``data:;base64,`` form written to a file)."""
    candidates = [data]
    text = b"".join(data.split())  # base64 as tools write it, in lines
    if text and len(text) <= 64 * 1024:
        for alphabet in (b"+/", b"-_"):
            try:
                padded = text + b"=" * (-len(text) % 4) if b"=" not in text else text
                candidates.append(base64.b64decode(padded, altchars=alphabet, validate=True))
            except ValueError:
                pass
    for candidate in candidates:
        if candidate.lstrip().startswith(b"-----BEGIN"):
            return True
        for load in (serialization.load_der_public_key, _load_der_private_key):
            try:
                load(candidate)
            except TypeError:  # an encrypted private key
                return True
            except (ValueError, UnsupportedAlgorithm):
                continue
            return True
    return False


def _load_der_private_key(data: bytes) -> object:
    return serialization.load_der_private_key(data, password=None)


def _algorithms(key: bytes | rsa.RSAPublicKey | ec.EllipticCurvePublicKey) -> list[str]:
    """The algorithms a key verifies, as Pulsar's: HS* for a secret, RS* and
    PS* for an RSA key, the ES* of an EC key's curve."""
    if isinstance(key, bytes):
        return ["HS256", "HS384", "HS512"]
    if isinstance(key, rsa.RSAPublicKey):
        return ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]
    return [_EC_ALGORITHM[type(key.curve)]]


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


class OwnCredential(Protocol):
    """Sluice's own token at the broker: from a file (``OwnToken``) or from
    an OAuth2 issuer (``oidc.ClientCredentials``)."""

    def current(self) -> bytes: ...


@dataclass(frozen=True)
class ProxyAuth:
    """``--auth-mode proxy``: how clients are authenticated, and what Sluice
    tells the broker."""

    own_method: str  # Sluice's credentials (a proxy role at the broker): token | tls
    own_token: OwnCredential | None = None
    tokens: TokenVerifier | None = None
    tls_roles: bool = False  # clients may authenticate with a TLS certificate
    forward_auth_data: bool = False
    oidc: OidcVerifier | None = None  # tokens of OpenID Connect issuers

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
        oidc: OidcVerifier | None = None,
        own_credential: OwnCredential | None = None,
    ) -> ProxyAuth:
        """From the key and token files (ConfigError: one line saying which
        file is wrong). Without ``own_token`` (a file) or ``own_credential``
        (an OAuth2 issuer's token), Sluice's credential is the TLS client
        certificate it presents to the broker."""
        tokens = None
        if secret_key is not None:
            tokens = TokenVerifier.secret_key(secret_key, role_claim, audience)
        elif public_key is not None:
            tokens = TokenVerifier.public_key(public_key, role_claim, audience)
        if own_token is not None:
            try:
                own_credential = OwnToken(own_token)
            except OSError as exc:
                raise ConfigError(
                    f"--broker-auth-token-file {own_token}: {exc.strerror or exc}"
                ) from None
        method = "token" if own_credential is not None else "tls"
        return cls(method, own_credential, tokens, tls_roles, forward_auth_data, oidc)

    @property
    def methods(self) -> list[str]:
        token = self.tokens is not None or self.oidc is not None
        return [m for m, on in (("token", token), ("tls", self.tls_roles)) if on]

    def _verify_token(self, token: str, now: float, fetched: bool) -> tuple[str, float | None]:
        """A token naming an allowed OpenID Connect issuer is that issuer's
        to check (KeysNeeded when its keys must be fetched first, unless
        ``fetched``: they just were); any other, the key file's."""
        if self.oidc is not None and (
            self.tokens is None or self.oidc.claims_issuer(token) is not None
        ):
            try:
                return self.oidc.verify(token, now, fetched)
            except TokenRefused as exc:
                raise AuthError(str(exc)) from None
        assert self.tokens is not None
        return self.tokens.verify(token, now)

    def authenticate(
        self,
        method: str,
        data: bytes,
        peer_role: str | None,
        now: float | None = None,
        fetched: bool = False,
    ) -> Identity:
        """The client's identity from its CONNECT (or AUTH_RESPONSE)
        credentials; AuthError otherwise. ``peer_role``: the CN of a
        verified client certificate, if the client sent one. KeysNeeded: an
        OpenID Connect issuer's keys must be fetched, then this asked again
        with ``fetched``."""
        now = time.time() if now is None else now
        if method == "token" and (self.tokens is not None or self.oidc is not None):
            text = data.decode(errors="replace")
            if text.startswith("token:"):  # the client's own prefix, as Pulsar allows
                text = text[len("token:") :]
            role, expires = self._verify_token(text, now, fetched)
            _check_role(role)
            # The token as verified, whatever its spelling: what is forwarded.
            return Identity(role, method, text.strip().encode(), expires)
        if method == "tls" and self.tls_roles:
            if not peer_role:
                raise AuthError("no verified client certificate with a CN")
            _check_role(peer_role)
            return Identity(peer_role, method, data)
        if not method:
            raise AuthError("no credentials")
        raise AuthError(f"auth method {clipped(method)} is not accepted (accepted: "
                        f"{', '.join(self.methods) or 'none'})")  # fmt: skip

    def web_credentials(
        self,
        authorization: str | None,
        peer_role: str | None,
        now: float | None = None,
        fetched: bool = False,
    ) -> tuple[Identity, list[tuple[bytes, bytes]]]:
        """A web request's client, from its ``Authorization: Bearer`` token
        (or, without one, a verified client certificate's CN), and the
        headers that stand for it toward the broker: Sluice's own token (none
        when Sluice's credential is its TLS certificate) and the client's role
        as ``X-Original-Principal``, which a broker reads from a proxy role
        as it reads ``original_principal`` on its binary port. AuthError
        otherwise."""
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError("the Authorization header is not a Bearer token")
            client = self.authenticate("token", token.strip().encode(), None, now, fetched)
        elif peer_role:
            client = self.authenticate("tls", b"", peer_role, now)
        else:
            raise AuthError(f"no credentials (accepted: {', '.join(self.methods) or 'none'})")
        try:
            # As the broker's web server (Jetty) reads a header: each byte one
            # character (ISO-8859-1). Written as UTF-8, "r\u00f4le" would reach it
            # as "r\u00c3\u00b4le", another role: the one a client named so holds on
            # the binary port.
            role = client.role.encode("latin-1")
        except UnicodeEncodeError:
            raise AuthError(f"the role {clipped(client.role)} cannot be sent as a header "
                            "(characters beyond ISO-8859-1, which the broker reads it "
                            "as)") from None  # fmt: skip
        if not _HEADER_VALUE.fullmatch(role):
            # A header of its own (CR LF), or one HTTP cannot write.
            raise AuthError(f"the role {clipped(client.role)} cannot be sent as a header "
                            "(control characters, or whitespace at an end)")  # fmt: skip
        own = self.own
        headers = [(b"authorization", b"Bearer " + own.data)] if own.method == "token" else []
        # The provider that checks Sluice's own credential (the broker tries
        # only the one this names, when named).
        headers.append((b"x-pulsar-auth-method-name", own.method.encode()))
        return client, [*headers, (b"x-original-principal", role)]

    def upstream(self, client: Identity) -> UpstreamAuth:
        """Sluice's credentials, naming ``client`` as the original principal."""
        forwarded = client.data.decode(errors="replace") if self.forward_auth_data else None
        own = self.own
        return UpstreamAuth(own.method, own.data, client.role, client.method, forwarded)


def _check_role(role: str) -> None:
    """AuthError for a role that is not text: a JSON string may hold a lone
    UTF-16 surrogate (``"\\ud800"``), which no UTF-8 field can carry; such a
    role, signed into a token, would otherwise be accepted and then break
    the CONNECT or lookup that names it as ``original_principal``."""
    try:
        role.encode()
    except UnicodeEncodeError:
        raise AuthError(f"the role {clipped(role)} is not text (a lone UTF-16 surrogate)") from None


def proxy_auth(config: Any) -> ProxyAuth | None:
    """``--auth-mode proxy``'s keys and credentials, loaded from a
    ``ProxyConfig`` (any object with its fields); None in passthrough mode."""
    if config.auth_mode != "proxy":
        return None
    from sluice.protocols.oidc import client_credentials, oidc_verifier

    return ProxyAuth.load(
        secret_key=config.auth_token_secret_key,
        public_key=config.auth_token_public_key,
        role_claim=config.auth_token_role_claim,
        own_token=config.broker_auth_token_file,
        audience=config.auth_token_audience,
        tls_roles=config.tls is not None and config.tls.client_ca is not None,
        forward_auth_data=config.forward_auth_data,
        oidc=oidc_verifier(config),
        own_credential=client_credentials(config),
    )


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None
