"""Key files of ``--auth-mode proxy`` that must not be taken as an HMAC
secret (``--auth-token-secret-key``): docs/proxy.md says a public or private
key, PEM, DER or SSH, is refused at start. (PEM, SSH and public DER are
checked in tests/test_proxy_auth.py.)"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sluice.errors import ConfigError
from sluice.protocols.pulsar.auth import TokenVerifier

RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC = ec.generate_private_key(ec.SECP256R1())
DER, PKCS8 = serialization.Encoding.DER, serialization.PrivateFormat.PKCS8
SPKI = serialization.PublicFormat.SubjectPublicKeyInfo


def forms() -> dict[str, bytes]:
    plain = serialization.NoEncryption()
    public = RSA.public_key().public_bytes(DER, SPKI)
    return {
        # What `pulsar tokens create-key-pair` writes as the private key.
        "rsa-private-pkcs8.der": RSA.private_bytes(DER, PKCS8, plain),
        "rsa-private-pkcs1.der": RSA.private_bytes(
            DER, serialization.PrivateFormat.TraditionalOpenSSL, plain
        ),
        "ec-private.der": EC.private_bytes(DER, PKCS8, plain),
        "rsa-private-encrypted.der": RSA.private_bytes(
            DER, PKCS8, serialization.BestAvailableEncryption(b"pw")
        ),
        # The broker's `data:;base64,...` form of tokenPublicKey, written
        # to a file: anyone holding the public key could sign any role.
        "rsa-public.b64": base64.b64encode(public) + b"\n",
        "ec-public.b64": base64.b64encode(EC.public_key().public_bytes(DER, SPKI)),
        "rsa-public-lines.b64": base64.encodebytes(public),  # as `base64` writes it
        "rsa-public-urlsafe.b64": base64.urlsafe_b64encode(public).rstrip(b"="),
    }


@pytest.mark.parametrize("name", list(forms()))
def test_a_key_in_der_or_base64_given_as_the_secret_is_refused_at_start(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_bytes(forms()[name])
    with pytest.raises(ConfigError, match="not a secret") as refused:
        TokenVerifier.secret_key(path)
    assert str(path) in str(refused.value)


def test_secrets_as_pulsar_writes_them_are_still_taken(tmp_path: Path) -> None:
    """Raw random bytes (`pulsar tokens create-secret-key`), and text that
    happens to be base64 without being a key."""
    for name, data in {
        "random.key": bytes(range(256))[::-1][:64],
        "text.key": base64.b64encode(b"x" * 48),
        "zeros.key": b"\x00" * 32,
    }.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert TokenVerifier.secret_key(path).algorithms == ["HS256", "HS384", "HS512"]
