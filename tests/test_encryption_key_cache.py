"""The ``encrypt`` filter's cache of unwrapped data keys, when it decrypts
deliveries for a role: what one key name could not unwrap says nothing of
what another does, so a producer that copies a real wrapped key under
another name Sluice holds cannot make the real entries undecryptable (with
``undecryptable = "skip"``: skipped and acknowledged, lost to the role)."""

from __future__ import annotations

from pathlib import Path

from sluice.filters.encryption import Encryption, EncryptionSettings
from sluice.protocols.filtering import WrappedKey
from tests.test_encryption import key_pair
from tests.test_filters import TOPIC


def test_a_wrapped_key_that_failed_under_one_name_still_opens_under_its_own(
    tmp_path: Path,
) -> None:
    old_public, old_private, _ = key_pair(tmp_path, "old")
    _, new_private, _ = key_pair(tmp_path, "new")
    sealer = Encryption(EncryptionSettings(public_keys={"old": str(old_public)}))
    # Rotating: Sluice holds both private keys.
    opener = Encryption(
        EncryptionSettings(private_keys={"old": str(old_private), "new": str(new_private)})
    )
    sealed = sealer.seal(TOPIC, b"real")
    (real,) = sealed.keys
    # The wrapped key copied from a real entry (it is in the clear) under the other name.
    copied = [WrappedKey("new", real.value)]
    assert opener.open(TOPIC, copied, sealed.param, sealed.data) is None
    # Every later entry sealed with that data key opens as before.
    later = sealer.seal(TOPIC, b"later")
    assert later.keys == sealed.keys
    assert opener.open(TOPIC, later.keys, later.param, later.data) == b"later"
