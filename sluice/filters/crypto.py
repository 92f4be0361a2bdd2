"""Pulsar's end-to-end encryption format (PIP-4), the parts Sluice needs.

What a Pulsar client does when it encrypts, and so what Sluice does in its
place (facts of the format, as the Java and C++ clients write and read it):

- A **data key** of 32 random bytes (AES-256) encrypts payloads. Clients
  make a new one when a producer starts and every 4 hours.
- Each **payload** (the whole entry as the client compressed it: one
  message, or a batch) is encrypted with AES in GCM mode under the data
  key, with a fresh random 12-byte IV and no associated data; the 16-byte
  tag follows the ciphertext. The IV travels in the metadata's
  ``encryption_param``; ``encryption_algo`` stays unset.
- The data key travels **wrapped** with each of the producer's public keys,
  one ``EncryptionKeys`` entry per key: its name (``key``), the wrapped
  bytes (``value``) and the key's metadata. An RSA key wraps with OAEP
  (SHA-1, MGF1 with SHA-1, no label). A consumer unwraps the entry of a key
  it holds the private half of.
- A **chunked** message is cut first, then each chunk is encrypted as an
  entry of its own (its own IV and tag); ``total_chunk_msg_size`` counts
  the plaintext, as consumers decrypt each chunk before joining them.

EC keys: the Java client wraps with Bouncy Castle's ECIES, the C++ client
(and the Python, Node.js and Go-on-C++ clients) reads RSA keys only; Sluice
takes RSA keys (see docs/filters.md).

Keys and data keys are never logged, recorded or counted: nothing here
formats them.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

DATA_KEY_BYTES = 32
IV_BYTES = 12
TAG_BYTES = 16

_OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)


class BadKey(ValueError):
    """A key file that cannot be used, in one line."""


def new_data_key() -> bytes:
    return os.urandom(DATA_KEY_BYTES)


def new_iv() -> bytes:
    return os.urandom(IV_BYTES)


def public_key(pem: bytes, where: str) -> rsa.RSAPublicKey:
    """An RSA public key from PEM (``BEGIN PUBLIC KEY``, as ``openssl rsa
    -pubout`` writes it, or ``BEGIN RSA PUBLIC KEY``)."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except (ValueError, TypeError):
            raise BadKey(f"{where} holds no PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise BadKey(f"{where} holds {_kind(key)} key; {RSA_ONLY}")
    return key


def private_key(pem: bytes, where: str) -> rsa.RSAPrivateKey:
    """An RSA private key from PEM (PKCS#1 or PKCS#8, unencrypted)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise BadKey(f"{where} holds a password-protected key; give it unencrypted") from None
    except ValueError:
        raise BadKey(f"{where} holds no PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise BadKey(f"{where} holds {_kind(key)} key; {RSA_ONLY}")
    return key


RSA_ONLY = "Pulsar's C++-based clients read RSA keys only"


def _kind(key: object) -> str:
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        return "an EC"
    return f"a {type(key).__name__.removeprefix('_')}"


def wrap(key: rsa.RSAPublicKey, data_key: bytes) -> bytes:
    """``data_key`` wrapped for the holder of ``key``'s private half."""
    return key.encrypt(data_key, _OAEP)


def unwrap(key: rsa.RSAPrivateKey, wrapped: bytes) -> bytes | None:
    """The data key ``wrapped`` holds, or None when ``key`` did not wrap it."""
    try:
        data_key = key.decrypt(wrapped, _OAEP)
    except ValueError:
        return None
    return data_key if len(data_key) in (16, 24, 32) else None


class DataKey:
    """A data key and its cipher, made once per key (not per payload)."""

    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def encrypt(self, iv: bytes, plaintext: bytes) -> bytes:
        """The payload as a Pulsar client encrypts it: ciphertext, then the tag."""
        return self._aead.encrypt(iv, plaintext, None)

    def decrypt(self, iv: bytes, ciphertext: bytes) -> bytes | None:
        """The plaintext, or None when the tag does not match (not this
        key, or altered)."""
        try:
            return self._aead.decrypt(iv, ciphertext, None)
        except (InvalidTag, ValueError):
            return None
