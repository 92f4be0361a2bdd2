"""OpenID Connect issuers' tokens, checked sans-I/O (protocol-neutral; Pulsar's
``--auth-mode proxy`` uses them through ``protocols/pulsar/auth.py``).

Clients of an identity provider present an access token (a JWT) the
provider signed; Sluice checks it as Apache Pulsar's OpenID Connect provider
(``AuthenticationProviderOpenID``) does:

- the token's ``iss`` must be one of the allowed issuers, exactly;
- the issuer's discovery document (``ISSUER/.well-known/openid-configuration``)
  must name that same issuer, and its ``jwks_uri`` the key set;
- the token's ``kid`` picks the key (a token naming none is refused, and a
  key without one is not used); its ``alg`` must be RS256/384/512 or
  ES256/384/512 and fit the key;
- ``exp``, ``nbf``, ``iat`` and ``sub`` are required (and the role claim),
  the times checked with the accepted leeway; the ``aud`` must name one of
  the allowed audiences;
- the role is the configured claim (``sub`` by default): a string, or the
  first of a list, its elements read as the broker reads them (``_role``).

What is I/O (fetching the documents) lives above, in ``sluice/proxy/oidc.py``:
this module holds what was fetched, says when a fetch is wanted
(``KeysNeeded``: the first token of an issuer, or a ``kid`` the set lacks,
at most once per ``miss_refresh`` as the broker's
``openIDKeyIdCacheMissRefreshSeconds``; ``due``: keys older than
``refresh_after``, fetched again in the background while the old ones
serve), and takes the documents in (``discovered``, ``keys``, ``failed``).
The caller checks a token again once after a fetch, saying so
(``fetched``): then a key still missing refuses it, never another fetch.
Nothing here logs or returns a token.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from sluice.errors import ConfigError
from sluice.logs import clipped

# What Apache Pulsar's provider verifies (its JWT library's RSA and ECDSA
# algorithms); HS* would need a shared secret, which an issuer's JWKS never holds.
ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
# The shortest RSA key taken, in a key set as in a key file (Pulsar's token
# library, jjwt, refuses shorter ones; factoring 1024 bits is within reach).
MIN_RSA_BITS = 2048
DISCOVERY_PATH = "/.well-known/openid-configuration"
# Documents larger than this are refused (a key set is a few KiB).
MAX_DOCUMENT = 1024 * 1024
# A fetch that failed is tried again after this long at the earliest.
RETRY_FAILED = 5.0


# Longer tokens are refused unread (a JWT is a few hundred bytes).
MAX_TOKEN = 16 * 1024
_MAX_REASON = 300


class TokenRefused(Exception):
    """Why a token, or an issuer's document, was refused (never holds a
    token; values from outside in it are clipped, and the whole is bounded)."""

    def __init__(self, why: str) -> None:
        super().__init__(why if len(why) <= _MAX_REASON else f"{why[:_MAX_REASON]}...")


class NoUsableKey(TokenRefused):
    """An issuer's key set, fetched and read, holds no key Sluice can use:
    the keys held before were dropped with it (the issuer withdrew them)."""


class KeysNeeded(Exception):
    """The token's issuer's keys must be fetched (again) before it can be
    checked; the caller fetches them and asks again. ``join``: a fetch is
    under way, which the caller waits for (it may bring the key), rather
    than starting another."""

    def __init__(self, issuer: str, join: bool = False) -> None:
        super().__init__(f"keys of {issuer} wanted")
        self.issuer = issuer
        self.join = join


@dataclass(frozen=True)
class OidcSettings:
    """The allowed issuers and what a token of theirs must say."""

    issuers: tuple[str, ...]
    audiences: tuple[str, ...]
    role_claim: str = "sub"
    leeway: float = 0.0  # seconds allowed on exp, nbf and iat
    require_https: bool = True
    refresh_after: float = 18 * 3600.0  # keys older than this are fetched again
    miss_refresh: float = 300.0  # an unknown kid fetches the keys at most this often

    def check(self) -> None:
        """ConfigError (one line) for settings no token could pass."""
        if not self.issuers:
            raise ConfigError("--auth-oidc-issuers: no issuer given")
        if not self.audiences:
            raise ConfigError(
                "--auth-oidc-audiences is needed with --auth-oidc-issuers: a token must "
                "name Pulsar as its audience, as the broker's openIDAllowedAudiences requires"
            )
        for issuer in self.issuers:
            parts = _split(issuer)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"--auth-oidc-issuers {issuer!r}: not an http(s) URL")
            if parts.scheme != "https" and self.require_https:
                raise ConfigError(
                    f"--auth-oidc-issuers {issuer}: issuers must use https (as the broker's "
                    "openIDRequireIssuersUseHttps); --auth-oidc-allow-http allows http"
                )
        if not self.role_claim.strip():
            raise ConfigError("--auth-oidc-role-claim: empty")
        for name, value in (("--auth-oidc-leeway", self.leeway),
                            ("--auth-oidc-refresh", self.refresh_after),
                            ("--auth-oidc-miss-refresh", self.miss_refresh)):  # fmt: skip
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name}: must be a number of seconds, at least 0")


@dataclass
class _Issuer:
    """One issuer's keys as last fetched."""

    jwks_uri: str | None = None
    # By kid: the public key and the algorithms a token may name for it
    # (the one its JWK names; else those of its type and curve: _fitting).
    keys: dict[str, tuple[Any, tuple[str, ...]]] = field(default_factory=dict)
    fetched: float | None = None  # when the keys were last taken in
    tried: float | None = None  # when a fetch last began
    failure: str | None = None  # why the last fetch failed (None: it did not)
    busy: bool = False  # a fetch is under way


class OidcVerifier:
    """Checks tokens of the allowed issuers against their published keys."""

    def __init__(self, settings: OidcSettings) -> None:
        settings.check()
        self.settings = settings
        self._issuers = {issuer: _Issuer() for issuer in settings.issuers}
        self._options: jwt.types.Options = {
            # exp, nbf and iat are checked here against the caller's clock;
            # the issuer and audience by PyJWT.
            "verify_exp": False,
            "verify_nbf": False,
            "verify_iat": False,
            "verify_iss": True,
            "verify_aud": True,
            "verify_sub": False,
            "verify_jti": False,
            "require": ["iss", "aud", "exp", "nbf", "iat", "sub"],
        }

    @property
    def issuers(self) -> tuple[str, ...]:
        return self.settings.issuers

    def claims_issuer(self, token: str) -> str | None:
        """The token's ``iss`` when it is one of ours, unverified (None:
        not a JWT of an allowed issuer)."""
        try:
            claims = jwt.decode(token.strip(), options={"verify_signature": False})
        except jwt.PyJWTError:
            return None
        issuer = claims.get("iss")
        return issuer if isinstance(issuer, str) and issuer in self._issuers else None

    # --- what the fetcher is told and asks ---------------------------------------

    def due(self, issuer: str, now: float) -> bool:
        """Whether the issuer's keys should be fetched now on schedule: never
        fetched, or older than ``refresh_after`` (a failed fetch waits
        ``RETRY_FAILED``); tokens go on being checked with the keys held."""
        state = self._issuers[issuer]
        if state.tried is not None and now - state.tried < RETRY_FAILED:
            return False
        return state.fetched is None or now - state.fetched >= self.settings.refresh_after

    def fetching(self, issuer: str, now: float) -> None:
        """A fetch of the issuer's keys begins (``done`` when it ends)."""
        state = self._issuers[issuer]
        state.tried, state.busy = now, True

    def done(self, issuer: str) -> None:
        """The fetch ``fetching`` began ended, whichever way (``keys`` and
        ``failed`` say so too; this, for one cut off)."""
        self._issuers[issuer].busy = False

    def discovered(self, issuer: str, document: bytes) -> str:
        """The ``jwks_uri`` of the issuer's discovery document; TokenRefused
        when the document does not stand for that issuer."""
        data = _json_object(document, "discovery document")
        named = data.get("issuer")
        if named != issuer:
            raise TokenRefused(
                f"the discovery document of {issuer} names issuer {clipped(str(named))}"
            )
        uri = data.get("jwks_uri")
        if not isinstance(uri, str) or _scheme(uri) not in ("http", "https"):
            raise TokenRefused(f"the discovery document of {issuer} has no jwks_uri")
        if _scheme(uri) != "https" and self.settings.require_https:
            # Keys fetched in the clear could be anybody's: tokens forged.
            raise TokenRefused(f"the discovery document of {issuer} names a jwks_uri over "
                               f"http ({clipped(uri)}); https is required")  # fmt: skip
        self._issuers[issuer].jwks_uri = uri
        return uri

    def keys(self, issuer: str, document: bytes, now: float) -> int:
        """Take in the issuer's key set (JWKS); the number of signing keys
        usable. TokenRefused when it is no key set (not JSON, not an
        object, no ``keys`` list, as an error answered with 200): the keys
        held are kept. A key set that holds no usable key
        is the issuer's word that its keys are gone (withdrawn): it replaces
        the keys held, and NoUsableKey says so (``failure`` too)."""
        data = _json_object(document, "key set")
        found: dict[str, tuple[Any, tuple[str, ...]]] = {}
        weak = 0
        entries = data.get("keys")
        if not isinstance(entries, list):  # RFC 7517 5: REQUIRED
            raise TokenRefused(f"the key set of {issuer} is no JWK Set (no keys list)")
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            kid = entry.get("kid")
            if not isinstance(kid, str) or kid in found:
                # A token names its key by kid (the broker's key set finds
                # none for a key without one); of two under one kid, the
                # first is the broker's.
                continue
            alg = entry.get("alg")
            if entry.get("kty") not in ("RSA", "EC") or (alg is not None and alg not in ALGORITHMS):
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key PyJWT cannot use, as a JWKS may hold
            if isinstance(key.key, rsa.RSAPublicKey) and key.key.key_size < MIN_RSA_BITS:
                weak += 1  # as for a key file: anyone may forge what such a key signs
                continue
            fits = (alg,) if alg is not None else _fitting(entry)
            if fits:
                found[kid] = (key.key, fits)
        why = None
        if not found:
            short = f" ({weak} RSA under {MIN_RSA_BITS} bits, not used)" if weak else ""
            why = f"the key set of {issuer} holds no RSA or EC signing key{short}"
        state = self._issuers[issuer]
        state.keys, state.fetched, state.tried, state.failure = found, now, now, why
        state.busy = False
        if why is not None:
            raise NoUsableKey(why)
        return len(found)

    def failed(self, issuer: str, why: str, now: float) -> None:
        """The fetch failed; known keys are kept."""
        state = self._issuers[issuer]
        state.failure, state.tried, state.busy = why, now, False

    def failure(self, issuer: str) -> str | None:
        """Why the issuer's last fetch failed (None: it did not)."""
        return self._issuers[issuer].failure

    # --- checking a token ------------------------------------------------------

    def verify(self, token: str, now: float, fetched: bool = False) -> tuple[str, float | None]:
        """The token's role and expiry; TokenRefused when it is not valid at
        ``now`` (wall clock), KeysNeeded when its issuer's keys must be
        fetched first (never when ``fetched``: the keys were just fetched
        for this token)."""
        if len(token) > MAX_TOKEN:
            raise TokenRefused(f"token over {MAX_TOKEN} bytes")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise TokenRefused("a JWT part does not decode") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            shown = clipped(alg) if isinstance(alg, str) else "none"
            raise TokenRefused(f"algorithm {shown} is not accepted (accepted: "
                            f"{', '.join(ALGORITHMS)})")  # fmt: skip
        issuer = unverified.get("iss")
        if not isinstance(issuer, str) or issuer not in self._issuers:
            shown = clipped(issuer) if isinstance(issuer, str) else "none"
            raise TokenRefused(f"issuer {shown} is not allowed")
        key, fits = self._key(issuer, header.get("kid"), now, fetched)
        if alg not in fits:
            raise TokenRefused(f"algorithm {alg} does not fit the issuer's key ({', '.join(fits)})")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                options=self._options,
                audience=list(self.settings.audiences),
                issuer=issuer,
            )
        except jwt.InvalidSignatureError:
            raise TokenRefused("bad signature") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("the token is not for an allowed audience") from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"the token has no {exc.claim} claim") from None
        except jwt.InvalidAlgorithmError:
            raise TokenRefused(f"algorithm {alg} does not fit the issuer's key") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"not a valid JWT: {clipped(str(exc))}") from None
        leeway = self.settings.leeway
        exp = _time(claims, "exp")
        assert exp is not None  # required above
        if now >= exp + leeway:
            raise TokenRefused("the token has expired")
        nbf, iat = _time(claims, "nbf"), _time(claims, "iat")
        if nbf is not None and now + leeway < nbf:
            raise TokenRefused("the token is not valid yet")
        if iat is not None and now + leeway < iat:
            raise TokenRefused("the token was issued in the future (iat)")
        # The connection's credentials expire at exp itself, as the broker's
        # do (its refresh check allows no leeway).
        return _role(claims, self.settings.role_claim), exp

    def _key(
        self, issuer: str, kid: object, now: float, fetched: bool
    ) -> tuple[Any, tuple[str, ...]]:
        """The key a token names and the algorithms it is used with."""
        state = self._issuers[issuer]
        if state.fetched is None:  # never had any: fetch (or join the fetch under way)
            failed_lately = state.tried is not None and now - state.tried < RETRY_FAILED
            if fetched or (state.failure is not None and failed_lately):
                why = state.failure or "not fetched yet"
                raise TokenRefused(f"the keys of issuer {issuer} could not be fetched: {why}")
            raise KeysNeeded(issuer, join=state.busy)
        if kid is None:
            # As the broker: its key set is searched by the token's kid, and
            # none matches a token without one, even where the set holds one key.
            raise TokenRefused("the token names no key (kid)")
        if not isinstance(kid, str):
            raise TokenRefused("the token's kid is not a string")
        key = state.keys.get(kid)
        if key is not None:
            return key
        # A key the set lacks: the issuer may have rotated its keys since.
        # The fetch under way (one a token of the new key asked for) may
        # bring it: waited for, not counted as tried already.
        tried = state.tried if state.tried is not None else -math.inf
        if not fetched and state.busy:
            raise KeysNeeded(issuer, join=True)
        if not fetched and now - tried >= self.settings.miss_refresh:
            raise KeysNeeded(issuer)
        empty = f": {state.failure}" if not state.keys and state.failure else ""
        raise TokenRefused(f"issuer {issuer} has no key {clipped(kid)}{empty}")


# The algorithm an EC key is used with, by its curve (RFC 7518, 3.4).
_EC_ALGORITHMS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}


def _fitting(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """The accepted algorithms a key set's key fits when the set names
    none for it (``alg`` is optional, RFC 7517, and some issuers leave it
    out): any RS* for an RSA key, the one ES* of an EC key's curve. A
    token's algorithm is held to these, as to a named one, before its
    signature is checked with the key."""
    if entry.get("kty") == "RSA":
        return tuple(a for a in ALGORITHMS if a.startswith("RS"))
    named = _EC_ALGORITHMS.get(str(entry.get("crv")))
    return (named,) if named in ALGORITHMS else ()


def _json_object(document: bytes, what: str) -> Mapping[str, Any]:
    if len(document) > MAX_DOCUMENT:
        raise TokenRefused(f"the {what} is over {MAX_DOCUMENT} bytes")
    try:
        data = json.loads(document)
    except (ValueError, UnicodeDecodeError):
        raise TokenRefused(f"the {what} is not JSON") from None
    if not isinstance(data, dict):
        raise TokenRefused(f"the {what} is not a JSON object")
    return data


def _time(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and abs(value) < 1e15):
        raise TokenRefused(f"claim {name} is not a time")
    return float(value)


def _role(claims: Mapping[str, Any], claim: str) -> str:
    """The role claim as the broker's provider reads it: a string, or a list
    whose first element is the role (``_list_role``). A blank role is
    refused: Sluice's own rule (the broker's provider takes ``""``), so that
    no client is named by an empty ``original_principal``."""
    value = claims.get(claim)
    if isinstance(value, list):
        value = _list_role(value)
    if not isinstance(value, str) or not value.strip():
        raise TokenRefused(f"no role in claim {clipped(claim)}")
    return value


def _list_role(values: list[Any]) -> str | None:
    """A list role claim, read as Apache Pulsar's provider reads it (each
    element mapped to a string, the first taken): a string is itself, a
    number or true/false its JSON text as Java writes it, null none; one
    object or list among the elements, anywhere, and the claim names no
    role (None), as an empty list does. (NaN and Infinity are not JSON:
    the broker cannot read such a token at all.)"""
    texts = []
    for value in values:
        if isinstance(value, dict | list) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            return None
        texts.append(_scalar_text(value))
    return texts[0] if texts else None


def _scalar_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _java_double(value)
    return None


def _java_double(value: float) -> str:
    """A double as Java's ``Double.toString`` writes it: plain from 10^-3 up
    to 10^7 (``1234.5``, ``100.0``), else ``1.5E-5``, ``1.0E20``; the
    shortest digits that read back as the same double (Python's ``repr``)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    _, numerals, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    significant = "".join(map(str, numerals))
    assert isinstance(exponent, int)  # finite
    power = exponent + len(significant) - 1  # value = d.ddd x 10^power
    if 1e-3 <= abs(value) < 1e7:
        whole = power + 1  # digits before the point
        if whole <= 0:
            text = "0." + "0" * -whole + significant
        elif whole >= len(significant):
            text = significant + "0" * (whole - len(significant)) + ".0"
        else:
            text = significant[:whole] + "." + significant[whole:]
        return sign + text
    return f"{sign}{significant[0]}.{significant[1:] or '0'}E{power}"


class ClientCredentials:
    """Sluice's own token at the broker from an OAuth2 issuer, by the
    client-credentials flow Pulsar's clients use (``AuthenticationOAuth2``):
    the issuer's discovery document names its ``token_endpoint``, to which
    the client id and secret of a key file (``client_id``,
    ``client_secret``: the JSON file Pulsar's clients read) are posted. The
    token is fetched again before it expires (``refresh_at``); the proxy's
    I/O does the posting (``sluice/proxy/oidc.py``), this holds the rest."""

    # A token is fetched again once this share of its life has passed.
    REFRESH_AT = 0.8

    def __init__(
        self,
        issuer: str,
        client_id: str,
        client_secret: str,
        audience: str | None = None,
        scope: str | None = None,
    ) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self._secret = client_secret
        self.audience = audience
        self.scope = scope
        self.token_endpoint: str | None = None
        self._token = b""
        self.expires: float | None = None  # wall clock; None: none yet, or no expiry said
        self._refresh_at = -math.inf

    def __repr__(self) -> str:  # never the secret or the token
        return f"ClientCredentials({self.issuer!r}, client_id={self.client_id!r})"

    @classmethod
    def load(
        cls, issuer: str, path: Path, audience: str | None = None, scope: str | None = None
    ) -> ClientCredentials:
        """From the key file ``path``; ConfigError (one line) when it is not one."""
        option = "--broker-auth-oauth2-credentials"
        try:
            data = json.loads(path.read_bytes())
        except OSError as exc:
            raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{option} {path}: not JSON") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{option} {path}: not a JSON object")
        for name in ("client_id", "client_secret"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise ConfigError(f"{option} {path}: no {name}")
        return cls(issuer, data["client_id"], data["client_secret"], audience, scope)

    def current(self) -> bytes:
        return self._token

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + DISCOVERY_PATH

    def discovered(self, document: bytes) -> str:
        """The issuer's token endpoint, from its discovery document."""
        data = _json_object(document, "discovery document")
        endpoint = data.get("token_endpoint")
        if not isinstance(endpoint, str) or _scheme(endpoint) not in ("http", "https"):
            raise TokenRefused(f"the discovery document of {self.issuer} has no token_endpoint")
        self.token_endpoint = endpoint
        return endpoint

    def request(self) -> bytes:
        """The token request's form body."""
        fields = {
            "grant_type": "client_credentials",
            "client_id": self.client_id,
            "client_secret": self._secret,
        }
        if self.audience:
            fields["audience"] = self.audience
        if self.scope:
            fields["scope"] = self.scope
        return urlencode(fields).encode()

    def took(self, document: bytes, now: float) -> float | None:
        """Take in the token endpoint's answer; the token's lifetime in
        seconds (None: not said). TokenRefused when it holds no token."""
        data = _json_object(document, "token response")
        token = data.get("access_token")
        if not isinstance(token, str) or not token:
            error = data.get("error")
            why = f": {clipped(str(error))}" if error else ""
            raise TokenRefused(f"the token endpoint of {self.issuer} gave no access token{why}")
        lifetime = data.get("expires_in")
        if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
            lifetime = None
        self._token = token.encode()
        self.expires = None if lifetime is None else now + lifetime
        self._refresh_at = math.inf if lifetime is None else now + lifetime * self.REFRESH_AT
        return lifetime

    def refresh_at(self) -> float:
        """When (wall clock) a new token should be fetched."""
        return self._refresh_at


def oidc_verifier(config: Any) -> OidcVerifier | None:
    """``--auth-oidc-issuers`` and what goes with it, from a ``ProxyConfig``
    (None: no issuers)."""
    if not config.auth_oidc_issuers:
        return None
    return OidcVerifier(
        OidcSettings(
            issuers=tuple(config.auth_oidc_issuers),
            audiences=tuple(config.auth_oidc_audiences),
            role_claim=config.auth_oidc_role_claim,
            leeway=config.auth_oidc_leeway,
            require_https=not config.auth_oidc_allow_http,
            refresh_after=config.auth_oidc_refresh,
            miss_refresh=config.auth_oidc_miss_refresh,
        )
    )


def _split(url: str) -> SplitResult:
    """``url`` split; no scheme or host when urlsplit cannot split it (an
    unbalanced ``[``): no http(s) URL, as any other the caller refuses."""
    try:
        return urlsplit(url)
    except ValueError:
        return SplitResult("", "", "", "", "")


def _scheme(url: str) -> str:
    """The scheme of ``url`` (an issuer's jwks_uri, token endpoint); "" for one
    urlsplit cannot split."""
    return _split(url).scheme


def client_credentials(config: Any) -> ClientCredentials | None:
    """``--broker-auth-oauth2-*`` from a ``ProxyConfig`` (None: not given)."""
    issuer, path = config.broker_auth_oauth2_issuer, config.broker_auth_oauth2_credentials
    if issuer is None and path is None:
        return None
    if issuer is None or path is None:
        raise ConfigError(
            "--broker-auth-oauth2-issuer and --broker-auth-oauth2-credentials go together"
        )
    parts = _split(issuer)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--broker-auth-oauth2-issuer {issuer!r}: not an http(s) URL")
    if parts.scheme != "https" and not config.auth_oidc_allow_http:
        raise ConfigError(
            f"--broker-auth-oauth2-issuer {issuer}: must use https (Sluice's client secret "
            "goes to it); --auth-oidc-allow-http allows http"
        )
    return ClientCredentials.load(
        issuer, path, config.broker_auth_oauth2_audience, config.broker_auth_oauth2_scope
    )
