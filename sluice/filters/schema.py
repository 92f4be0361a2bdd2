"""``schema``: refuse produced messages that do not match their topic's schema.

The broker checks a producer's schema when the producer is created, never
the payloads, and a producer without a schema may write anything into a
topic that has one (unless the namespace sets ``schemaValidationEnforced``).
This filter checks every message: against the version its producer named,
or, for a producer that named none, the topic's latest. Sluice asks the
broker for schemas (GET_SCHEMA on its own upstream connection) and keeps
them (``sluice.filters.chain``); each schema is compiled into a validator
once (``sluice.filters.schemas``). A message that does not match is refused
with a message that names the field and why, counted by reason in
``sluice_filter_rejected_total``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sluice.filters.api import Filter
from sluice.filters.schemas import (
    Mismatch,
    SchemaUnsupported,
    Validator,
    base64_key,
    key_validator,
    reads_key,
    validator,
)
from sluice.protocols.filtering import PASS, Message, Reject, Schema, Verdict

log = logging.getLogger("sluice.filters")

_CHOICES = ("pass", "reject")
# Characters of why a schema cannot be checked, at most (refusals and the log).
_SAID = 300


@dataclass(frozen=True)
class SchemaSettings:
    # A topic with no schema: its messages pass, or are refused.
    without_schema: str = "pass"
    # A message the client encrypted cannot be read: it passes, or is refused.
    encrypted: str = "reject"
    # A schema the validators cannot read (PROTOBUF, the older kind): pass
    # its messages (said once in the log), or refuse them.
    unsupported: str = "pass"
    # The error code a refused SEND is answered with, by its Pulsar name
    # (NotAllowedError, ...); empty: the one the client fails just that send on.
    error: str = ""

    def __post_init__(self) -> None:
        for name in ("without_schema", "encrypted", "unsupported"):
            if getattr(self, name) not in _CHOICES:
                raise ValueError(f"setting {name!r} must be pass or reject")


class SchemaValidation(Filter[SchemaSettings]):
    """Produced messages checked against their topic's schema."""

    Settings = SchemaSettings
    wants_schema = True

    def __init__(self, settings: SchemaSettings) -> None:
        super().__init__(settings)
        # By schema, and whether it checks a tombstone's key alone.
        self._validators: dict[
            tuple[str, bytes, tuple[tuple[str, str], ...], bool], Validator | str
        ] = {}

    def on_produce(self, message: Message) -> Verdict:
        settings = self.settings
        error = settings.error or None
        if message.encrypted:
            if settings.encrypted == "pass":
                return PASS
            return Reject("encrypted", "an encrypted message cannot be checked against the "
                          f"schema of {message.topic}", error)  # fmt: skip
        schema = message.schema
        # A tombstone has no value to check; a SEPARATED key/value's still
        # has its key, which consumers read. One flagged null that carries
        # bytes is no tombstone: the broker stores them and the C++-based
        # clients hand them to the application; they are checked.
        tombstone = message.null and not message.payload
        if tombstone and (schema is None or not reads_key(schema) or message.key is None):
            return PASS
        if schema is None:
            if settings.without_schema == "pass":
                return PASS
            return Reject("no_schema", f"{message.topic} has no schema", error)
        check = self._validator(schema, tombstone)
        if isinstance(check, str):
            if settings.unsupported == "pass":
                return PASS
            return Reject("schema_unsupported", check, error)
        key = _key(message) if reads_key(schema) else None
        mismatch = key if isinstance(key, Mismatch) else check(message.payload, key)
        if mismatch is None:
            return PASS
        version = _version(schema.version)
        return Reject(
            mismatch.reason,
            f"payload does not match the {schema.type} schema of {message.topic}"
            f"{version}: {mismatch.message}",
            error,
        )

    def _validator(self, schema: Schema, key_only: bool = False) -> Validator | str:
        key = (schema.type, schema.data, tuple(sorted(schema.properties.items())), key_only)
        known = self._validators.get(key)
        if known is None:
            try:
                known = key_validator(schema) if key_only else validator(schema)
            except SchemaUnsupported as exc:
                # The definition is a producer's: what is said of it is one short line.
                why = " ".join(str(exc).split())
                if len(why) > _SAID:
                    why = why[: _SAID - 3] + "..."
                known = f"the {schema.type} schema cannot be checked: {why}"
                log.warning("schema filter: %s", known)
            if len(self._validators) > 1_000:
                self._validators.clear()
            self._validators[key] = known
        return known


def _key(message: Message) -> bytes | Mismatch | None:
    """The message key's bytes, as a consumer reads them (None: no key)."""
    if message.key is None:
        return None
    if message.key_is_base64:
        return base64_key(message.key)
    return message.key.encode()


def _version(version: bytes | None) -> str:
    """A schema version as Pulsar's admin tools show it (a long, big-endian)."""
    if version is None:
        return ""
    if len(version) == 8:
        return f" (version {int.from_bytes(version, 'big')})"
    return f" (version {version.hex()})"
