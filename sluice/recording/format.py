"""The recording format: a versioned stream of msgpack maps.

See docs/recording-format.md for the full description. In short, a file is
a ``header`` record followed by ``conn``, ``frame``, ``close`` and ``gap``
records in the order they happened. Keys are short because there are many
frames; values are plain msgpack types.

``read_records`` yields records upgraded to the current version and stops
cleanly at a truncated tail (what a killed writer leaves), reporting it.
"""

from __future__ import annotations

import enum
import hashlib
import io
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgpack

from sluice.logs import clipped
from sluice.protocols import registry

MAGIC = "sluice-recording"
VERSION = 2
SUFFIX = ".sluice"


class PayloadPolicy(enum.StrEnum):
    """What a recording keeps of message payloads (credentials never)."""

    FULL = "full"  # the bytes
    HASH = "hash"  # size and SHA-256
    NONE = "none"  # size only


PAYLOAD_POLICIES = tuple(p.value for p in PayloadPolicy)
CLIENT_TO_BROKER, BROKER_TO_CLIENT = 0, 1

Record = dict[str, Any]

# version -> function turning a record of that version into the next one.
UPGRADERS: dict[int, Callable[[Record], Record]] = {}


def _from_version_1(record: Record) -> Record:
    """Version 1 frame records carry their summary, which version 2 readers
    take as it is (they work one out only where ``s`` is missing)."""
    return record


UPGRADERS[1] = _from_version_1


class RecordingError(Exception):
    """A file that is not a readable recording. The message is for users."""


class Unfinished(RecordingError):
    """A file with no whole record: empty or cut inside its header (a writer
    stopped before its first flush, or during it). Among other files of a capture it is
    a segment that holds nothing yet, as an empty one is."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class Gone(RecordingError):
    """A file removed since it was listed (retention deletes the oldest
    segments while a capture is being read)."""


def header(
    *,
    capture: str,
    segment: int,
    started_ns: int,
    payloads: PayloadPolicy,
    sluice_version: str,
    protocol: str = registry.DEFAULT_PROTOCOL,
    host: str = "",
    listen: list[str] | None = None,
    broker: str = "",
    decoding: Mapping[str, Any] | None = None,
) -> Record:
    """A file's first record. ``decoding``: what the protocol's frames
    decode with besides their bytes (``ProtocolSpec.recorded``; Cursus: the
    broker's compression), kept only when there is something: a header
    without it (older files too) means nothing."""
    record: Record = {
        "k": "header",
        "format": MAGIC,
        "version": VERSION,
        "sluice": sluice_version,
        "protocol": protocol,
        "capture": capture,
        "segment": segment,
        "started": started_ns,
        "host": host,
        "listen": listen or [],
        "broker": broker,
        "payloads": PayloadPolicy(payloads).value,
        "redaction": {"credentials": "always", "marker": "<redacted>"},
    }
    if decoding:
        record["decoding"] = dict(decoding)
    return record


class NamedFrames:
    """``frame`` records for a protocol without a summarizer of its own: the
    summary is the frame's ``name``. A frame is recorded whole with
    ``--record-payloads full``; otherwise its bytes are left out, its size
    and (``hash``) digest kept, as nothing says which of them are payload."""

    def __init__(self, payloads: PayloadPolicy = PayloadPolicy.HASH) -> None:
        self.payloads = PayloadPolicy(payloads)
        self._pack = packer()
        self.compiled_code: int | None = None  # laid out in Python only

    def forget(self, conn: int) -> None:
        """Nothing kept per connection."""

    def record(self, conn: int, direction: int, mono_ns: int, wall_ns: int, frame: Any) -> Record:
        raw: bytes = frame.raw
        record = {"k": "frame", "c": conn, "d": direction, "t": mono_ns, "w": wall_ns,
                  "n": len(raw), "raw": raw, "s": {"cmd": frame.name}}  # fmt: skip
        if self.payloads is not PayloadPolicy.FULL:
            record["raw"] = b""
            digest = [hashlib.sha256(raw).digest()] if self.payloads is PayloadPolicy.HASH else []
            record["p"] = [len(raw), *digest]
        return record

    def packed(
        self, conn: int, direction: int, mono_ns: int, wall_ns: int, frames: Sequence[Any]
    ) -> list[bytes]:
        return [self._pack(self.record(conn, direction, mono_ns, wall_ns, f)) for f in frames]


def pack(record: Record) -> bytes:
    data: bytes = msgpack.packb(record, use_bin_type=True)
    return data


def packer() -> Callable[[Record], bytes]:
    """``pack`` for one thread that packs many records: one msgpack packer,
    and its buffer, reused instead of made anew for every record."""
    pack_one: Callable[[Record], bytes] = msgpack.Packer(use_bin_type=True).pack
    return pack_one


@dataclass
class ReadResult:
    """What reading a file found besides its records."""

    path: Path
    version: int = 0
    truncated_bytes: int = 0  # a partial record at the end (writer killed)
    records: int = 0
    offset: int = 0  # where the record just read starts in the file


def read_records(path: Path, result: ReadResult | None = None) -> Iterator[Record]:
    """Every record of a recording file, upgraded to the current version.

    Raises RecordingError for a file that is not a recording; a truncated
    tail is not an error (``result.truncated_bytes`` says how much).
    """
    result = result if result is not None else ReadResult(path)
    try:
        handle: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in finally
    except FileNotFoundError:
        raise Gone(f"{path}: removed while being read") from None
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None
    try:
        yield from _records(handle, path.stat().st_size, path, result)
    finally:
        handle.close()


def read_records_from(data: bytes, name: str, result: ReadResult | None = None) -> Iterator[Record]:
    """Like ``read_records``, over a file's contents (e.g. from Spark)."""
    path = Path(name)
    result = result if result is not None else ReadResult(path)
    yield from _records(io.BytesIO(data), len(data), path, result)


# What readers rely on in the records of each kind Sluice has always
# written: the keys each must have and their types (ints of 64 bits). A
# record that breaks them is damage (a flipped byte that still unpacks), to
# be said as such, not met as a KeyError in whichever command reads it.
_REQUIRED = {
    "frame": ("c", "d", "t", "w", "n"),
    "conn": ("c", "t", "w", "client", "broker", "kind", "listener"),
    "close": ("c", "t", "w"),
    "gap": ("t", "dropped"),
    "fault": ("c", "d", "t", "w", "rule", "action", "cmd"),
    "filter": ("c", "d", "t", "w", "filter", "action", "n"),
    "http": ("h", "x", "t", "w", "te", "status", "client", "method", "path", "kind"),
    "ws": ("h", "d", "t", "w", "n", "op"),
    "ws_end": ("h", "t", "w"),
}
_TYPES: dict[str, type] = {
    **dict.fromkeys(("c", "d", "t", "w", "n", "dropped", "h", "x", "te", "status"), int),
    **dict.fromkeys(("client", "broker", "kind", "listener", "rule", "action", "cmd", "filter",
                     "method", "path", "op"), str),
}  # fmt: skip
# A stored frame summary's keys readers rely on, with their types (checked
# where present; ``cmd`` always is).
_SUMMARY: dict[str, type] = {
    "cmd": str, "topic": str, "invalid": str, "why": str, "error": str, "withheld": str,
    **dict.fromkeys(("rid", "pid", "seq", "cid", "msgs"), int),
    "chunk": list, "mid": list, "payload": dict,
}  # fmt: skip
# Each kind's required keys with their types, and the optional keys readers
# take as they are, with theirs (checked where present).
_CHECKS = {kind: tuple((key, _TYPES[key]) for key in keys) for kind, keys in _REQUIRED.items()}
_OPTIONAL = (("raw", bytes), ("s", dict), ("p", list), ("invalid", str), ("why", str))
_HEADER = ("capture", "started", "payloads")  # in every header Sluice has written
# A header's keys readers rely on, with their types (checked where present).
_HEADER_TYPES = (("capture", str), ("started", int), ("payloads", str), ("protocol", str),
                 ("segment", int), ("host", str), ("listen", list), ("broker", str),
                 ("sluice", str))  # fmt: skip


def _damage(record: Any) -> str | None:
    """What is wrong with a record past the header, in words; None if nothing
    readers rely on is. (Read for every record: about a microsecond.)"""
    if type(record) is not dict:
        return "not a record"
    kind = record.get("k")
    if type(kind) is not str:
        return "a record of no kind"
    for key in ("t", "w"):  # every reader places any record in time by them
        value = record.get(key)
        if value is not None and (type(value) is not int or not -(2**63) <= value < 2**63):
            return f"a {kind} record with {key!r} of the wrong type"
    if type(record.get("w")) is int and record["w"] < 0:
        return f"a {kind} record from before 1970"
    checks = _CHECKS.get(kind)
    if checks is None:
        return None  # a kind readers skip or check themselves
    for key, want in checks:
        if key not in record:
            return f"a {kind} record without {key!r}"
        value = record[key]
        if type(value) is not want or (want is int and not -(2**63) <= cast(int, value) < 2**63):
            return f"a {kind} record with {key!r} of the wrong type"
    for key, want in _OPTIONAL:
        value = record.get(key)
        if value is not None and type(value) is not want:
            return f"a {kind} record with {key!r} of the wrong type"
    if "d" in record and kind != "gap" and record["d"] not in (0, 1):
        return f"a {kind} record of no direction"
    if kind == "filter" and (problem := _filter_damage(record)) is not None:
        return problem
    summary = record.get("s")
    if summary is not None:
        if type(summary.get("cmd")) is not str:
            return f"a {kind} record whose summary names no command"
        for key, value in summary.items():
            expected = _SUMMARY.get(key)
            if expected is not None and not isinstance(value, expected):
                return f"a {kind} record whose summary has {key!r} of the wrong type"
        payload = summary.get("payload")
        if payload is not None and type(payload.get("size")) is not int:
            return f"a {kind} record whose summary has 'payload' of the wrong shape"
        chunk = summary.get("chunk")
        if chunk is not None and (len(chunk) != 4 or not all(type(x) is int for x in chunk[1:3])):
            return f"a {kind} record whose summary has 'chunk' of the wrong shape"
    return None


# How deep a value in a record may nest: msgpack nests up to 1,024 levels,
# past Python's recursion limit (where printing or walking one ends in a
# RecursionError); no record Sluice writes comes near.
MAX_DEPTH = 100


# A frame record's keys whose values ``_damage`` then checks are scalars, and
# ``p`` (``[size]`` or ``[size, digest]``): such a record, nearly every one
# read, nests one level at most and is not walked (a walk costs about as
# much again as the rest of the check).
_FLAT_FRAME = frozenset(("k", "c", "d", "t", "w", "n", "raw", "p", "invalid", "why"))
_P_ITEMS = (int, bytes)


def _too_deep(record: Any) -> bool:
    """Whether a record holds a value nested more than ``MAX_DEPTH`` deep."""
    if type(record) is dict and record.keys() <= _FLAT_FRAME:
        p = record.get("p")
        if type(p) is not list or (0 < len(p) <= 2 and type(p[0]) is int
                                   and type(p[-1]) in _P_ITEMS):  # fmt: skip
            return False
    return _nested(record, 0)


def _nested(value: Any, depth: int) -> bool:
    """Whether a map or list holds one nested more than ``MAX_DEPTH`` below it."""
    for item in value.values() if type(value) is dict else value:
        kind = type(item)
        if (kind is dict or kind is list) and (depth >= MAX_DEPTH or _nested(item, depth + 1)):
            return True
    return False


def _filter_damage(record: Record) -> str | None:
    """What is wrong with a filter record's optional fields that readers
    take as they are: ``reason`` (text) and ``sent`` (a map: ``n``, the
    frame's size, and ``raw`` bytes and ``p`` list where present)."""
    if "reason" in record and type(record["reason"]) is not str:
        return "a filter record with 'reason' of the wrong type"
    sent = record.get("sent")
    if sent is None:
        return None
    if (
        type(sent) is not dict
        or type(sent.get("n")) is not int
        or type(sent.get("raw", b"")) is not bytes
        or type(sent.get("p", [])) is not list
    ):
        return "a filter record with 'sent' of the wrong shape"
    return None


def _undecodable(exc: Exception) -> str:
    """Why bytes decode to no record, in the recording's terms rather than
    the decoder's exception text."""
    if isinstance(exc, TypeError):
        return "a map keyed by a map"
    if isinstance(exc, UnicodeDecodeError):
        return "text that is not UTF-8"
    if isinstance(exc, msgpack.StackError):
        return "nested too deep"
    return "bytes that are no record"


def _records(handle: BinaryIO, size: int, path: Path, result: ReadResult) -> Iterator[Record]:
    unpacker = msgpack.Unpacker(
        handle, raw=False, strict_map_key=False, max_buffer_size=256 * 1024 * 1024
    )
    first = True
    upgrade: list[Callable[[Record], Record]] = []
    summaries: Any = None  # the protocol's FrameFiller, if it has one
    while True:
        result.offset = unpacker.tell()
        try:
            record = unpacker.unpack()
        except msgpack.OutOfData:
            break
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            # (TypeError: a map key that is a map, which msgpack cannot hash.)
            if _zeros_to_end(handle, result.offset, size):
                break  # what a crash can leave: read as a file cut short
            if first:
                raise RecordingError(f"{path}: not a Sluice recording") from None
            raise RecordingError(
                f"{path}: damaged after {result.records} records ({_undecodable(exc)})"
            ) from None
        if first and record == 0 and _zeros_to_end(handle, 0, size):
            break  # (said below)
        header = first or (isinstance(record, dict) and record.get("k") == "header")
        if header:
            # A header further on (files joined with cat) starts a file of
            # its own: checked, and its version and protocol read, as the first.
            if not first and record.get("format") != MAGIC:
                raise RecordingError(
                    f"{path}: damaged after {result.records} records (a header of no recording)"
                )
            upgrade = _check_header(path, record, result)
            spec = _spec_of(path, record)
            summaries = None if spec.summaries is None else spec.load(spec.summaries)()
            first = False
        elif not isinstance(record, dict):
            if _zeros_to_end(handle, result.offset, size):
                break  # what a crash can leave: read as a file cut short
            raise RecordingError(f"{path}: damaged after {result.records} records")
        if _too_deep(record):
            raise RecordingError(f"{path}: damaged after {result.records} records "
                                 f"(a value nested more than {MAX_DEPTH} deep)")  # fmt: skip
        for step in upgrade:
            record = step(record)
        if not header and (problem := _damage(record)) is not None:
            raise RecordingError(f"{path}: damaged after {result.records} records ({problem})")
        kind = record.get("k")
        if kind == "frame":
            if "s" not in record:
                if summaries is None or not isinstance(record.get("raw"), bytes):
                    raise RecordingError(
                        f"{path}: damaged after {result.records} records (a frame without summary)"
                    )
                try:
                    summaries.fill(record)
                except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                    raise RecordingError(
                        f"{path}: damaged after {result.records} records ({exc!r})"
                    ) from None
        elif summaries is not None:
            if kind == "conn":
                summaries.opened(record)
            elif kind == "close":
                summaries.closed(record)
        result.records += 1
        yield record
    if first:
        if size and _zeros_to_end(handle, 0, size):
            raise Unfinished(f"{path}: holds only zero bytes ({size}), not a readable "
                             "recording (its data never reached the disk)", size)  # fmt: skip
        if size:
            raise Unfinished(f"{path}: ends inside its header ({size} bytes), "
                             "not a readable recording", size)  # fmt: skip
        raise Unfinished(f"{path}: empty file, not a Sluice recording", 0)
    result.truncated_bytes = size - result.offset  # where the unfinished record starts


def _zeros_to_end(handle: BinaryIO, offset: int, size: int) -> bool:
    """Whether the file holds only zero bytes from ``offset`` (where a
    record starts: no record does with one) to its end. A power loss or a
    kernel crash can leave a file so, its size written back before its
    last data (Sluice does not fsync): its records before that are whole,
    and the rest is a tail cut short, not damage."""
    if offset >= size:
        return False
    handle.seek(offset)
    left = size - offset
    while left > 0:
        chunk = handle.read(min(left, 1 << 20))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        left -= len(chunk)
    return True


def _spec_of(path: Path, header: Record) -> registry.ProtocolSpec:
    """The protocol a file's header names, if this Sluice has it."""
    name = str(header.get("protocol", registry.DEFAULT_PROTOCOL))
    if name not in registry.names():
        raise RecordingError(
            f"{path}: a recording of protocol {clipped(name)}, which this Sluice does not "
            f"have (it has {', '.join(registry.names())}; a protocol's plugin adds it)"
        )
    return registry.get(name)


def record_at(path: Path, offset: int, version: int) -> Record:
    """The record at ``offset`` of a file of format ``version``
    (``ReadResult.version``), upgraded as ``read_records`` would (its
    summary is not filled in)."""
    steps = [UPGRADERS[v] for v in range(version, VERSION)]
    with open(path, "rb") as handle:
        handle.seek(offset)
        unpacker = msgpack.Unpacker(handle, raw=False, strict_map_key=False,
                                    max_buffer_size=256 * 1024 * 1024)  # fmt: skip
        record: Record = unpacker.unpack()
    for step in steps:
        record = step(record)
    return record


def _check_header(path: Path, record: Any, result: ReadResult) -> list[Callable[[Record], Record]]:
    if not isinstance(record, dict) or record.get("format") != MAGIC:
        raise RecordingError(f"{path}: not a Sluice recording")
    version = record.get("version")
    if not isinstance(version, int):
        raise RecordingError(f"{path}: recording header has no version")
    if record.get("k") != "header":  # (as every header Sluice has written says)
        raise RecordingError(f"{path}: damaged header ('k')")
    for key, want in _HEADER_TYPES:
        missing = key in _HEADER and key not in record
        if missing or (key in record and type(record[key]) is not want):
            raise RecordingError(f"{path}: damaged header ({key!r})")
    if not all(type(address) is str for address in record.get("listen", ())):
        raise RecordingError(f"{path}: damaged header ('listen')")
    if not all(-(2**63) <= record[key] < 2**63 for key in ("started", "segment") if key in record):
        raise RecordingError(f"{path}: damaged header (a number out of range)")
    if version > VERSION:
        raise RecordingError(
            f"{path}: recording format {version} is newer than this Sluice reads "
            f"({VERSION}); upgrade Sluice"
        )
    steps = []
    for v in range(version, VERSION):
        if v not in UPGRADERS:
            raise RecordingError(f"{path}: no upgrade from recording format {v}")
        steps.append(UPGRADERS[v])
    result.version = version
    return steps


def recordings_below(
    directory: Path, onerror: Callable[[OSError], None] | None = None
) -> Iterator[Path]:
    """The recording files in ``directory`` and below (none if it is gone).
    With os.walk, not rglob: a directory removed meanwhile (retention
    removes emptied snapshot directories) is skipped, not an error; so is
    one that cannot be listed, unless ``onerror`` (os.walk's) raises."""
    for root, _, names in os.walk(directory, onerror=onerror):
        for name in names:
            if name.endswith(SUFFIX):
                yield Path(root, name)


def denied(exc: OSError, target: Path) -> RecordingError:
    """A file or directory this user may not read, said so."""
    return RecordingError(f"{exc.filename or target}: cannot be read (permission denied)")


def _refuse_unreadable(exc: OSError) -> None:
    """os.walk's ``onerror`` for readers: a folder that cannot be listed
    stops the listing (a capture read without it would be taken for the
    whole); one removed meanwhile is passed over."""
    if isinstance(exc, PermissionError):
        raise exc


def recording_files(target: Path) -> list[Path]:
    """A file, or every recording in a directory (recursively), in name
    order. A directory in it that this user may not list is a
    RecordingError naming it: what its files hold would be missing."""
    if target.is_dir():
        try:
            return sorted(p for p in recordings_below(target, _refuse_unreadable) if p.is_file())
        except PermissionError as exc:
            raise denied(exc, target) from None
    if not target.exists():
        raise RecordingError(f"{target}: no such file or directory")
    return [target]


def dumps(records: list[Record]) -> bytes:
    """Serialize records (tests and tools that write recordings whole)."""
    out = io.BytesIO()
    for record in records:
        out.write(pack(record))
    return out.getvalue()


def protocol_of(target: Path) -> str:
    """The protocol of the recording(s) at ``target``, from their headers;
    RecordingError when they name more than one."""
    found: dict[str, Path] = {}
    paths = recording_files(target)
    for path in paths:
        try:
            for record in read_records(path, ReadResult(path)):
                if record["k"] == "header":
                    found.setdefault(str(record.get("protocol", registry.DEFAULT_PROTOCOL)), path)
                break
        except (Unfinished, Gone):
            if len(paths) == 1:
                raise
    if len(found) > 1:
        named = ", ".join(f"{name} ({path})" for name, path in sorted(found.items()))
        raise RecordingError(
            f"{target}: recordings of more than one protocol: {named}; "
            "give the files of one protocol at a time"
        )
    return next(iter(found), registry.DEFAULT_PROTOCOL)
