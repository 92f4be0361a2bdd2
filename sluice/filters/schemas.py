"""Check a message payload against its topic's Pulsar schema.

``validator(schema)`` reads a ``Schema`` once and returns a function that
checks one payload (and, for KEY_VALUE with SEPARATED encoding, the message
key) per call: ``None`` when the payload is what the schema says, else a
``Mismatch``. A proxy refuses a bad message before the broker stores it,
where every consumer would otherwise fail on it later; so the checks follow
what Pulsar's own clients write and read, per schema type:

* AVRO: one datum in Avro binary encoding, no container header (what
  Pulsar's Avro writer and ``fastavro.schemaless_writer`` produce), read by
  fastavro. It must decode and use every byte. Logical types are read as
  their underlying types: the check is of the encoding, and fastavro's
  conversions (to datetimes, UUIDs) would refuse some that Pulsar's Java
  reader takes. On a failure the datum is
  read again a field at a time to name the field the bytes stop fitting:
  nested records are followed (``address.city``), and so are unions with a
  record branch; inside an array or a map the array or map field is named.
  A schema whose named type holds itself is read by fastavro's Python
  reader (the compiled one would follow a payload's nesting until the C
  stack overflows): past some hundred levels a payload is refused, and so
  are a negative union branch or symbol index and a varint longer than Java
  reads. Other schemas' payloads are
  read by the compiled reader, then walked (``avro_indexes``) for a
  negative union or enum index (fastavro counts one from the end, as
  Python indexes a list) and for a varint longer than Java reads (an int
  or an index past 5 bytes, a long, length or count past 10; fastavro reads
  any length): Java's Avro decoder fails on both. Only a schema with a
  union or an enum is walked (most are: Pulsar's clients make fields of
  object types nullable); in others an int or long past Java's length
  passes, as walking them would cost a third or more of the read.
* JSON: the schema is an Avro record definition, the payload one UTF-8 JSON
  document, walked against it. Missing fields are allowed when nullable or
  defaulted (Pulsar's JSON writer leaves nulls out); fields the schema does
  not name are allowed (Pulsar's JSON reader ignores them). Types are
  checked strictly: int and long take JSON integers in range, float and
  double any number (or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``: Jackson
  writes them as text), bytes and fixed any text (Jackson writes and reads
  base64; Pulsar's Python client, since 3.4.0, writes the bytes' own UTF-8
  text and reads any text back as its bytes: text that is not base64 is
  one client's value, as an out-of-range enum integer is) or an array of
  integers from -128 to 255 (Jackson reads it as those bytes), enums a symbol
  or any integer (Pulsar's Python client writes an enum member's value, a
  number for most Python enums, and reads an integer back as the member of
  that value, which the schema does not tell; Jackson reads it as the
  symbol's position, and fails past the last: an integer passes, as one
  client may read it). Where Avro's ReflectData (which makes a Java
  client's definition) and Jackson (which writes its payloads) part, what
  Jackson writes passes: a BigDecimal or BigInteger (text with a
  ``java-class``) as a number, a map with keys that are not text (an array
  of key/value records with a ``java-class``) as an object, a char (an int
  with ``java-class`` java.lang.Character) as one character of text.
* PROTOBUF_NATIVE: the schema is a JSON document holding a serialized
  ``FileDescriptorSet`` (base64), the root file's name and the root
  message's full name. The payload must parse as that message, have no
  field numbers the descriptor lacks (at any depth), and, for proto2, carry
  its required fields.
* Fixed-width types, big-endian as Pulsar writes them: BOOLEAN, INT8 (1
  byte), INT16 (2), INT32 and FLOAT (4), INT64, DOUBLE, DATE, TIME,
  TIMESTAMP, LOCAL_DATE and LOCAL_TIME (8), INSTANT (12: seconds and
  nanoseconds), LOCAL_DATE_TIME (16: epoch day and nano of day). Only the
  size is checked: Pulsar's BooleanSchema reads any non-zero byte as true.
* STRING: text in the schema's ``__charset`` property's charset (UTF-8
  when absent).
* KEY_VALUE: the schema data holds the key's and the value's schema data,
  each behind a 4-byte big-endian length; their types and properties are
  the ``key.schema.*`` / ``value.schema.*`` properties. INLINE encoding puts
  key and value in the payload, each behind a 4-byte length (-1: null);
  SEPARATED puts the key in the message key and the value in the payload.
  Each part is checked by its own schema, its messages prefixed ``key: ``
  or ``value: ``. A SEPARATED message without a key passes the key check:
  Pulsar's client sends a null key that way. The key is the message key's
  bytes: base64-decoded when the message marks it so (``base64_key``, as
  Pulsar's Java client reads it), else its UTF-8. Only a SEPARATED
  key/value reads the key (``reads_key``): other schemas leave it alone.
* NONE, BYTES, AUTO_CONSUME: anything passes.

Not checkable, so ``SchemaUnsupported``: PROTOBUF (its schema data is an
Avro rendering of the generated class; without the .proto there is no
wire layout to check against), EXTERNAL (kept by another registry), any
other type, and any schema definition that does not read.

A message whose value is null (``null_value`` in its metadata) carries no
payload to check; callers skip it, but for a SEPARATED key/value, whose
tombstones still carry a key, check that key with ``key_validator``.

``Mismatch.reason`` is one of these stable labels (metrics use them):

``not_avro``        the payload does not decode as the Avro schema
``trailing_bytes``  bytes left after a complete Avro datum or key/value pair
``not_json``        not a UTF-8 JSON document
``missing_field``   a required JSON field, or a proto2 required field, absent
``wrong_type``      a JSON value of the wrong type (or enum symbol, or range)
``not_protobuf``    the payload does not parse as the protobuf message
``unknown_field``   a protobuf field number the descriptor does not have
``wrong_size``      a fixed-width value of the wrong size
``not_utf8``        STRING bytes that are not text in the schema's charset
``not_key_value``   an INLINE key/value payload whose lengths do not fit, or a
                    SEPARATED key marked base64 that is not

``Mismatch.message`` is one line for the client: it names the field (or
the part: ``key``, ``value``) and says what was wrong with it.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeAlias

import fastavro
from fastavro import _read_py
from fastavro.io.binary_decoder import BinaryDecoder
from fastavro.types import NamedSchemas
from fastavro.types import Schema as AvroSchema
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.unknown_fields import UnknownFieldSet

from sluice.filters.avro_indexes import INT_BYTES, LONG_BYTES, walker
from sluice.protocols.credentials import names_a_credential
from sluice.protocols.filtering import Schema

__all__ = [
    "Mismatch",
    "SchemaUnsupported",
    "Validator",
    "base64_key",
    "key_validator",
    "reads_key",
    "validator",
]

NOT_AVRO: Final = "not_avro"
TRAILING_BYTES: Final = "trailing_bytes"
NOT_JSON: Final = "not_json"
MISSING_FIELD: Final = "missing_field"
WRONG_TYPE: Final = "wrong_type"
NOT_PROTOBUF: Final = "not_protobuf"
UNKNOWN_FIELD: Final = "unknown_field"
WRONG_SIZE: Final = "wrong_size"
NOT_UTF8: Final = "not_utf8"
NOT_KEY_VALUE: Final = "not_key_value"


class SchemaUnsupported(Exception):
    """A schema this module cannot check (its message says why, one line)."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Why a payload does not match its schema: ``reason`` a stable label
    (see the module docstring), ``message`` one line naming the field."""

    reason: str
    message: str


Validator: TypeAlias = Callable[[bytes, bytes | None], Mismatch | None]


def validator(schema: Schema) -> Validator:
    """Read ``schema`` once; the result checks one (payload, key) per call.

    Raises ``SchemaUnsupported`` for a type that cannot be checked or a
    definition that does not read."""
    kind = schema.type.upper()
    if kind in _ANYTHING:
        return _accept
    if kind in _FIXED_SIZES:
        return _fixed_size(kind, _FIXED_SIZES[kind])
    if kind == "STRING":
        return _string(schema.properties)
    if kind == "AVRO":
        return _AvroValidator(schema.data).check
    if kind == "JSON":
        return _JsonValidator(schema.data).check
    if kind == "PROTOBUF_NATIVE":
        return _ProtobufNativeValidator(schema.data).check
    if kind == "KEY_VALUE":
        return _key_value(schema)
    if kind == "PROTOBUF":
        raise SchemaUnsupported(
            "PROTOBUF schemas cannot be checked: their definition is an Avro rendering"
            " of the generated class, not the .proto its payloads follow"
        )
    raise SchemaUnsupported(f"schema type {schema.type!r} cannot be checked")


# Types whose payloads are whatever the producer sends.
_ANYTHING: Final = frozenset({"NONE", "BYTES", "AUTO_CONSUME"})

# Sizes as Pulsar's client encodes them (pulsar-client's *Schema classes).
_FIXED_SIZES: Final[Mapping[str, int]] = {
    "BOOLEAN": 1,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "FLOAT": 4,
    "INT64": 8,
    "DOUBLE": 8,
    "DATE": 8,
    "TIME": 8,
    "TIMESTAMP": 8,
    "LOCAL_DATE": 8,
    "LOCAL_TIME": 8,
    "INSTANT": 12,
    "LOCAL_DATE_TIME": 16,
}


def _accept(payload: bytes, key: bytes | None) -> Mismatch | None:
    return None


def _fixed_size(kind: str, size: int) -> Validator:
    def check(payload: bytes, key: bytes | None) -> Mismatch | None:
        if len(payload) == size:
            return None
        return Mismatch(WRONG_SIZE, f"{kind} value: expected {size} bytes, got {len(payload)}")

    return check


def _string(properties: Mapping[str, str]) -> Validator:
    # Pulsar's StringSchema names a non-UTF-8 charset in this property.
    charset = properties.get("__charset") or "UTF-8"
    try:
        codec = codecs.lookup(charset)
    except LookupError:
        raise SchemaUnsupported(f"STRING schema names an unknown charset {charset!r}") from None

    def check(payload: bytes, key: bytes | None) -> Mismatch | None:
        try:
            codec.decode(payload)
        except UnicodeDecodeError as e:
            return Mismatch(
                NOT_UTF8,
                f"STRING value: byte {e.start} is not valid {charset} ({e.reason})",
            )
        return None

    return check


# -- Avro --------------------------------------------------------------------


def _without_logical_types(node: Any) -> Any:
    """The schema with each logical type replaced by its underlying type.

    The checks are of the encoding: fastavro's conversions (to datetimes,
    UUIDs) refuse encodings Pulsar's Java reader takes, such as a
    timestamp-millis past the year 9999. Defaults are data, left alone."""
    if isinstance(node, list):
        return [_without_logical_types(branch) for branch in node]
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k != "logicalType"}
    for k in ("type", "items", "values"):
        if k in out:
            out[k] = _without_logical_types(out[k])
    if isinstance(out.get("fields"), list):
        out["fields"] = [
            {**f, "type": _without_logical_types(f["type"])}
            if isinstance(f, dict) and "type" in f
            else f
            for f in out["fields"]
        ]
    return out


def _avro_definition(data: bytes, kind: str, *, logical: bool) -> tuple[AvroSchema, NamedSchemas]:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise SchemaUnsupported(f"{kind} schema definition is not JSON: {e}") from None
    except RecursionError:
        raise SchemaUnsupported(f"{kind} schema definition is nested too deep to read") from None
    named: NamedSchemas = {}
    try:
        parsed = fastavro.parse_schema(
            raw if logical else _without_logical_types(raw), named_schemas=named
        )
    except Exception as e:  # fastavro raises several types for a bad definition
        raise SchemaUnsupported(f"{kind} schema definition is not an Avro schema: {e}") from None
    return parsed, named


def _empty_items(node: AvroSchema, named: NamedSchemas, seen: set[str]) -> str | None:
    """The first array in ``node`` whose items can encode in no bytes
    (described), or None."""
    if isinstance(node, str):
        if node in named and node not in seen:
            return _empty_items(named[node], named, seen | {node})
        return None
    if isinstance(node, list):
        for branch in node:
            found = _empty_items(branch, named, seen)
            if found is not None:
                return found
        return None
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind == "array":  # (a map's every entry has a key: one byte at least)
        if _takes_no_bytes(node["items"], named, set()):
            return "an array"
        return _empty_items(node["items"], named, seen)
    if kind == "map":
        return _empty_items(node["values"], named, seen)
    if kind in ("record", "error"):
        name = node.get("name", "")
        for field in node.get("fields", []):
            found = _empty_items(field["type"], named, seen | {name})
            if found is not None:
                return found
        return None
    return _empty_items(kind, named, seen) if isinstance(kind, str | list | dict) else None


def _takes_no_bytes(node: AvroSchema, named: NamedSchemas, seen: set[str]) -> bool:
    """Whether a value of ``node`` can encode in no bytes at all."""
    if isinstance(node, str):
        if node == "null":
            return True
        if node in named and node not in seen:
            return _takes_no_bytes(named[node], named, seen | {node})
        return False
    if isinstance(node, dict):
        kind = node.get("type")
        if kind in ("record", "error"):  # an error is a record
            inner = seen | {node.get("name", "")}
            return all(_takes_no_bytes(f["type"], named, inner) for f in node.get("fields", []))
        if kind == "fixed":
            return int(node.get("size", 1)) == 0
        if isinstance(kind, str) and kind not in ("array", "map", "enum"):
            return _takes_no_bytes(kind, named, seen)
    return False  # unions, arrays, maps and enums write at least one byte


def _refers_to(node: AvroSchema, named: NamedSchemas, out: set[str]) -> None:
    """The named types ``node`` refers to (or defines inside it), into ``out``."""
    if isinstance(node, str):
        if node in named:
            out.add(node)
    elif isinstance(node, list):
        for branch in node:
            _refers_to(branch, named, out)
    elif isinstance(node, dict):
        kind = node.get("type")
        name = node.get("name")
        if kind in ("record", "error", "enum", "fixed") and isinstance(name, str) and name in named:
            out.add(name)  # defined here: its own parts are its named entry's
            return
        for part in ("type", "items", "values"):
            if part in node:
                _refers_to(node[part], named, out)


def _recursive(named: NamedSchemas) -> bool:
    """Whether a named type holds itself (at any remove): then a value may
    nest as deep as its bytes allow."""
    refers: dict[str, set[str]] = {}
    for name, node in named.items():
        found: set[str] = set()
        if isinstance(node, dict):
            for f in node.get("fields", ()):
                if isinstance(f, dict) and "type" in f:
                    _refers_to(f["type"], named, found)
        refers[name] = found
    done: set[str] = set()
    for start in refers:  # depth first, without recursion: a cycle is a name met on the path
        if start in done:
            continue
        path, on_path = [(start, iter(refers[start]))], {start}
        while path:
            name, rest = path[-1]
            step = next(rest, None)
            if step is None:
                path.pop()
                on_path.discard(name)
                done.add(name)
            elif step in on_path:
                return True
            elif step not in done:
                path.append((step, iter(refers.get(step, ()))))
                on_path.add(step)
    return False


def _describe(node: AvroSchema) -> str:
    """An Avro type's name for a message: ``int``, ``record ex.User``, ..."""
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return " or ".join(_describe(branch) for branch in node)
    kind = str(node.get("type"))
    if kind in ("record", "error", "enum", "fixed"):
        return f"{kind} {node.get('name')}"
    if kind == "array":
        return f"array of {_describe(node['items'])}"
    if kind == "map":
        return f"map of {_describe(node['values'])}"
    return kind


def _where(path: str) -> str:
    return f"field '{path}'" if path else "value"


# What a refusal for nesting says of the bound.
_DEPTH: Final = "a schema that holds itself is read to some hundred levels"


class _AvroValidator:
    # The name of the one-field record that wraps a part of the schema to read
    # it alone: a record of one field encodes exactly as that field.
    _PROBE: Final = "sluice_schemas_probe"

    def __init__(self, data: bytes) -> None:
        self._schema, self._named = _avro_definition(data, "AVRO", logical=False)
        self._probes: dict[int, AvroSchema] = {}
        # An array of items that take no bytes is read item by item
        # for as many as its block count says, which a few payload bytes can
        # put in the billions: one message would hold the proxy's thread.
        empty = _empty_items(self._schema, self._named, set())
        if empty is not None:
            raise SchemaUnsupported(
                f"{empty} holds items that take no bytes, which a payload could "
                "claim billions of: not checked"
            )
        # A schema that holds itself lets a payload nest a level per two
        # bytes: fastavro's compiled reader would follow it until the C
        # stack overflows and the process dies. Such schemas are read by its
        # Python reader, whose depth Python bounds (RecursionError). So are
        # schemas with a union or an enum: the compiled reader takes a
        # negative index as a position from the end, where Java's Avro
        # decoder (Pulsar's clients) fails (``_StrictDecoder``), and reads a
        # varint of any length, where Java fails on an int or an index past
        # 5 bytes and a long, length or count past 10.
        # fastavro's Python reader is some 6 times slower than its compiled
        # one on large payloads, so other schemas are read by the compiled
        # reader and then, when they have a union or an enum, walked for
        # those (``avro_indexes``); only a payload that has one is read
        # again, by the Python reader, to say where.
        self._strict: Callable[..., Any] = _strict_reader(self._named)
        self._unreadable: Callable[[bytes], bool | None] | None = None
        if _recursive(self._named):
            self._read: Callable[..., Any] = self._strict
        else:
            self._read = fastavro.schemaless_reader
            self._unreadable = walker(self._schema, self._named)

    def check(self, payload: bytes, key: bytes | None) -> Mismatch | None:
        stream = io.BytesIO(payload)
        try:
            self._read(stream, self._schema, None)
            if self._unreadable is not None and self._unreadable(payload) is not False:
                # One found (or the walk could not tell): the Python reader decides.
                self._strict(io.BytesIO(payload), self._schema, None)
        except RecursionError:
            return Mismatch(NOT_AVRO, f"value: nested deeper than can be checked ({_DEPTH})")
        except Exception:  # any decoding failure; _locate says where and why
            try:
                path, why = self._locate(self._schema, io.BytesIO(payload), "")
            except RecursionError:
                return Mismatch(NOT_AVRO, f"value: nested deeper than can be checked ({_DEPTH})")
            return Mismatch(NOT_AVRO, f"{_where(path)}: {why}")
        left = len(payload) - stream.tell()
        if left:
            return Mismatch(
                TRAILING_BYTES,
                f"value: {_bytes(left)} left after the {_describe(self._schema)},"
                f" which ends at byte {stream.tell()}",
            )
        return None

    def _resolve(self, node: AvroSchema) -> AvroSchema:
        if isinstance(node, str) and node in self._named:
            return self._named[node]
        return node

    def _probe(self, node: AvroSchema) -> AvroSchema:
        probe = self._probes.get(id(node))
        if probe is None:
            wrapper = {
                "type": "record",
                "name": self._PROBE,
                "fields": [{"name": "v", "type": node}],
            }
            # A copy: parse_schema adds to the names it is given.
            probe = fastavro.parse_schema(wrapper, named_schemas=dict(self._named))
            self._probes[id(node)] = probe
        return probe

    def _locate(self, node: AvroSchema, stream: io.BytesIO, path: str) -> tuple[str, str]:
        """Where reading ``node`` from ``stream`` fails: (field path, why).

        Slow, so only on a failure: reads the parts of ``node`` one after
        another until one does not decode, and goes into that one."""
        node = self._resolve(node)
        if isinstance(node, dict) and node.get("type") in ("record", "error"):
            for f in node["fields"]:
                start = stream.tell()
                try:
                    self._strict(stream, self._probe(f["type"]), None)
                except RecursionError:
                    raise
                except Exception:
                    stream.seek(start)
                    inner = f"{path}.{f['name']}" if path else str(f["name"])
                    return self._locate(f["type"], stream, inner)
        elif isinstance(node, list):
            try:
                branch = _StrictDecoder(stream).read_int()
            except Exception as e:
                return path, f"cannot read the union branch of {_describe(node)}: {_why(e)}"
            if not isinstance(branch, int) or not 0 <= branch < len(node):
                return path, f"union branch {branch!r} does not exist in {_describe(node)}"
            return self._locate(node[branch], stream, path)
        elif isinstance(node, dict) and node.get("type") == "enum":
            try:
                index = _StrictDecoder(stream).read_int()
            except Exception as e:
                return path, f"cannot read {_describe(node)}: {_why(e)}"
            return path, f"symbol {index!r} does not exist in {_describe(node)}"
        else:
            try:
                self._strict(stream, self._probe(node), None)
            except RecursionError:
                raise
            except Exception as e:
                return path, f"cannot read {_describe(node)}: {_why(e, node)}"
        # Every part read alone although the whole did not: say so plainly.
        return path, f"cannot read {_describe(node)}"


class _VarintTooLong(ValueError):
    """A varint longer than Java's Avro decoder reads (its message says so)."""


class _StrictDecoder(BinaryDecoder):
    """fastavro's binary decoder, refusing what Java's Avro decoder fails on:
    a negative union branch or enum index (fastavro indexes the branches, or
    symbols, as Python indexes a list, -1 the last), and a varint longer
    than Java reads: an int, union or enum index past 5 bytes (readInt), a
    long, length or count past 10 (readLong). fastavro reads any length."""

    # (fastavro's Python reader is untyped.)
    def __init__(self, stream: io.BytesIO) -> None:
        super().__init__(stream)  # type: ignore[no-untyped-call]
        self._stream = stream

    def _varint(self, most: int) -> int:
        start = self._stream.tell()
        value: int = super().read_long()  # type: ignore[no-untyped-call]
        length = self._stream.tell() - start
        if length > most:
            raise _VarintTooLong(
                f"a varint of {length} bytes, where Java's Avro decoder reads {most} at most"
            )
        return value

    def read_long(self) -> int:
        return self._varint(LONG_BYTES)

    def read_int(self) -> int:
        return self._varint(INT_BYTES)

    def read_index(self) -> int:
        return _not_negative(self._varint(INT_BYTES), "union branch")

    def read_enum(self) -> int:
        return _not_negative(self._varint(INT_BYTES), "enum symbol")


def _not_negative(index: int, what: str) -> int:
    if index < 0:
        raise IndexError(f"{what} {index} does not exist")
    return index


# fastavro's reading options, as its schemaless_reader sets them by default.
_READ_OPTIONS: Final[dict[str, Any]] = {
    "return_record_name": False,
    "return_record_name_override": False,
    "handle_unicode_errors": "strict",
    "return_named_type": False,
    "return_named_type_override": False,
}


def _strict_reader(named: NamedSchemas) -> Callable[..., Any]:
    """fastavro's Python reader over ``_StrictDecoder``, for schemas parsed
    with ``named`` (called as ``schemaless_reader``: stream, schema, None)."""
    names = {"writer": named, "reader": {}}
    read_data: Callable[..., Any] = _read_py.read_data

    def read(stream: io.BytesIO, schema: AvroSchema, reader: None = None) -> Any:
        return read_data(_StrictDecoder(stream), schema, names, None, _READ_OPTIONS)

    return read


def _why(e: Exception, node: AvroSchema = "long") -> str:
    if isinstance(e, EOFError):
        return "the payload ends early"
    if isinstance(e, UnicodeDecodeError):
        return "text that is not valid UTF-8"
    if isinstance(e, _VarintTooLong):
        return str(e)
    # fastavro's compiled reader runs off the end of the bytes this way
    # inside a number (a varint whose last byte is missing).
    if isinstance(e, IndexError) and node in ("int", "long", "string", "bytes"):
        return "the payload ends early"
    text = str(e).splitlines()[0] if str(e) else ""
    return f"malformed data ({type(e).__name__}{': ' + text[:80] if text else ''})"


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


# -- JSON --------------------------------------------------------------------

_INT_RANGE: Final = (-(2**31), 2**31 - 1)
# How Jackson (Pulsar's Java JSON writer) writes a float or double that is
# not a finite number: as text, by default (WRITE_NAN_AS_STRINGS); it reads
# the text back as that number.
_NON_FINITE: Final = frozenset({"NaN", "Infinity", "-Infinity"})
_LONG_RANGE: Final = (-(2**63), 2**63 - 1)
# The integers Jackson reads as one byte of a byte array given as a JSON
# array: a signed or an unsigned byte.
_BYTE_RANGE: Final = (-128, 255)
# Java classes Avro's ReflectData makes text of (``java-class`` on a string)
# that Jackson writes as JSON numbers; and the class of a char, an int there
# that Jackson writes as one character of text.
_JAVA_NUMBERS: Final = frozenset({"java.math.BigDecimal", "java.math.BigInteger"})
_JAVA_CHAR: Final = "java.lang.Character"


def _reject_constant(name: str) -> NoReturn:
    # NaN and Infinity are not JSON (and Pulsar's Jackson reader refuses them).
    raise ValueError(f"{name} is not a JSON value")


def _map_key(key: object) -> str:
    """A map key in a field's path, at most 40 characters (a key is the
    producer's data: a long one must not make a long message)."""
    text = str(key)
    return f"[{text if len(text) <= 40 else text[:37] + '...'}]"


def _secret(path: str) -> bool:
    """Whether the field at ``path`` (``a.b[2][key]``) is named like a
    credential: a refusal names it, never its value (the refusal goes to
    the client, the recording and the log)."""
    last = re.split(r"[.\[\]]", path.rstrip("]"))[-1]
    return bool(last) and names_a_credential(last)


def _shown(value: Any, path: str = "") -> str:
    """A JSON value as a message shows it: ``string 'abc'``, ``object``, ...;
    at a credential's ``path``, its type alone (``a string``)."""
    if _secret(path) and value is not None and not isinstance(value, list | dict):
        kind = (
            "boolean"
            if isinstance(value, bool)
            else "string"
            if isinstance(value, str)
            else "number"
        )
        return f"a {kind}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, int | float):
        text = repr(value)
        return f"number {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"string {text!r}"
    if isinstance(value, list):
        return "array"
    return "object"


def _nullable(node: AvroSchema) -> bool:
    if node == "null":
        return True
    return isinstance(node, list) and "null" in node


class _JsonValidator:
    def __init__(self, data: bytes) -> None:
        # Logical types stay: a JSON decimal may be a number where bytes are text.
        self._schema, self._named = _avro_definition(data, "JSON", logical=True)

    def check(self, payload: bytes, key: bytes | None) -> Mismatch | None:
        try:
            value = json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
        except UnicodeDecodeError as e:
            return Mismatch(NOT_JSON, f"value: byte {e.start} is not valid UTF-8")
        except RecursionError:
            return Mismatch(NOT_JSON, "value: nested deeper than can be read")
        except ValueError as e:
            return Mismatch(NOT_JSON, f"value: not a JSON document ({str(e)[:80]})")
        try:
            return self._walk(self._schema, value, "")
        except RecursionError:
            return Mismatch(WRONG_TYPE, "value: nested deeper than can be checked")

    def _wrong(self, node: AvroSchema, value: Any, path: str) -> Mismatch:
        return Mismatch(
            WRONG_TYPE,
            f"{_where(path)}: expected {self._expected(node)}, got {_shown(value, path)}",
        )

    def _expected(self, node: AvroSchema) -> str:
        node = self._resolve(node)
        if isinstance(node, list):
            return " or ".join(self._expected(branch) for branch in node)
        kind = node if isinstance(node, str) else str(node.get("type"))
        if kind in ("record", "error", "map"):
            return "object"
        if kind in ("bytes", "fixed"):
            if isinstance(node, dict) and node.get("logicalType") == "decimal":
                return "number or string"
            return "string or array of byte values"
        if kind == "enum" and isinstance(node, dict):
            return "one of " + ", ".join(repr(s) for s in node["symbols"]) + " (or a number)"
        return kind

    def _resolve(self, node: AvroSchema) -> AvroSchema:
        if isinstance(node, str) and node in self._named:
            return self._named[node]
        return node

    def _walk(self, node: AvroSchema, value: Any, path: str) -> Mismatch | None:
        """The first place ``value`` does not fit ``node``, or None."""
        node = self._resolve(node)
        if isinstance(node, list):
            return self._union(node, value, path)
        if isinstance(node, str):
            kind, logical, java = node, None, None
        else:
            kind, logical = str(node.get("type")), node.get("logicalType")
            java = node.get("java-class")
        if kind in ("record", "error") and isinstance(node, dict):
            return self._record(node, value, path)
        if kind == "null":
            ok = value is None
        elif kind == "boolean":
            ok = isinstance(value, bool)
        elif kind == "int" and java == _JAVA_CHAR and isinstance(value, str):
            ok = len(value) == 1  # Jackson writes a char as one character of text
        elif kind in ("int", "long"):
            low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
            if isinstance(value, int) and not isinstance(value, bool):
                if not low <= value <= high:
                    shown = "its value" if _secret(path) else str(value)
                    return Mismatch(
                        WRONG_TYPE, f"{_where(path)}: {shown} is out of range for {kind}"
                    )
                return None
            ok = False
        elif kind in ("float", "double"):
            ok = (isinstance(value, int | float) and not isinstance(value, bool)) or (
                isinstance(value, str) and value in _NON_FINITE
            )
        elif kind == "string":
            # Jackson writes the big numbers Avro's ReflectData calls text as numbers.
            ok = isinstance(value, str) or (
                java in _JAVA_NUMBERS
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            )
        elif kind in ("bytes", "fixed") and logical == "decimal":
            # Jackson writes big decimals as numbers.
            ok = isinstance(value, str) or (
                isinstance(value, int | float) and not isinstance(value, bool)
            )
        elif kind in ("bytes", "fixed"):
            # Jackson writes and reads byte arrays as base64 text; Pulsar's
            # Python client (3.4.0 on) writes the bytes' own text and reads
            # any text back: a value passes when one client reads it.
            # Jackson also reads an array of integers that fit a byte
            # (-128 to 255) as those bytes.
            if isinstance(value, list):
                return self._byte_values(value, path)
            ok = isinstance(value, str)
        elif kind == "enum" and isinstance(node, dict):
            ok = (isinstance(value, str) and value in node["symbols"]) or (
                isinstance(value, int) and not isinstance(value, bool)
            )
        elif kind == "array" and isinstance(node, dict):
            pair = self._map_pair(node)
            if pair is not None and isinstance(value, dict):
                # A Java map with keys that are not text: ReflectData's array of
                # key/value records, which Jackson writes as an object.
                for k, item in value.items():
                    found = self._walk(pair, item, path + _map_key(k))
                    if found is not None:
                        return found
                return None
            if not isinstance(value, list):
                return self._wrong(node, value, path)
            for i, item in enumerate(value):
                found = self._walk(node["items"], item, f"{path}[{i}]")
                if found is not None:
                    return found
            return None
        elif kind == "map" and isinstance(node, dict):
            if not isinstance(value, dict):
                return self._wrong(node, value, path)
            for k, item in value.items():
                found = self._walk(node["values"], item, path + _map_key(k))
                if found is not None:
                    return found
            return None
        else:
            ok = True  # a type fastavro accepted that JSON cannot be held to
        return None if ok else self._wrong(node, value, path)

    @staticmethod
    def _byte_values(value: list[Any], path: str) -> Mismatch | None:
        """A bytes or fixed field given as an array: each item an integer
        Jackson reads as a byte."""
        low, high = _BYTE_RANGE
        for i, item in enumerate(value):
            if not (isinstance(item, int) and not isinstance(item, bool) and low <= item <= high):
                where = f"{path}[{i}]"
                return Mismatch(
                    WRONG_TYPE,
                    f"{_where(where)}: expected a byte value ({low} to {high}),"
                    f" got {_shown(item, where)}",
                )
        return None

    def _map_pair(self, node: Mapping[str, Any]) -> AvroSchema | None:
        """For an array that stands for a Java map (``java-class``) of key/value
        records, the value's type; else None."""
        if not isinstance(node.get("java-class"), str):
            return None
        items = self._resolve(node["items"])
        if not isinstance(items, dict) or items.get("type") != "record":
            return None
        fields = items.get("fields", [])
        if [f.get("name") for f in fields] != ["key", "value"]:
            return None
        value_type: AvroSchema = fields[1]["type"]
        return value_type

    def _record(self, node: Mapping[str, Any], value: Any, path: str) -> Mismatch | None:
        if not isinstance(value, dict):
            return self._wrong(dict(node), value, path)
        for f in node["fields"]:
            name = str(f["name"])
            inner = f"{path}.{name}" if path else name
            if name not in value:
                if "default" in f or _nullable(self._resolve(f["type"])):
                    continue
                return Mismatch(
                    MISSING_FIELD,
                    f"field '{inner}': missing (expected {self._expected(f['type'])})",
                )
            found = self._walk(f["type"], value[name], inner)
            if found is not None:
                return found
        return None

    def _union(self, branches: list[Any], value: Any, path: str) -> Mismatch | None:
        for branch in branches:
            if self._walk(branch, value, path) is None:
                return None
        others = [b for b in branches if b != "null"]
        if len(others) == 1 and isinstance(value, dict | list):
            # A nullable record, array or map: what is wrong is inside it.
            return self._walk(others[0], value, path)
        return self._wrong(branches, value, path)


# -- PROTOBUF_NATIVE ---------------------------------------------------------

_WIRE_TYPES: Final = {
    0: "varint",
    1: "64-bit",
    2: "length-delimited",
    3: "group",
    4: "group end",
    5: "32-bit",
}


class _ProtobufNativeValidator:
    def __init__(self, data: bytes) -> None:
        try:
            doc = json.loads(data)
            encoded = doc["fileDescriptorSet"]
            root_file = doc["rootFileDescriptorName"]
            root_message = doc["rootMessageTypeName"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise SchemaUnsupported(
                f"PROTOBUF_NATIVE schema definition is not the expected JSON document ({e!r})"
            ) from None
        if not all(isinstance(v, str) for v in (encoded, root_file, root_message)):
            raise SchemaUnsupported("PROTOBUF_NATIVE schema definition has a non-text field")
        try:
            files = descriptor_pb2.FileDescriptorSet.FromString(
                base64.b64decode(encoded, validate=True)
            )
        except (binascii.Error, DecodeError) as e:
            raise SchemaUnsupported(
                f"PROTOBUF_NATIVE fileDescriptorSet is not a serialized FileDescriptorSet: {e}"
            ) from None
        by_name = {f.name: f for f in files.file}
        if root_file not in by_name:
            raise SchemaUnsupported(f"PROTOBUF_NATIVE root file {root_file!r} is not in the set")
        pool = descriptor_pool.DescriptorPool()
        self._add(pool, by_name, root_file, set())
        try:
            root = pool.FindMessageTypeByName(root_message)
        except KeyError:
            raise SchemaUnsupported(
                f"PROTOBUF_NATIVE root message {root_message!r} is not defined"
            ) from None
        # Pulsar's client looks the root message up inside the root file only.
        if root.file.name != root_file:
            raise SchemaUnsupported(
                f"PROTOBUF_NATIVE root message {root_message!r} is not in {root_file!r}"
            )
        self._message = message_factory.GetMessageClass(root)

    @staticmethod
    def _add(
        pool: descriptor_pool.DescriptorPool,
        by_name: Mapping[str, descriptor_pb2.FileDescriptorProto],
        name: str,
        visiting: set[str],
    ) -> None:
        """Add ``name`` after its imports (a pool needs them first)."""
        try:
            pool.FindFileByName(name)
            return
        except KeyError:
            pass
        if name in visiting:
            raise SchemaUnsupported(f"PROTOBUF_NATIVE files import each other: {name!r}")
        if name not in by_name:
            raise SchemaUnsupported(f"PROTOBUF_NATIVE import {name!r} is not in the set")
        visiting.add(name)
        for dependency in by_name[name].dependency:
            _ProtobufNativeValidator._add(pool, by_name, dependency, visiting)
        visiting.discard(name)
        try:
            pool.Add(by_name[name])
        except Exception as e:  # the pool raises several types for a bad file
            raise SchemaUnsupported(f"PROTOBUF_NATIVE file {name!r} does not build: {e}") from None

    def check(self, payload: bytes, key: bytes | None) -> Mismatch | None:
        message = self._message()
        try:
            message.ParseFromString(payload)
        except DecodeError as e:
            return Mismatch(
                NOT_PROTOBUF,
                f"value: not a {message.DESCRIPTOR.full_name} message ({str(e)[:80]})",
            )
        unknown = _unknown_field(message, "")
        if unknown is not None:
            return unknown
        if message.IsInitialized():
            return None
        # Paths such as "address.city"; the stubs lack this method.
        missing: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
        return Mismatch(MISSING_FIELD, f"field '{missing[0]}': required but missing")


def _unknown_field(message: ProtoMessage, path: str) -> Mismatch | None:
    """The first field number the descriptor lacks, here or in a nested message."""
    unknown = UnknownFieldSet(message)
    if len(unknown):
        number, wire = unknown[0].field_number, unknown[0].wire_type
        kind = _WIRE_TYPES.get(wire, f"wire type {wire}")
        where = f"in field '{path}'" if path else f"in {message.DESCRIPTOR.full_name}"
        return Mismatch(UNKNOWN_FIELD, f"unknown field number {number} ({kind}) {where}")
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE and field.type != FieldDescriptor.TYPE_GROUP:
            continue
        inner = f"{path}.{field.name}" if path else field.name
        for label, item in _messages_in(field, value):
            found = _unknown_field(item, inner + label)
            if found is not None:
                return found
    return None


def _messages_in(field: FieldDescriptor, value: Any) -> list[tuple[str, ProtoMessage]]:
    """The messages a set field holds, each with its index or map key."""
    entry: Descriptor | None = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value_field = entry.fields_by_name["value"]
        if value_field.type != FieldDescriptor.TYPE_MESSAGE:
            return []
        return [(_map_key(k), v) for k, v in value.items()]
    if field.is_repeated:
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return [("", value)]


# -- KEY_VALUE ---------------------------------------------------------------


def reads_key(schema: Schema) -> bool:
    """Whether ``schema``'s check reads the message key (KEY_VALUE, SEPARATED)."""
    if schema.type.upper() != "KEY_VALUE":
        return False
    return (schema.properties.get("kv.encoding.type") or "INLINE") == "SEPARATED"


def base64_key(text: str) -> bytes | Mismatch:
    """The bytes of a message key marked base64, as Pulsar's Java consumer
    decodes them (java.util.Base64: the standard alphabet; padding optional,
    but whole where present), or why it is not base64."""
    try:
        data = text.encode("ascii")
        if b"=" not in data:
            data += b"=" * (-len(data) % 4)
        return base64.b64decode(data, validate=True)
    except (UnicodeEncodeError, binascii.Error):
        shown = text if len(text) <= 40 else text[:37] + "..."
        return Mismatch(NOT_KEY_VALUE, f"key: not base64 ({shown!r}), as the message says it is")


def _split(data: bytes) -> tuple[bytes | None, bytes | None, int] | str:
    """Two length-prefixed parts (-1: null) and where they end, or what is wrong."""
    parts: list[bytes | None] = []
    at = 0
    for part in ("key", "value"):
        if len(data) - at < 4:
            return f"the bytes end before the {part} length"
        size = int.from_bytes(data[at : at + 4], "big", signed=True)
        at += 4
        if size == -1:
            parts.append(None)
            continue
        if size < 0 or size > len(data) - at:
            return f"{part} length {size} does not fit the {len(data) - at} bytes left"
        parts.append(data[at : at + size])
        at += size
    return parts[0], parts[1], at


def _part(schema: Schema, part: str, data: bytes) -> Validator:
    props = schema.properties
    kind = props.get(f"{part}.schema.type") or "BYTES"  # Pulsar's default, too
    raw = props.get(f"{part}.schema.properties") or "{}"
    try:
        properties = json.loads(raw)
    except (ValueError, RecursionError):
        raise SchemaUnsupported(f"KEY_VALUE {part}.schema.properties is not JSON") from None
    if not isinstance(properties, dict):
        raise SchemaUnsupported(f"KEY_VALUE {part}.schema.properties is not a JSON object")
    sub = Schema(type=kind, data=data, properties={str(k): str(v) for k, v in properties.items()})
    try:
        return validator(sub)
    except SchemaUnsupported as e:
        raise SchemaUnsupported(f"KEY_VALUE {part}: {e}") from None


def _prefixed(part: str, found: Mismatch | None) -> Mismatch | None:
    return None if found is None else Mismatch(found.reason, f"{part}: {found.message}")


def _parts(schema: Schema) -> tuple[Validator, Validator]:
    """A KEY_VALUE schema's key and value checks."""
    split = _split(schema.data)
    if isinstance(split, str):
        raise SchemaUnsupported(f"KEY_VALUE schema definition: {split}")
    key_data, value_data, end = split
    if end != len(schema.data):
        raise SchemaUnsupported("KEY_VALUE schema definition has bytes after the value schema")
    return _part(schema, "key", key_data or b""), _part(schema, "value", value_data or b"")


def key_validator(schema: Schema) -> Validator:
    """For a message without a value (a tombstone): the check of its key
    alone, which a SEPARATED key/value carries in the message key (the
    payload is not looked at). Schemas that keep no key there pass it.

    Raises ``SchemaUnsupported`` as ``validator`` does."""
    if not reads_key(schema):
        return _accept
    check_key, _ = _parts(schema)

    def key_only(payload: bytes, key: bytes | None) -> Mismatch | None:
        return None if key is None else _prefixed("key", check_key(key, None))

    return key_only


def _key_value(schema: Schema) -> Validator:
    check_key, check_value = _parts(schema)
    encoding = schema.properties.get("kv.encoding.type") or "INLINE"  # Pulsar's default
    if encoding == "SEPARATED":

        def separated(payload: bytes, key: bytes | None) -> Mismatch | None:
            # No key: Pulsar's client sends a null key as no key at all.
            if key is not None:
                found = _prefixed("key", check_key(key, None))
                if found is not None:
                    return found
            return _prefixed("value", check_value(payload, None))

        return separated
    if encoding != "INLINE":
        raise SchemaUnsupported(f"KEY_VALUE encoding {encoding!r} is neither INLINE nor SEPARATED")

    def inline(payload: bytes, key: bytes | None) -> Mismatch | None:
        parts = _split(payload)
        if isinstance(parts, str):
            return Mismatch(NOT_KEY_VALUE, f"key/value: {parts}")
        key_bytes, value_bytes, end = parts
        if end != len(payload):
            return Mismatch(
                TRAILING_BYTES, f"key/value: {_bytes(len(payload) - end)} left after the value"
            )
        if key_bytes is not None:
            found = _prefixed("key", check_key(key_bytes, None))
            if found is not None:
                return found
        if value_bytes is not None:
            return _prefixed("value", check_value(value_bytes, None))
        return None

    return inline
