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

- An **EC** key wraps with ECIES as the Java client's Bouncy Castle
  ``ECIES`` cipher does it: an ephemeral key pair on the key's curve, its
  public point V (uncompressed), the ECDH secret Z (the shared point's x,
  fixed length), K = KDF2-SHA-1(V || Z) (ANSI X9.63, counter from 1), of
  which the first 16 bytes key the MAC and the rest XOR the data key into
  C; T = HMAC-SHA-1(K_mac, C || 8 zero bytes, the empty encoding vector's
  length as Bouncy Castle 1.78 writes it; later versions write 4, which
  Sluice reads too); the wrapped key is V || C || T. The C++ client (and the Python,
  Node.js and Go-on-C++ clients) reads RSA keys only: EC-wrapped keys are
  for Java consumers.

Keys and data keys are never logged, recorded or counted: nothing here
formats them.
"""

from __future__ import annotations

import hmac
import os

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives import hmac as crypto_hmac
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.x963kdf import X963KDF

DATA_KEY_BYTES = 32
IV_BYTES = 12
TAG_BYTES = 16
_DATA_KEY_SIZES = (16, 24, 32)  # AES-128, -192, -256: what a wrapped data key may hold

_OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
# The smallest RSA modulus OAEP (SHA-1) wraps a data key with: the key, two
# digests and two bytes.
_RSA_MIN_BITS = 8 * (DATA_KEY_BYTES + 2 * hashes.SHA1.digest_size + 2)


class BadKey(ValueError):
    """A key file that cannot be used, in one line."""


def new_data_key() -> bytes:
    return os.urandom(DATA_KEY_BYTES)


def new_iv() -> bytes:
    return os.urandom(IV_BYTES)


PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
_EC_MAC_KEY_BYTES = 16  # Bouncy Castle's IESParameterSpec default: a 128-bit MAC key
# After C, the MAC covers the encoding vector's length in bits (none: zeros):
# 8 bytes in the Bouncy Castle Apache Pulsar 4.0 ships (1.78), 4 in later ones.
_EC_MAC_PADDING = bytes(8)
_EC_MAC_PADDINGS = (bytes(8), bytes(4))


def public_key(pem: bytes, where: str) -> PublicKey:
    """An RSA or EC public key from PEM (``BEGIN PUBLIC KEY``, as ``openssl
    rsa -pubout`` or ``openssl ec -pubout`` write it; or a private key's
    public half)."""
    try:
        key = serialization.load_pem_public_key(pem)
    except UnsupportedAlgorithm as exc:
        raise BadKey(f"{where} holds a key that cannot be used: {exc}") from None
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except UnsupportedAlgorithm as exc:
            raise BadKey(f"{where} holds a key that cannot be used: {exc}") from None
        except (ValueError, TypeError):
            raise BadKey(f"{where} holds no PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise BadKey(f"{where} holds {_kind(key)} key; Pulsar's clients read RSA and EC keys")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < _RSA_MIN_BITS:
        raise BadKey(
            f"{where} holds a {key.key_size}-bit RSA key, too small to wrap a data key "
            f"(Pulsar's clients wrap with OAEP: at least {_RSA_MIN_BITS} bits)"
        )
    return key


def private_key(pem: bytes, where: str) -> PrivateKey:
    """An RSA or EC private key from PEM (PKCS#1, SEC1 or PKCS#8, unencrypted)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise BadKey(f"{where} holds a password-protected key; give it unencrypted") from None
    except UnsupportedAlgorithm as exc:
        raise BadKey(f"{where} holds a key that cannot be used: {exc}") from None
    except ValueError:
        raise BadKey(f"{where} holds no PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise BadKey(f"{where} holds {_kind(key)} key; Pulsar's clients read RSA and EC keys")
    return key


def _kind(key: object) -> str:
    name = type(key).__name__.removeprefix("_").removesuffix("PublicKey")
    return f"a {name.removesuffix('PrivateKey')}"


def wrap(key: PublicKey, data_key: bytes) -> bytes:
    """``data_key`` wrapped for the holder of ``key``'s private half."""
    if isinstance(key, rsa.RSAPublicKey):
        return key.encrypt(data_key, _OAEP)
    ephemeral = ec.generate_private_key(key.curve)
    v = ephemeral.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    mac_key, stream = _ecies_keys(v, ephemeral.exchange(ec.ECDH(), key), len(data_key))
    c = bytes(a ^ b for a, b in zip(data_key, stream, strict=True))
    return v + c + _ecies_mac(mac_key, c)


def unwrap(key: PrivateKey, wrapped: bytes) -> bytes | None:
    """The data key ``wrapped`` holds, or None when ``key`` did not wrap it."""
    data_key: bytes | None
    if isinstance(key, rsa.RSAPrivateKey):
        try:
            data_key = key.decrypt(wrapped, _OAEP)
        except ValueError:
            return None
    else:
        data_key = _ecies_open(key, wrapped)
    return data_key if data_key is not None and len(data_key) in _DATA_KEY_SIZES else None


def _ecies_open(key: ec.EllipticCurvePrivateKey, wrapped: bytes) -> bytes | None:
    size = (key.curve.key_size + 7) // 8
    point = 1 + 2 * size  # V uncompressed
    mac_size = hashes.SHA1.digest_size
    # C is as long as the data key: anything else is refused before the key
    # stream is derived (as long as C: megabytes of junk would cost as much).
    if len(wrapped) - point - mac_size not in _DATA_KEY_SIZES or wrapped[0] != 4:
        return None
    v, c, t = wrapped[:point], wrapped[point:-mac_size], wrapped[-mac_size:]
    try:
        peer = ec.EllipticCurvePublicKey.from_encoded_point(key.curve, v)
        shared = key.exchange(ec.ECDH(), peer)
    except ValueError:
        return None
    mac_key, stream = _ecies_keys(v, shared, len(c))
    if not any(hmac.compare_digest(_ecies_mac(mac_key, c, pad), t) for pad in _EC_MAC_PADDINGS):
        return None
    return bytes(a ^ b for a, b in zip(c, stream, strict=True))


def _ecies_keys(v: bytes, shared: bytes, length: int) -> tuple[bytes, bytes]:
    """The MAC key and the XOR stream for ``length`` bytes, from V || Z."""
    kdf = X963KDF(algorithm=hashes.SHA1(), length=_EC_MAC_KEY_BYTES + length, sharedinfo=None)
    k = kdf.derive(v + shared)
    return k[:_EC_MAC_KEY_BYTES], k[_EC_MAC_KEY_BYTES:]


def _ecies_mac(mac_key: bytes, c: bytes, padding: bytes = _EC_MAC_PADDING) -> bytes:
    h = crypto_hmac.HMAC(mac_key, hashes.SHA1())
    h.update(c + padding)
    return h.finalize()


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
