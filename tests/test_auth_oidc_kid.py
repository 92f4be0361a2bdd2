"""An issuer's key is picked by the token's ``kid``, as Apache Pulsar's
OpenID Connect provider picks it (its key-set cache looks for the JWK whose
id equals the token's key id, and refuses a token when none does): a token
naming no ``kid`` is refused even where the set holds a single key, a key
published without a ``kid`` is never used, and of two keys under one
``kid`` the first is the one that counts."""

from __future__ import annotations

import json

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.test_oidc import ISSUER, NOW, Issuer, refused, verifier

CLAIMS = {"iss": ISSUER, "aud": "pulsar", "sub": "app", "exp": NOW + 300, "iat": NOW, "nbf": NOW}


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key: rsa.RSAPrivateKey, **fields: object) -> dict[str, object]:
    entry: dict[str, object] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return entry | fields


class KeySet(Issuer):
    """An issuer publishing exactly ``entries``."""

    def __init__(self, *entries: dict[str, object]) -> None:
        super().__init__()
        self.entries = list(entries)

    def jwks(self) -> bytes:
        return json.dumps({"keys": self.entries}).encode()


def test_a_token_naming_no_kid_is_refused_even_with_one_key_in_the_set() -> None:
    """Before, with a single key in the set, a token without a kid was
    checked with it and accepted: a token the broker refuses."""
    key = rsa_key()
    v = verifier(KeySet(jwk(key, kid="k1", use="sig")))
    assert v.verify(jwt.encode(CLAIMS, key, "RS256", headers={"kid": "k1"}), NOW)[0] == "app"
    assert "names no key (kid)" in refused(v, jwt.encode(CLAIMS, key, "RS256"))


def test_a_key_published_without_a_kid_is_not_used() -> None:
    """Before, it was filed under the kid "": a token naming kid "" (or,
    alone in the set, none) was checked with it and accepted."""
    key, other = rsa_key(), rsa_key()
    v = verifier(KeySet(jwk(key), jwk(other, kid="k2")))
    assert "no key ''" in refused(v, jwt.encode(CLAIMS, key, "RS256", headers={"kid": ""}))
    assert "names no key" in refused(v, jwt.encode(CLAIMS, key, "RS256"))
    assert v.verify(jwt.encode(CLAIMS, other, "RS256", headers={"kid": "k2"}), NOW)[0] == "app"


def test_of_two_keys_under_one_kid_the_first_counts() -> None:
    """Before, the last one did: a token signed by the second key was
    accepted, where the broker checks it with the first and refuses it."""
    first, second = rsa_key(), rsa_key()
    v = verifier(KeySet(jwk(first, kid="k"), jwk(second, kid="k")))
    assert v.verify(jwt.encode(CLAIMS, first, "RS256", headers={"kid": "k"}), NOW)[0] == "app"
    assert refused(v, jwt.encode(CLAIMS, second, "RS256", headers={"kid": "k"})) == "bad signature"
