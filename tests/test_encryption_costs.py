"""What a delivery a hostile producer shapes can cost the ``encrypt``
filter that decrypts for a role: the proxy's one Python thread spends at
most one private-key operation per key name Sluice holds on a message,
however many wrapped keys its metadata carries, and no more than that
operation's own cost on a wrapped key of any size."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sluice.filters import crypto
from sluice.filters.encryption import Encryption, EncryptionSettings
from sluice.protocols.filtering import WrappedKey
from tests.test_encryption import key_pair
from tests.test_filters import TOPIC


def test_many_wrapped_keys_under_a_held_name_cost_one_unwrap(tmp_path: Path) -> None:
    """Pulsar's clients write one entry per key name; a message with
    thousands under the name Sluice holds (each a 2048-bit RSA block, one
    private-key operation apiece if each were tried: seconds) is tried once."""
    public, private, _ = key_pair(tmp_path, "k")
    sealed = Encryption(EncryptionSettings(public_keys={"k": str(public)})).seal(TOPIC, b"m")
    opener = Encryption(EncryptionSettings(private_keys={"k": str(private)}))
    junk = [WrappedKey("k", os.urandom(256)) for _ in range(3000)]
    started = time.perf_counter()
    assert opener.open(TOPIC, junk, sealed.param, sealed.data) is None
    took = time.perf_counter() - started
    assert took < 0.3, f"{took:.2f} s for one delivery"
    # The real entry still opens, first under its name, after a name Sluice does not hold.
    keys = [WrappedKey("other", os.urandom(256)), *sealed.keys]
    assert opener.open(TOPIC, keys, sealed.param, sealed.data) == b"m"


def test_a_huge_ec_wrapped_key_is_refused_before_any_key_derivation(tmp_path: Path) -> None:
    """An EC-wrapped data key is V, then as many bytes as the data key (16,
    24 or 32), then a 20-byte MAC: anything longer is no data key, refused
    without deriving a key stream as long as it (a 4 MB one, under the broker's 5 MB frame
    limit: about half a second)."""
    key = ec.generate_private_key(ec.SECP256R1())
    v = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    junk = [v + os.urandom(4 << 20) for _ in range(4)]
    started = time.perf_counter()
    for wrapped in junk:
        assert crypto.unwrap(key, wrapped) is None
    took = time.perf_counter() - started
    assert took < 0.3, f"{took:.2f} s for four wrapped keys"
    # A data key wrapped for it still opens.
    data_key = crypto.new_data_key()
    assert crypto.unwrap(key, crypto.wrap(key.public_key(), data_key)) == data_key
