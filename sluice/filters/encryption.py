"""``encrypt``: Pulsar's end-to-end encryption, done by Sluice.

For the topics (and roles) it is configured for, Sluice encrypts what
producers send exactly as a Pulsar client with encryption keys would
(``sluice.filters.crypto`` says how), so that the broker and its storage
only ever hold ciphertext and consumers with the private key, using
Pulsar's own clients, decrypt it. Optionally, for the roles it is
configured for, Sluice decrypts deliveries itself with a private key it
holds, so that consumers that cannot decrypt read plaintext.

Its work is on whole entries, not single messages: it offers a ``Sealer``
(``Filter.sealer``) and no message hooks. The protocol core encrypts an
entry after every message filter has seen it (a batch as the client
compressed it), and decrypts a delivery before message filters see it.

Key files are PEM, re-read when they change (looked at every
``CHECK_EVERY`` seconds, from the traffic's own calls): a changed public
key gets a new data key at once. Data keys are made anew every
``rotate_every`` seconds (default 4 hours, as Pulsar's clients do).
Nothing here logs, records or counts a key.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sluice.filters import crypto
from sluice.filters.api import Filter
from sluice.protocols.filtering import DELIVER, PRODUCE, Direction, Sealed, Sealer, WrappedKey

log = logging.getLogger("sluice.filters")

CHECK_EVERY = 5.0  # seconds between two looks at the key files
DATA_KEYS_KEPT = 1_000  # unwrapped data keys kept for decrypting (then started over)
_UNDECRYPTABLE = ("pass", "skip")


@dataclass(frozen=True)
class EncryptionSettings:
    # Key name -> PEM file of an RSA or EC public key. Every entry's data key is
    # wrapped with each of them; a consumer needs the private half of one.
    public_keys: dict[str, str] = field(default_factory=dict)
    # Key name -> PEM file of an RSA or EC private key Sluice decrypts deliveries
    # with (the key names an entry's wrapped keys carry).
    private_keys: dict[str, str] = field(default_factory=dict)
    # Metadata given with every wrapped key (Pulsar's EncryptionKeys.metadata).
    key_metadata: dict[str, str] = field(default_factory=dict)
    # Seconds a data key encrypts for before a new one is made.
    rotate_every: float = 4 * 3600.0
    # A delivery Sluice cannot decrypt (no key of its own opens it): "pass"
    # it on as it came, or "skip" it (acknowledged, as a refused delivery).
    undecryptable: str = "pass"

    def __post_init__(self) -> None:
        if not self.public_keys and not self.private_keys:
            raise ValueError(
                "give public_keys (to encrypt what producers send), private_keys "
                "(to decrypt deliveries), or both"
            )
        if not 1 <= self.rotate_every < math.inf:  # (nan compares false)
            raise ValueError("setting 'rotate_every' must be a number of seconds, at least 1")
        if self.undecryptable not in _UNDECRYPTABLE:
            raise ValueError("setting 'undecryptable' must be pass or skip")


K = TypeVar("K")


class KeyFile(Generic[K]):
    """A PEM key file, read again when its size, time or inode change."""

    def __init__(self, name: str, path: str, parse: Callable[[bytes, str], K]) -> None:
        self.name = name
        self.path = path
        self._parse = parse
        self._seen = self._stat()
        self.key: K = self._read()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> K:
        where = f"key {self.name!r} ({self.path})"
        try:
            with open(self.path, "rb") as f:
                pem = f.read()
        except OSError as exc:
            raise crypto.BadKey(f"{where}: cannot read it: {exc.strerror or exc}") from None
        return self._parse(pem, where)

    def changed(self) -> bool:
        """Whether the file changed and was read again (a file that cannot
        be read or parsed now keeps the key it had, said in the log)."""
        seen = self._stat()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            self.key = self._read()
        except crypto.BadKey as exc:
            log.warning("encrypt: %s; the key read before stays in use", exc)
            return False
        log.info("encrypt: key %r read again from %s", self.name, self.path)
        return True


class Encryption(Filter[EncryptionSettings]):
    """Entries encrypted on the way to the broker (with ``public_keys``),
    decrypted on the way to consumers (with ``private_keys``)."""

    Settings = EncryptionSettings
    overhead = crypto.TAG_BYTES

    def __init__(self, settings: EncryptionSettings, clock: Callable[[], float] = time.monotonic):
        super().__init__(settings)
        self._clock = clock
        self.undecryptable = settings.undecryptable
        self._public = [KeyFile(n, p, crypto.public_key) for n, p in settings.public_keys.items()]
        self._private = {
            n: KeyFile(n, p, crypto.private_key) for n, p in settings.private_keys.items()
        }
        now = clock()
        self._checked = now
        self._raw_key = crypto.new_data_key()
        self._data_key = crypto.DataKey(self._raw_key)
        self._keys: tuple[WrappedKey, ...] = ()
        self._made = now
        if self._public:
            self._rotate(now)
        # Unwrapped data keys, by key name and the SHA-256 of their wrapped
        # form (not the form itself: a delivery may carry megabytes under a
        # key's name). By name too: a wrapped key that one private key does
        # not open (a real one copied under another name) may open with its own.
        self._opened: dict[tuple[str, bytes], crypto.DataKey | None] = {}

    def sealer(self, direction: Direction) -> Sealer | None:
        if direction == PRODUCE and self._public:
            return self
        if direction == DELIVER and self._private:
            return self
        return None

    # --- keys ----------------------------------------------------------------------

    def _rotate(self, now: float) -> None:
        """A new data key, wrapped with every public key. Taken into use
        only once all is made: a wrap that fails leaves the current data key
        and its wrapped keys together (an entry is never sealed with a data
        key its metadata does not carry)."""
        data_key = crypto.new_data_key()
        metadata = dict(self.settings.key_metadata)
        keys = tuple(
            WrappedKey(f.name, crypto.wrap(f.key, data_key), metadata) for f in self._public
        )
        self._raw_key, self._data_key, self._keys = data_key, crypto.DataKey(data_key), keys
        self._made = now

    def _current(self) -> tuple[crypto.DataKey, tuple[WrappedKey, ...]]:
        now = self._clock()
        if now - self._checked >= CHECK_EVERY:
            self._checked = now
            changed = [f.changed() for f in self._public]  # every file looked at
            for f in self._private.values():
                if f.changed():
                    self._opened.clear()
            if any(changed):
                self._rotate(now)
        if now - self._made >= self.settings.rotate_every:
            self._rotate(now)
        return self._data_key, self._keys

    # --- Sealer --------------------------------------------------------------------

    def seal(self, topic: str, data: bytes) -> Sealed:
        data_key, keys = self._current()
        iv = crypto.new_iv()
        return Sealed(data_key.encrypt(iv, data), keys, iv)

    def lease(self) -> tuple[bytes, tuple[WrappedKey, ...], float]:
        _, keys = self._current()
        now = self._clock()
        left = min(self._checked + CHECK_EVERY, self._made + self.settings.rotate_every) - now
        return self._raw_key, keys, max(0.0, left)

    def open(
        self, topic: str, keys: Sequence[WrappedKey], param: bytes, data: bytes
    ) -> bytes | None:
        self._current()  # private key files looked at as public ones are
        # Pulsar's clients write one entry per key name: the first under
        # each name held here is tried, no other (a message with thousands
        # under that name would cost a private-key operation each).
        tried: set[str] = set()
        for wrapped in keys:
            if wrapped.name in tried or wrapped.name not in self._private:
                continue
            tried.add(wrapped.name)
            data_key = self._data_key_of(wrapped)
            if data_key is not None:
                return data_key.decrypt(param, data)
            if len(tried) == len(self._private):
                break
        return None

    def _data_key_of(self, wrapped: WrappedKey) -> crypto.DataKey | None:
        """The data key ``wrapped`` holds, unwrapped once: what did not
        unwrap is remembered too, so that a message with a bogus key costs
        one private-key operation, not one per delivery."""
        private = self._private.get(wrapped.name)
        if private is None:
            return None
        seen = (wrapped.name, hashlib.sha256(wrapped.value).digest())
        if seen in self._opened:
            return self._opened[seen]
        unwrapped = crypto.unwrap(private.key, wrapped.value)
        if len(self._opened) >= DATA_KEYS_KEPT:
            self._opened.clear()
        data_key = self._opened[seen] = None if unwrapped is None else crypto.DataKey(unwrapped)
        return data_key
