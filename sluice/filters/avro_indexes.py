"""Find what Java's Avro decoder fails on in an Avro datum, fast.

fastavro's compiled reader takes a negative union branch or enum index as a
position from the end, as Python indexes a list (-1: the last), and reads a
varint of any length, where Java's Avro decoder (Pulsar's clients) fails on
a negative index, on an int, union or enum index longer than 5 bytes
(``readInt``) and on a long, length or count longer than 10 (``readLong``).
Its Python reader can be made to refuse them, but is some 6 times slower on
large payloads. So the schema filter reads a payload with the compiled
reader first, and, when the datum decodes, runs ``walker``'s check over the
same bytes: a walk driven by the parsed schema that reads union and enum
indexes, steps over ints, longs, lengths and counts checking how long they
are, and stops at the first one Java fails on.

Only a schema with a union or an enum is walked (Pulsar's clients make
every field of an object type nullable, a union, so most are). Walking the
others for long varints alone would cost a third or more of the read (a
millisecond timestamp or non-ASCII text makes a run of high-bit bytes that
such a varint needs), so an int or long past Java's length passes there.

The walk trusts the encoding up to what it stops at: the compiled reader
read the same bytes the same way until then. A schema whose named type
holds itself is not walked (its payloads are read by the Python reader,
which refuses all of it itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fastavro.types import NamedSchemas
from fastavro.types import Schema as AvroSchema

__all__ = ["INT_BYTES", "LONG_BYTES", "Unreadable", "walker"]

# A step over one value: the payload and where the value starts; where it ends.
_Step = Callable[[bytes, int], int]

_FIXED_WIDTH: Final = {"null": 0, "boolean": 1, "float": 4, "double": 8}


# The most bytes Java's Avro decoder reads in an int (readInt: ints, union
# and enum indexes) and in a long (readLong: longs, lengths, counts).
INT_BYTES: Final = 5
LONG_BYTES: Final = 10


class Unreadable(Exception):
    """What Java's Avro decoder fails on: a union branch or enum symbol
    named by a negative index, or a varint longer than it reads."""


def _skip_int(data: bytes, at: int) -> int:
    end = at
    while data[end] & 0x80:
        end += 1
    if end - at >= INT_BYTES:
        raise Unreadable("int")
    return end + 1


def _skip_long(data: bytes, at: int) -> int:
    end = at
    while data[end] & 0x80:
        end += 1
    if end - at >= LONG_BYTES:
        raise Unreadable("long")
    return end + 1


def _read_long(data: bytes, at: int, most: int = LONG_BYTES) -> tuple[int, int]:
    b = data[at]
    if b < 0x80:  # one byte: most indexes, lengths and counts
        return (b >> 1) ^ -(b & 1), at + 1
    start = at
    n, shift = b & 0x7F, 7
    at += 1
    while True:
        b = data[at]
        n |= (b & 0x7F) << shift
        at += 1
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), at
        if at - start >= most:
            raise Unreadable("varint")
        shift += 7


def _read_index(data: bytes, at: int) -> tuple[int, int]:
    """A union branch or enum symbol index, as Java reads one (readInt)."""
    index, at = _read_long(data, at, INT_BYTES)
    if index < 0:
        raise Unreadable(index)
    return index, at


def _skip_sized(data: bytes, at: int) -> int:
    size, at = _read_long(data, at)
    return at + size


class _Compiler:
    def __init__(self, named: NamedSchemas) -> None:
        self._named = named
        self._steps: dict[str, tuple[_Step, bool]] = {}

    def step(self, node: AvroSchema) -> tuple[_Step, bool]:
        """The step over a value of ``node``, and whether it holds an index."""
        if isinstance(node, str):
            if node in _FIXED_WIDTH:
                width = _FIXED_WIDTH[node]
                return (lambda data, at: at + width), False
            if node == "int":
                return _skip_int, False
            if node == "long":
                return _skip_long, False
            if node in ("string", "bytes"):
                return _skip_sized, False
            if node in self._named:
                known = self._steps.get(node)
                if known is None:
                    known = self.step(self._named[node])
                    self._steps[node] = known
                return known
            raise ValueError(f"unknown Avro type {node!r}")
        if isinstance(node, list):
            codes = [self._leaf(branch) for branch in node]
            if all(code is not None for code in codes):
                return _leaf_union(tuple(c for c in codes if c is not None)), True
            return self._union([self.step(branch)[0] for branch in node]), True
        kind = node.get("type")
        if kind in ("record", "error"):
            parts = [self.step(f["type"]) for f in node["fields"]]
            return self._record([s for s, _ in parts]), any(i for _, i in parts)
        if kind == "enum":
            return _enum, True
        if kind == "fixed":
            size = int(node["size"])
            return (lambda data, at: at + size), False
        if kind == "array":
            items = node["items"]
            if isinstance(items, list):
                codes = [self._leaf(branch) for branch in items]
                if all(code is not None for code in codes):
                    return _leaf_union_blocks(tuple(c for c in codes if c is not None)), True
            item, indexed = self.step(items)
            return self._blocks(item, None), indexed
        if kind == "map":
            value, indexed = self.step(node["values"])
            return self._blocks(_skip_sized, value), indexed
        return self.step(node["type"])  # {"type": <a type>}

    def _leaf(self, node: AvroSchema) -> int | None:
        """For a type read without a step of its own: its width in bytes,
        ``_INT``, ``_VARINT`` or ``_SIZED``; None for others."""
        node = self._named.get(node, node) if isinstance(node, str) else node
        if isinstance(node, str):
            if node in _FIXED_WIDTH:
                return _FIXED_WIDTH[node]
            if node == "int":
                return _INT
            if node == "long":
                return _VARINT
            if node in ("string", "bytes"):
                return _SIZED
            return None
        if isinstance(node, dict):
            kind = node.get("type")
            if kind == "fixed":
                return int(node["size"])
            if isinstance(kind, str) and kind not in ("record", "error", "enum", "array", "map"):
                return self._leaf(kind)
        return None

    @staticmethod
    def _union(branches: list[_Step]) -> _Step:
        def union(data: bytes, at: int) -> int:
            index, at = _read_index(data, at)
            return branches[index](data, at)

        return union

    @staticmethod
    def _record(fields: list[_Step]) -> _Step:
        def record(data: bytes, at: int) -> int:
            for field in fields:
                at = field(data, at)
            return at

        return record

    @staticmethod
    def _blocks(first: _Step, second: _Step | None) -> _Step:
        """An array's (items: ``first``) or a map's (keys, then values)."""

        def blocks(data: bytes, at: int) -> int:
            while True:
                count, at = _read_long(data, at)
                if count == 0:
                    return at
                if count < 0:  # a block with its size in bytes, which readers
                    count = -count  # pass over: they read the items
                    _, at = _read_long(data, at)
                if first is _skip_sized and second is None:
                    for _ in range(count):  # strings or bytes: the common large payload
                        b = data[at]
                        if b < 0x80:
                            at += 1 + ((b >> 1) ^ -(b & 1))
                        else:
                            at = _skip_sized(data, at)
                elif second is None:
                    for _ in range(count):
                        at = first(data, at)
                else:
                    for _ in range(count):
                        at = second(data, first(data, at))

        return blocks


_VARINT: Final = -1  # a long
_SIZED: Final = -2
_INT: Final = -3


def _leaf_union(codes: tuple[int, ...]) -> _Step:
    """A union whose branches are all leaves (``_Compiler._leaf``), as most
    are (a nullable string, long, ...): one step, no call per branch."""

    def union(data: bytes, at: int) -> int:
        b = data[at]
        if b < 0x80 and not b & 1:  # a one-byte index that is not negative
            code = codes[b >> 1]
            at += 1
        else:
            index, at = _read_index(data, at)
            code = codes[index]
        if code >= 0:
            return at + code
        if code == _VARINT:
            return _skip_long(data, at)
        if code == _INT:
            return _skip_int(data, at)
        return _skip_sized(data, at)

    return union


def _leaf_union_blocks(codes: tuple[int, ...]) -> _Step:
    """An array of a union of leaves (``[null, string]``...), its items
    walked in the loop: a call per item would cost more than the walk."""
    union = _leaf_union(codes)

    def blocks(data: bytes, at: int) -> int:
        while True:
            count, at = _read_long(data, at)
            if count == 0:
                return at
            if count < 0:  # a block with its size in bytes (read past)
                count = -count
                _, at = _read_long(data, at)
            for _ in range(count):
                b = data[at]
                if b >= 0x80 or b & 1:
                    at = union(data, at)  # a long index, or a negative one
                    continue
                code = codes[b >> 1]
                at += 1
                if code >= 0:
                    at += code
                elif code == _VARINT:
                    at = _skip_long(data, at)
                elif code == _INT:
                    at = _skip_int(data, at)
                else:
                    b = data[at]
                    if b < 0x80:
                        at += 1 + ((b >> 1) ^ -(b & 1))
                    else:
                        at = _skip_sized(data, at)

    return blocks


def _enum(data: bytes, at: int) -> int:
    return _read_index(data, at)[1]


def walker(schema: AvroSchema, named: NamedSchemas) -> Callable[[bytes], bool | None] | None:
    """For a parsed schema (not one that holds itself), a check of a payload
    the compiled reader decoded: whether it holds what Java's Avro decoder
    fails on (a negative union branch or enum index, a varint longer than
    Java reads). None when the schema has no union or enum."""
    step, indexed = _Compiler(named).step(schema)
    if not indexed:
        return None

    def unreadable(payload: bytes) -> bool | None:
        """True: something Java fails on; False: nothing; None: the walk
        could not tell (bytes it did not expect: it trusts what the compiled
        reader read, so the caller reads them again, slowly)."""
        try:
            step(payload, 0)
        except Unreadable:
            return True
        except (IndexError, ValueError):
            return None
        return False

    return unreadable
