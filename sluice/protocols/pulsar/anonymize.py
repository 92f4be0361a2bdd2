"""A recorded Pulsar frame with its names replaced (``sluice record anonymize``).

The command and the message metadata are decoded, every string field is
replaced as its field's name says what it holds (``FIELDS``: a topic, a
producer name, a broker URL, …; a property by ``Pseudonyms.prop``), a
string field this table does not name is scrubbed as free text, and the
frame is encoded again. The application payload is never kept: either the
frame comes back cut where its payload starts, its length prefix still
counting the payload (as the recorder writes a frame whose payload it left
out), and the payload is handed back for the caller to hash or drop; or
(``filler``) the payload keeps its shape with zeros for contents, a batch's
per-message metadata anonymized as the frame's. Bytes fields are kept
(ids, schema versions, the encrypted data keys), except a schema's
definition, scrubbed as text.

Credentials are replaced by ``<redacted>`` whatever recorded the frame (an
older Sluice wrote them as they came; today's leaves a batch's entries'
properties as they are): first as the recorder replaces them
(``redact.redacted_command``), then, at any depth of any command, every
``auth_data`` and ``original_auth_data``, and the value of every property
(command metadata, a subscription's properties, a message's and a batch
entry's properties) whose key looks like a credential to the recorder
(``redact``) or to the HTTP side (``credentials.names_a_credential``),
whatever ``--property-values`` says. A credential never enters the
pseudonym table, so no report holds it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from sluice.protocols.credentials import names_a_credential
from sluice.protocols.pseudonyms import PREFIXES, Pseudonyms
from sluice.protocols.pulsar import encode, encode_payload, pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.errors import RemoteProtocolError
from sluice.protocols.pulsar.frame import BODY_FIELD, PAYLOAD_TYPES, text
from sluice.protocols.pulsar.payload import build_batch, compress, decompress, is_batch, split_batch
from sluice.protocols.pulsar.redact import (
    MARKER,
    MARKER_BYTES,
    redacted_command,
    sensitive_key,
)

# A string field's name -> what it holds. Names not here are free text.
FIELDS: dict[str, str] = {
    **dict.fromkeys(
        ("topic", "topics", "partitions", "deleted_topics", "new_topics", "added", "removed",
         "legacy_topic_name", "resolved_topic_name", "segment_topic"),
        "topic",
    ),
    "namespace": "namespace",
    **dict.fromkeys(
        ("assignedBrokerServiceUrl", "assignedBrokerServiceUrlTls", "brokerServiceUrl",
         "brokerServiceUrlTls", "broker_service_url", "broker_service_url_tls", "broker_url",
         "broker_url_tls", "controller_broker_url", "controller_broker_url_tls",
         "proxy_to_broker_url"),
        "url",
    ),
    "address": "address",
    "topics_pattern": "pattern",
    "producer_name": "producer",
    "producerName": "producer",
    "subscription": "subscription",
    "initial_subscription_name": "subscription",
    "consumer_name": "consumer",
    "consumerName": "consumer",
    "original_principal": "role",
    "partition_key": "key",
    "replicate_to": "cluster",
    "replicated_from": "cluster",
    "advertised_listener_name": "name",
    # Kept: versions, method names, hashes, times, kinds.
    **dict.fromkeys(
        ("client_version", "server_version", "proxy_version", "auth_method_name",
         "original_auth_method", "encryption_algo", "topics_hash", "current_hash",
         "connectedSince", "type"),
        "keep",
    ),
}  # fmt: skip
# Fields that hold a credential, in whichever command (string or bytes):
# replaced by the marker wherever they are set.
CREDENTIAL_FIELDS = frozenset({"auth_data", "original_auth_data"})
_STRING = FieldDescriptor.TYPE_STRING
_BYTES = FieldDescriptor.TYPE_BYTES
_MESSAGE = FieldDescriptor.TYPE_MESSAGE
Meta = TypeVar("Meta", pb.MessageMetadata, pb.SingleMessageMetadata)
# A KEY_VALUE schema's properties that name its parts' types.
_KV_PART_TYPES = frozenset({"key.schema.type", "value.schema.type"})
# A schema's properties that Pulsar defines (a KEY_VALUE schema's parts'
# names, types and encoding; a struct schema's options): a broker reads them.
SCHEMA_PROPERTIES = frozenset({
    *_KV_PART_TYPES, "key.schema.name", "value.schema.name", "kv.encoding.type",
    "__alwaysAllowNull", "__jsr310ConversionEnabled",
})  # fmt: skip
# A KEY_VALUE schema's parts' own properties, each a JSON object.
_SCHEMA_PART_PROPERTIES = frozenset({"key.schema.properties", "value.schema.properties"})
# A pseudonym ``Pseudonyms.name`` makes (``prefix-<8 hex digits>``), in text.
_PSEUDONYM = re.compile(
    "(?:" + "|".join(sorted(map(re.escape, set(PREFIXES.values())), key=len, reverse=True))
    + r")-[0-9a-f]{8}"
)  # fmt: skip
# A number above any frame a broker allows: re-encoding is not limited.
_NO_LIMIT = 2**31 - 1


def anonymized_frame(
    raw: bytes, names: Pseudonyms, filler: bool = False
) -> tuple[bytes, bytes | None] | None:
    """``raw`` (a whole frame, or one the recorder cut where its payload
    starts) with its names replaced, and the payload it held (None: none).

    Without ``filler`` the frame comes back cut where its payload starts.
    With it, a whole frame comes back whole, its payload's contents replaced
    by zero bytes and its shape kept: a batch's entries (their metadata's
    names replaced, each payload zeros of its size) and the compression,
    so that replay and serve can send it and clients take it; the payload
    handed back is then None. None: the frame does not parse, so nothing of
    it can be kept."""
    if len(raw) < 4:
        return None  # not even a length: no frame
    total = int.from_bytes(raw[:4], "big")
    cut = total != len(raw) - 4  # the recorder left the payload out
    whole = (len(raw) - 4).to_bytes(4, "big") + raw[4:] if cut else raw
    frame = decode_frame(whole)
    if frame.command is None:
        return None
    if frame.type in BODY_FIELD:  # credentials out, as the recorder takes them out
        cmd = redacted_command(frame)
    else:
        cmd = pb.BaseCommand()
        cmd.CopyFrom(frame.command)
    cmd.DiscardUnknownFields()  # fields this schema does not know: not vouched for
    _replace(cmd, names)
    if frame.type not in PAYLOAD_TYPES:
        if frame.metadata is not None or len(whole) > 8 + int.from_bytes(whole[4:8], "big"):
            return None  # bytes after the command that nothing says the shape of
        try:
            return encode(cmd, max_message_size=_NO_LIMIT), None
        except Exception:  # a command missing required fields: nothing kept
            return None
    meta = frame.metadata
    if meta is None:
        return None
    clean = _metadata(meta, names)
    payload = bytes(frame.payload) if frame.payload_offset >= 0 else b""
    shaped = filler and not cut
    body = _filled(clean, payload, names) if shaped else b""
    try:
        out = encode_payload(cmd, clean, body, checksum=frame.checksum is not None,
                             broker_entry_metadata=frame.broker_entry_metadata,
                             max_message_size=_NO_LIMIT)  # fmt: skip
    except Exception:
        return None
    if shaped:
        return out, None
    size = len(payload) if not cut else total - (len(raw) - 4)
    # The length prefix counts the payload left out, as the recorder's does.
    length = len(out) - 4 + size
    if not 0 <= length < 2**32:  # sizes of a damaged record: nothing kept
        return None
    out = length.to_bytes(4, "big") + out[4:]
    return out, (payload if not cut else None)


def _filled(meta: pb.MessageMetadata, payload: bytes, names: Pseudonyms) -> bytes:
    """``payload``'s shape with zeros for contents (``meta``'s sizes set to
    match): a batch's entries with their names replaced, compressed as it
    was. A payload that cannot be opened (encrypted, a chunk, damaged):
    zeros of its size."""
    if meta.encryption_keys or meta.num_chunks_from_msg > 1:
        return bytes(len(payload))
    try:
        data = decompress(meta.compression, payload, meta.uncompressed_size)
        if is_batch(meta):
            entries = []
            for entry in split_batch(data, meta.num_messages_in_batch):
                assert entry.metadata is not None
                entries.append((_metadata(entry.metadata, names), bytes(len(entry.payload))))
            data = build_batch(entries)
        else:
            data = bytes(len(data))
        meta.uncompressed_size = len(data)
        return compress(meta.compression, data)
    except (RemoteProtocolError, ValueError):
        return bytes(len(payload))


def _metadata(meta: Meta, names: Pseudonyms) -> Meta:
    """A copy of a message's metadata (or a batch entry's) with its names
    replaced, its ordering key too (bytes: the pseudonym of their hex).

    A partition key flagged ``partition_key_b64_encoded`` holds bytes in
    base64, which clients decode and a Key_Shared subscription hashes: its
    pseudonym is the one the same bytes take as an ordering key, in base64
    (one that is no base64: the pseudonym of its text, in base64)."""
    clean = type(meta)()
    clean.CopyFrom(meta)
    clean.DiscardUnknownFields()
    b64_key = clean.partition_key if clean.partition_key_b64_encoded else ""
    if b64_key:
        clean.ClearField("partition_key")  # not learned as text
    _replace(clean, names)
    if b64_key:
        try:
            original = base64.b64decode(b64_key, validate=True).hex()
        except binascii.Error:
            original = b64_key
        pseudonym = names.name("key", original).encode()
        clean.partition_key = base64.b64encode(pseudonym).decode()
    if clean.HasField("ordering_key"):
        clean.ordering_key = names.name("key", clean.ordering_key.hex()).encode()
    return clean


def _replace(message: Message, names: Pseudonyms) -> None:
    """Every string field of ``message`` and the messages in it, replaced."""
    for field, value in message.ListFields():
        if field.name in CREDENTIAL_FIELDS and field.type in (_STRING, _BYTES):
            setattr(message, field.name, MARKER if field.type == _STRING else MARKER_BYTES)
            continue
        if field.type == _MESSAGE:
            kind = field.message_type.name if field.message_type is not None else ""
            if kind == "KeyValue":
                rewrite = _schema_property if isinstance(message, pb.Schema) else _property
                for kv in value if _repeated(field) else [value]:
                    kv.key, kv.value = rewrite(text(kv.key), text(kv.value), names)
                continue
            if kind == "EncryptionKeys":  # the names of the keys a message is encrypted for
                for keys in value:
                    keys.key = names.name("name", text(keys.key))
            for item in value if _repeated(field) else [value]:
                _replace(item, names)
        elif field.type == _STRING:
            if _repeated(field):
                value[:] = [_string(field.name, text(v), names) for v in value]
            else:
                setattr(message, field.name, _string(field.name, text(value), names))
        elif field.type == _BYTES and field.name == "schema_data":
            assert isinstance(message, pb.Schema)
            setattr(message, field.name, _schema_data(message, value, names))


def credential_key(key: str) -> bool:
    """Whether a property called ``key`` holds a credential: as the recorder
    reads a Pulsar property's key, or as the web side reads a field's."""
    return sensitive_key(key) or names_a_credential(key)


def _property(key: str, value: str, names: Pseudonyms) -> tuple[str, str]:
    """A property as ``Pseudonyms.prop`` replaces it, a credential's value
    by the marker (never learned: the table, and so a report, holds no
    credential)."""
    if not credential_key(key):
        return names.prop(key, value)
    new_key, _ = names.prop(key, "")  # its key replaced if asked, nothing of its value
    return new_key, MARKER if value else value


def _schema_property(key: str, value: str, names: Pseudonyms) -> tuple[str, str]:
    """A schema's property: one Pulsar defines, which says how a broker
    reads the definition (``SCHEMA_PROPERTIES``), scrubbed as free text as
    the definition is, never taken for a credential (``key.schema.type``
    holds ``key``) nor replaced by ``value-…`` (a broker reads these
    values: ``AVRO``, ``SEPARATED``, ``true``); a KEY_VALUE part's own
    properties (``key.schema.properties``, a JSON object) each so; any
    other as a property (``_property``). A part's properties that are not
    such an object: the marker, as nothing of them can be vouched for."""
    if key in SCHEMA_PROPERTIES:
        return key, names.scrub(value)
    if key in _SCHEMA_PART_PROPERTIES:
        try:
            inner = json.loads(value)
        except ValueError:
            inner = None
        if not isinstance(inner, dict) or not all(isinstance(v, str) for v in inner.values()):
            return key, MARKER if value else value
        pairs = dict(_schema_property(k, v, names) for k, v in inner.items())
        return key, json.dumps(pairs, separators=(",", ":"))
    return _property(key, value, names)


def _schema_data(schema: pb.Schema, data: bytes, names: Pseudonyms) -> bytes:
    """A schema's definition scrubbed as text; a KEY_VALUE schema's two
    definitions each, behind their 4-byte lengths made again (as one text
    the lengths would no longer fit, and one that is not UTF-8 would not be
    scrubbed at all). Data of another shape: scrubbed as one text.

    A PROTOBUF_NATIVE definition (a KEY_VALUE part whose type the schema's
    properties name so too) is kept as it is: its JSON names a message of
    the descriptor set beside it, which is kept, so a name scrubbed in one
    and not the other made a schema that no broker takes. ``schema``'s
    properties are read as they came (``_replace`` reaches them after the
    data, field 5 after field 3)."""
    if schema.type == pb.Schema.ProtobufNative:
        return data
    if schema.type == pb.Schema.KeyValue:
        native = {
            kv.key.partition(".")[0]
            for kv in schema.properties
            if kv.key in _KV_PART_TYPES and text(kv.value) == "PROTOBUF_NATIVE"
        }
        parts: list[bytes] = []
        at = 0
        while at + 4 <= len(data) and len(parts) < 2:
            size = int.from_bytes(data[at : at + 4], "big")
            if size > len(data) - at - 4:
                break
            parts.append(data[at + 4 : at + 4 + size])
            at += 4 + size
        if len(parts) == 2 and at == len(data):
            kept = [p if part in native else _scrub_schema(p, names)
                    for part, p in zip(("key", "value"), parts, strict=True)]  # fmt: skip
            return b"".join(len(p).to_bytes(4, "big") + p for p in kept)
    return _scrub_schema(data, names)


def schema_name(pseudonym: str) -> str:
    """How a pseudonym is written in a schema's definition: ``-`` as ``_``
    (``tenant_3f2a…``), so that a name or namespace that held an original
    stays an Avro name (letters, digits, ``_``), as a broker's Avro parser
    requires of an AVRO or JSON schema on replay."""
    return pseudonym.replace("-", "_")


def _scrub_schema(data: bytes, names: Pseudonyms) -> bytes:
    """One schema definition scrubbed as text, each pseudonym put in it
    written as ``schema_name`` writes it (any the table holds: one
    already in the definition too, so that one original has one form in
    every schema of the copy). Not UTF-8: kept as it is."""
    scrubbed = names.scrub_bytes(data)
    if names.learning:
        return scrubbed
    try:
        found = scrubbed.decode()
    except UnicodeDecodeError:
        return scrubbed
    known = {p for entries in names.table.values() for p in entries.values()}

    def safe(match: re.Match[str]) -> str:
        return schema_name(match[0]) if match[0] in known else match[0]

    return _PSEUDONYM.sub(safe, found).encode()


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _string(field: str, value: str, names: Pseudonyms) -> str:
    kind = FIELDS.get(field)
    if kind == "keep":
        return value
    if kind == "topic":
        return names.topic(value)
    if kind == "namespace":
        return names.namespace(value)
    if kind == "url":
        return names.url(value)
    if kind == "address":
        return names.address(value)
    if kind == "pattern":
        return _topics_pattern(value, names)
    if kind is not None:
        return names.name(kind, value)
    return names.scrub(value)


def _topics_pattern(pattern: str, names: Pseudonyms) -> str:
    """A pattern consumer's ``domain://tenant/namespace/REGEX``: its
    namespace as a namespace (the pseudonyms of the command's own
    ``namespace``), its regex a topic's pseudonym (a regex too, that takes
    nothing of the original), except one that holds no letter or digit
    (``.*``: every topic), which names nothing and is kept."""
    if not pattern:
        return pattern
    domain, sep, rest = pattern.partition("://")
    if not sep:
        domain, rest = "", pattern
    namespace, slash, regex = rest.rpartition("/")
    named = any(c.isalnum() for c in regex)
    new = names.name("topic", regex) if named else regex
    if slash:
        new = f"{names.namespace(namespace)}/{new}"
    return f"{domain}://{new}" if domain else new


def anonymized_summary(summary: dict[str, Any], names: Pseudonyms) -> dict[str, Any]:
    """A frame's summary (``s``) with its names replaced as the frame's."""
    out = dict(summary)
    if out.get("topic"):
        out["topic"] = names.topic(out["topic"])
    for key in ("why", "withheld"):
        if isinstance(out.get(key), str):
            out[key] = names.scrub(out[key])
    chunk = out.get("chunk")
    if isinstance(chunk, list) and chunk and isinstance(chunk[0], str):
        out["chunk"] = [names.scrub(chunk[0]), *chunk[1:]]
    return out


# What ProtocolSpec.anonymize names: the frame's and the summary's rewriters.
ANONYMIZER = (anonymized_frame, anonymized_summary)
