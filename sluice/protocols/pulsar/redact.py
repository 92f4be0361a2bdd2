"""Keeping credentials out of recordings and logs.

Replaced wherever they occur, in every recording mode, by ``MARKER``:
CONNECT ``auth_data`` and ``original_auth_data``; ``original_auth_data`` on
lookups and partition-metadata requests; the data inside AUTH_CHALLENGE and
AUTH_RESPONSE; and the value of any property (command metadata, message
properties) whose key looks like a credential (token, password, secret,
auth, key, credential, cookie, session; a subscription's own properties
too); and, in CONNECT and AUTH_* commands, fields this
Sluice does not know, which are left out. A frame that needed redacting is
re-encoded, so its recorded bytes differ from the wire; the record says so.

Credentials are found by parsing, so bytes that did not parse cannot be
vouched for: ``withheld`` says which frames must be recorded without any of
their bytes (a command that does not parse, whatever type its first bytes
claim; metadata or trailing bytes that do not parse; a partial command
holding credentials, which cannot be re-encoded without them).
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.message import Message

from sluice.protocols.credentials import names_a_credential
from sluice.protocols.pulsar import Frame, Type, encode, encode_payload, pb
from sluice.protocols.pulsar.errors import Problem
from sluice.protocols.pulsar.frame import BODY_FIELD, PAYLOAD_TYPES

MARKER = "<redacted>"
MARKER_BYTES = MARKER.encode()
# Redacting never makes a frame much larger, and a frame may be larger than
# the default limit when the broker allows it: no limit on re-encoding.
_NO_LIMIT = 2**31 - 1
_SENSITIVE_KEY = re.compile(r"token|passw|secret|auth|credential|key|cookie|session", re.I)


def sensitive_key(key: str) -> bool:
    """Whether a property (command metadata, a message's) called ``key``
    holds a credential, as the recorder reads it: broader than
    ``names_a_credential`` (any ``key`` or ``auth``), never narrower."""
    return _SENSITIVE_KEY.search(key) is not None or names_a_credential(key)


_CONNECT = Type.Value("CONNECT")
_AUTH_TYPES = frozenset({Type.Value("AUTH_CHALLENGE"), Type.Value("AUTH_RESPONSE")})
_ORIGINAL_AUTH = frozenset({Type.Value("LOOKUP"), Type.Value("PARTITIONED_METADATA"), _CONNECT})
# The handshake's commands, which carry the credentials: fields this Sluice
# does not know (a newer client's, or bytes of the wrong wire type where a
# token belongs) are left out of what is recorded or logged.
_HANDSHAKE = frozenset({_CONNECT, *_AUTH_TYPES})
# Commands carrying KeyValue lists that clients fill with arbitrary
# properties (a subscription's own properties as well as its consumer's).
_PROPERTY_FIELDS: dict[int, tuple[str, ...]] = {
    Type.Value("PRODUCER"): ("metadata",),
    Type.Value("SUBSCRIBE"): ("metadata", "subscription_properties"),
    Type.Value("LOOKUP"): ("properties",),
    Type.Value("GET_TOPICS_OF_NAMESPACE"): ("properties",),
    Type.Value("WATCH_SCALABLE_TOPICS"): ("property_filters",),
}


# Commands whose body can hold credentials; any other frame only in its
# message properties (checked without a generator when there are none: SEND
# and MESSAGE pass through here once per message).
_BODY_CHECKED = frozenset({_CONNECT, *_ORIGINAL_AUTH, *_AUTH_TYPES, *_PROPERTY_FIELDS})


def sensitive(frame: Frame) -> bool:
    """Whether ``frame`` holds anything ``redacted`` would replace."""
    t = frame.type
    if t in _BODY_CHECKED:
        body: Any = frame.body
        if body is None:
            return False
        if t == _CONNECT and (body.HasField("auth_data") or body.HasField("original_auth_data")):
            return True
        if t in _HANDSHAKE and frame.command is not None and _has_unknown(frame.command):
            return True
        if t in _ORIGINAL_AUTH and body.HasField("original_auth_data"):
            return True
        if t in _AUTH_TYPES:
            data = body.response if t == Type.Value("AUTH_RESPONSE") else body.challenge
            return bool(data.HasField("auth_data"))
        fields = _PROPERTY_FIELDS.get(t, ())
        if any(_has_sensitive(getattr(body, field)) for field in fields):
            return True
    if frame.properties == 0:  # counted by the compiled scanner: nothing to parse
        return False
    meta = frame.metadata
    if meta is None:
        return False
    properties = meta.properties
    # len(), not truth: upb's repeated field takes twice as long for bool().
    return len(properties) > 0 and _has_sensitive(properties)


def _has_sensitive(properties: Any) -> bool:
    return any(sensitive_key(kv.key) for kv in properties)


def _has_unknown(cmd: pb.BaseCommand) -> bool:
    """Whether ``cmd`` holds fields its schema does not know (at any depth)."""
    known = pb.BaseCommand()
    known.CopyFrom(cmd)
    known.DiscardUnknownFields()
    # Partial: ByteSize() refuses a message that lacks a required field, and
    # an invalid CONNECT is exactly what must still be recorded.
    return len(known.SerializePartialToString()) != len(cmd.SerializePartialToString())


def scrub(properties: Any) -> None:
    """Each value of a KeyValue list whose key names a credential, replaced."""
    for kv in properties:
        if sensitive_key(kv.key):
            kv.value = MARKER


def redacted_command(frame: Frame) -> pb.BaseCommand:
    """A copy of the frame's command with credentials replaced."""
    assert frame.command is not None
    cmd = pb.BaseCommand()
    cmd.CopyFrom(frame.command)
    t = frame.type
    if t in _HANDSHAKE:
        cmd.DiscardUnknownFields()
    body: Any = getattr(cmd, BODY_FIELD[t])
    if t == _CONNECT and body.HasField("auth_data"):
        body.auth_data = MARKER_BYTES
    if t in _ORIGINAL_AUTH and body.HasField("original_auth_data"):
        body.original_auth_data = MARKER
    if t in _AUTH_TYPES:
        data = body.response if t == Type.Value("AUTH_RESPONSE") else body.challenge
        if data.HasField("auth_data"):
            data.auth_data = MARKER_BYTES
    for field in _PROPERTY_FIELDS.get(t, ()):
        scrub(getattr(body, field))
    return cmd


def redacted(frame: Frame) -> bytes:
    """The frame's bytes with credentials replaced (its own bytes if none)."""
    if frame.command is None or not sensitive(frame):
        return frame.raw
    cmd = redacted_command(frame)
    meta = frame.metadata
    if meta is None:
        return encode(cmd, max_message_size=_NO_LIMIT)
    clean = pb.MessageMetadata()
    clean.CopyFrom(meta)
    scrub(clean.properties)
    return encode_payload(
        cmd,
        clean,
        bytes(frame.payload),
        checksum=frame.checksum is not None,
        broker_entry_metadata=frame.broker_entry_metadata,
        max_message_size=_NO_LIMIT,
    )


def withheld(frame: Frame) -> str | None:
    """Why none of ``frame``'s bytes may be recorded (None: they may be,
    through ``redacted``). Only an invalid frame is ever withheld."""
    error = frame.error
    if error is None:
        return None
    command = frame.command
    if command is None:
        # The type the first bytes name is a guess: a CONNECT cut short, or
        # bytes claiming to be something else, may hold a token anywhere.
        return "its command did not parse, so credentials in it could not be found"
    if error.problem is Problem.TRAILING:
        return "bytes after its command did not parse"
    raw = frame.raw
    meta = frame.metadata
    if (
        meta is None
        and frame.type in PAYLOAD_TYPES
        and len(raw) > 8 + int.from_bytes(raw[4:8], "big")
    ):
        return "its message metadata did not parse, so credentials in it could not be found"
    if sensitive(frame) and not (
        command.IsInitialized() and (meta is None or meta.IsInitialized())
    ):
        return "it lacks required fields, so it cannot be re-encoded without its credentials"
    return None


def loggable(frame: Frame) -> Message | None:
    """The frame's body, credentials replaced, for log lines."""
    if frame.command is None:
        return None
    if not sensitive(frame):
        body: Message | None = frame.body
        return body
    cmd = redacted_command(frame)
    return getattr(cmd, BODY_FIELD[frame.type])  # type: ignore[no-any-return]
