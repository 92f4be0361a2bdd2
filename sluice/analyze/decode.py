"""Executor side of ``sluice analyze``: whole segments to Arrow record batches.

Spark hands ``binaryFile`` rows (path, content) to :func:`decode_batches`
through ``mapInArrow``; each segment is read with the recording format's own
reader (``read_records_from``: header check, upgraders, truncated tails) and
comes back as one columnar batch of frames plus a few rows for its
connections, closes and the segment itself. Rows never exist as Python
objects on the way to the JVM.

Every output row has the columns of :data:`SCHEMA`; ``record`` says what it
is: ``frame``, ``conn`` (opened at ``wall_ns``), ``close`` (closed at
``wall_ns``), ``segment`` (one per input file, also for a damaged one),
``http`` (one of the HTTP listener's exchanges, begun at ``wall_ns``; ``conn``
is its HTTP connection, the columns of :data:`HTTP_SCHEMA` in ``extra``) or
``ws`` (a segment's WebSocket frames of one HTTP connection, counted) or
``filter`` (a message filter acted: ``command`` is what it did, ``error``
why, ``messages`` how many, the filter's name in ``extra``).
The few rows that are not frames keep what only they have as a JSON object
in ``extra`` (the columns of :data:`EXTRA_SCHEMA`: for a segment, ``damaged``
and ``why`` say what was wrong, ``dropped_frames`` what its gap records say
the recorder could not write), so that the millions of frame rows do not
carry a dozen always-empty columns through Spark: narrow rows cross from
Arrow into the JVM several times faster.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from sluice.protocols import registry
from sluice.recording.format import (
    CLIENT_TO_BROKER,
    ReadResult,
    RecordingError,
    read_records,
    read_records_from,
)
from sluice.recording.reader import Repeats, in_capture_order

DIRECTIONS = ("client_to_broker", "broker_to_client")  # by the format's `d`
# Frames whose `msgs` counts messages, whatever their protocol.
COUNTED = registry.message_commands()

_FIELDS: list[tuple[str, pa.DataType]] = [
    ("record", pa.string()),
    ("capture", pa.string()),
    ("file", pa.string()),
    ("conn", pa.int64()),
    ("direction", pa.string()),
    ("mono_ns", pa.int64()),
    ("wall_ns", pa.int64()),
    ("command", pa.string()),
    ("size", pa.int64()),
    ("request_id", pa.int64()),
    ("producer_id", pa.int64()),
    ("sequence_id", pa.int64()),
    ("consumer_id", pa.int64()),
    ("topic", pa.string()),
    ("messages", pa.int64()),
    ("invalid", pa.string()),
    ("error", pa.string()),
    ("extra", pa.string()),  # JSON, on rows that are not frames
]
SCHEMA = pa.schema(_FIELDS)
_SPARK_TYPES = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean"}


def spark_schema(fields: list[tuple[str, pa.DataType]]) -> str:
    """Arrow fields as the DDL string ``mapInArrow`` takes."""
    return ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind in fields)


SPARK_SCHEMA = spark_schema(_FIELDS)
FRAME_COLUMNS = [name for name, _ in _FIELDS[1:-1]]
EXTRA_SCHEMA = (
    "protocol string, client string, broker string, kind string, listener string, "
    "reason string, segment bigint, version bigint, records bigint, frames bigint, "
    "bytes bigint, truncated_bytes bigint, dropped_frames bigint, damaged boolean, why string"
)
# The ``extra`` of ``http`` rows (and, ``frames`` and ``bytes``, of ``ws`` rows).
HTTP_SCHEMA = (
    "client string, method string, path string, kind string, status bigint, seconds double, "
    "answer_seconds double, request_bytes bigint, response_bytes bigint, redirects bigint, "
    "refused string, ended string, redacted boolean, frames bigint, bytes bigint"
)
# The columns of an exchange (the ``http`` table's, with its keys and counts).
HTTP_COLUMNS = [c.split()[0] for c in HTTP_SCHEMA.split(", ")][:-2]


def _http_extra(record: dict[str, Any]) -> dict[str, Any]:
    """An ``http`` record's columns (HTTP_SCHEMA)."""
    t = record["t"]
    return {
        "client": record.get("client"),
        "method": record.get("method"),
        "path": record.get("path"),
        "kind": record.get("kind"),
        "status": record.get("status"),
        "seconds": (record["te"] - t) / 1e9 if "te" in record else None,
        "answer_seconds": (record["ta"] - t) / 1e9 if "ta" in record else None,
        "request_bytes": record.get("req", {}).get("n"),
        "response_bytes": record.get("res", {}).get("n"),
        "redirects": len(record.get("hops", ())),
        "refused": record.get("refused"),
        "ended": record.get("ended"),
        "redacted": bool(record.get("redacted")),
    }


# A scheme and a slash: ``s3a://b/k``, ``hdfs://nn/x``, ``hdfs:/x``, ``gs://``,
# ``abfs://``. A colon anywhere else is part of a local name (``run-12:30``).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")


def is_url(path: str) -> bool:
    """Whether a PATH is a URL (``scheme:/…``, or ``file:`` anything), not a
    local path: ``run-12:30`` and ``backup:2025`` are local names."""
    return path.startswith("file:") or _URL.match(path) is not None


def local_path(url: str) -> str | None:
    """The local path of a ``file:`` path (``file:/x`` as Hadoop spells a
    listed file, ``file:///x`` or ``file://host/x`` as people write it) or of
    a plain path (a colon in it or not); None for any other scheme.

    Taken as it is, never URL-decoded: Spark (Hadoop's ``Path``) takes
    ``%``, ``#`` and spaces in such a path literally, and so must the
    executors, or they open another file than the one Spark listed."""
    if url.startswith("file:"):
        rest = url[len("file:") :]
        if rest.startswith("//"):  # an authority (empty, or a host: this machine)
            return "/" + rest[2:].partition("/")[2]
        return rest
    return None if is_url(url) else url


def segments(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[str, Any]]:
    """Spark's ``binaryFile`` batches as (path, bytes): the ``content`` column
    where Spark read the files, or each ``file:`` path read here."""
    for batch in batches:
        paths = batch.column("path").to_pylist()
        contents = batch.column("content") if "content" in batch.schema.names else None
        for i, path in enumerate(paths):
            if contents is None:
                local = local_path(path)
                if local is None:  # the job reads only local listings itself
                    raise ValueError(f"{path}: not a local file")
                try:
                    yield path, Path(local).read_bytes()
                except OSError as exc:  # gone since the listing (pruned), unreadable
                    yield path, Unreadable(f"{path}: not readable ({exc.strerror or exc})")
                continue
            content = contents[i].as_buffer()
            yield path, b"" if content is None else content


class Unreadable(bytes):
    """A listed segment that could not be read (no bytes), and why."""

    why: str

    def __new__(cls, why: str) -> Unreadable:
        unread = super().__new__(cls, b"")
        unread.why = why
        return unread


# Every file the job reads, as listed, where the executors read them
# themselves (local paths; set by the job on each executor, ``read_among``):
# a flight-recorder snapshot passes over the records that an earlier file of
# its capture among them held (overlapping snapshots hold the same ones).
# Empty where Spark hands the executors the contents: each read whole.
_LISTED: tuple[str, ...] = ()
# What this process learnt of those files, so that each is read once for
# it, not once for every later snapshot of its capture (N snapshots were
# N²/2 reads): each capture's files in capture order (``in_capture_order``
# reads each one's head), and the ``Repeats`` having read the first j of
# them, for each j found so far (forgotten with another listing).
_ORDERS: dict[str, tuple[list[Path], dict[Path, str]]] = {}
_HELD: dict[str, dict[int, Repeats]] = {}


def read_among(listed: Iterable[str]) -> None:
    """The files the job reads (their listed paths, all local)."""
    global _LISTED
    listed = tuple(listed)
    if listed != _LISTED:
        _LISTED = listed
        _ORDERS.clear()
        _HELD.clear()


def _in_order(capture: str) -> tuple[list[Path], dict[Path, str]]:
    """The local files of ``capture`` among those the job reads, in capture
    order, and each one's listed path (worked out once)."""
    if capture not in _ORDERS:
        # (by name first: a file of another capture is not read)
        named = {Path(local): listed for listed in _LISTED
                 if (local := local_path(listed)) is not None
                 and f"-{capture}-" in Path(local).name}  # fmt: skip
        _ORDERS[capture] = (in_capture_order(sorted(named)), named)
    return _ORDERS[capture]


def _held_before(path: str, header: dict[str, Any]) -> Repeats | None:
    """A ``Repeats`` that has read the files of the capture ``header``
    names written before ``path`` (``in_capture_order``) among those the
    job reads, and then ``header``; None where there are none. Each is read
    up to its first record that is no restated connection, unless it is a
    snapshot (no other file repeats records); once in this process, however
    many later snapshots need it."""
    capture = str(header.get("capture", ""))
    if not capture or path not in _LISTED:
        return None
    ordered, named = _in_order(capture)
    at = next((i for i, file in enumerate(ordered) if named[file] == path), 0)
    if not at:
        return None
    known = _HELD.setdefault(capture, {0: Repeats()})
    read = max(j for j in known if j <= at)  # the most of the files before it read so far
    repeats = copy.deepcopy(known[read])
    for j in range(read, at):
        _read_held(ordered[j], repeats)
        known[j + 1] = copy.deepcopy(repeats)
    repeats.repeated(header)
    return repeats


def _read_held(file: Path, repeats: Repeats) -> None:
    """``file``'s records given to ``repeats``: up to its first record that
    is no restated connection, unless it is a snapshot."""
    snapshot = False
    try:
        for record in read_records(file):
            kind = record.get("k")
            if not snapshot and kind not in ("header", "conn", "snapshot"):
                break  # no snapshot: none of its records is repeated
            snapshot = snapshot or kind == "snapshot"
            repeats.repeated(record)
    except (RecordingError, OSError):
        pass  # what it held up to there (as its own decoding reads it)


def decode_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: batches of (path, length, content) to decoded batches."""
    for path, content in segments(batches):
        yield from decode_segment(path, content)


def decode_segment(path: str, content: Any) -> Iterator[pa.RecordBatch]:
    """One segment's frames (one batch), then its conn, close and segment rows."""
    frames: list[tuple[Any, ...]] = []
    add = frames.append
    others: list[dict[str, Any]] = []
    segment: dict[str, Any] = {"bytes": len(content)}
    result = ReadResult(Path(path))
    capture = protocol = ""
    websocket: dict[int, list[int]] = {}  # HTTP connection -> [frames, bytes, first wall_ns]
    dropped = 0  # frames the recorder could not write (gap records)
    header: dict[str, Any] = {}
    repeats: Repeats | None = None  # a snapshot's: what earlier files of its capture held
    repeated = 0  # records passed over: an earlier file held them
    numbered_from: int | None = None  # records read up to a snapshot's numbered ones

    def other(name: str, record: dict[str, Any], **extra: Any) -> None:
        side({"record": name, "capture": capture, "file": path, "conn": record["c"],
              "wall_ns": record["w"], "mono_ns": record["t"],
              "extra": json.dumps(extra)}, _FROM_RECORD)  # fmt: skip

    def side(row: dict[str, Any], checked: tuple[tuple[str, _Check], ...]) -> None:
        """A row that is not a frame, the values it took from its record
        checked: one of the wrong type is the segment's damage here, not a
        failed job later."""
        for name, fits in checked:
            if not fits(row[name]):
                key = _KEYS.get((row["record"], name), name)
                raise _Damaged(f"a {row['record']} record with {key!r} of the wrong type")
        others.append(row)

    unread = isinstance(content, Unreadable)
    if unread:
        segment["why"] = content.why
    try:
        for record in () if unread else read_records_from(content, path, result):
            if repeats is not None and repeats.repeated(record):
                repeated += 1
                continue
            kind = record["k"]
            if kind == "frame":
                s = record["s"]
                command = s.get("cmd")
                add(
                    (
                        record["c"],
                        record["d"] != CLIENT_TO_BROKER,
                        record["t"],
                        record["w"],
                        command,
                        record["n"],
                        s.get("rid"),
                        s.get("pid"),
                        s.get("seq"),
                        s.get("cid"),
                        s.get("topic"),
                        int(s.get("msgs", 1)) if command in COUNTED else 0,
                        s.get("invalid"),
                        s.get("error"),
                    )
                )
            elif kind == "header":
                for key, fits in (("capture", _is_string), ("segment", _is_int64)):
                    if not fits(record.get(key)):  # capture: on every row, unchecked there
                        raise _Damaged(f"a header with {key!r} of the wrong type")
                capture = record["capture"]
                protocol = record.get("protocol", "")
                segment.update(protocol=protocol, segment=record.get("segment"))
                header = record
            elif kind == "snapshot":
                ring = record.get("ring")
                if isinstance(ring, int) and not isinstance(ring, bool):
                    # Numbered from here: what it holds of the ring is known.
                    segment["ring"] = ring
                    numbered_from = result.records
                    repeats = _held_before(path, header) if repeats is None else repeats
                    if repeats is not None:
                        repeats.repeated(record)
            elif kind == "conn":
                other("conn", record, protocol=protocol, client=record["client"],
                      broker=record["broker"], kind=record["kind"],
                      listener=record["listener"])  # fmt: skip
            elif kind == "close":
                other("close", record, reason=record.get("reason", ""))
            elif kind == "http":
                side({"record": "http", "capture": capture, "file": path, "conn": record["h"],
                      "wall_ns": record["w"], "mono_ns": record["t"],
                      "extra": json.dumps(_http_extra(record))}, _FROM_RECORD)  # fmt: skip
            elif kind == "filter":  # a message filter acted: its action and reason as columns
                side({"record": "filter", "capture": capture, "file": path, "conn": record["c"],
                      "wall_ns": record["w"], "mono_ns": record["t"],
                      "direction": DIRECTIONS[record["d"]], "topic": record.get("topic"),
                      "command": record["action"], "error": record.get("reason"),
                      "messages": record.get("n", 1),
                      "extra": json.dumps({"filter": record["filter"]})},
                     _FROM_FILTER)  # fmt: skip
            elif kind == "gap":  # the recorder's writer fell behind: frames not recorded
                # A count, summed into a bigint column: one below zero, or a
                # sum past 2**63, is a damaged record, not a column Spark
                # cannot read (null, or a failed cast) or a negative count.
                if record["dropped"] < 0 or dropped + record["dropped"] >= 2**63:
                    raise _Damaged("a gap record with 'dropped' out of range")
                dropped += record["dropped"]
            elif kind == "ws":
                counted = websocket.setdefault(record["h"], [0, 0, record["w"]])
                counted[0] += 1
                counted[1] += record["n"]
    except RecordingError as exc:
        segment["why"] = str(exc)
    except _Damaged as exc:
        segment["why"] = f"{path}: damaged after {result.records} records ({exc})"
    except Exception as exc:  # a record that reads but is not what the format says
        segment["why"] = f"{path}: damaged after {result.records} records ({exc!r})"
    batch = None
    if frames:
        # Built at once (fast); a value of the wrong type that the reader let
        # through ends the segment's frames there, as damage.
        try:
            batch = _frame_batch(capture, path, frames)
        except Exception:
            at, problem = _first_bad_frame(capture, path, frames)
            segment["why"] = f"{path}: damaged at frame {at + 1} ({problem})"
            del frames[at:]
            batch = _frame_batch(capture, path, frames) if frames else None
    for conn, (n, size, first) in websocket.items():
        extra = json.dumps({"frames": n, "bytes": size})
        others.append({"record": "ws", "capture": capture, "file": path, "conn": conn,
                       "wall_ns": first, "extra": extra})  # fmt: skip
    if numbered_from is not None:  # a snapshot: how many of the ring's records it holds
        segment.update(ring_records=result.records - numbered_from, repeated=repeated)
    segment.update(
        version=result.version,
        records=result.records,
        frames=len(frames),
        truncated_bytes=result.truncated_bytes,
        dropped_frames=dropped,
        damaged="why" in segment,
    )
    if batch is not None:
        yield batch
    last = {"record": "segment", "capture": capture or None, "file": path,
            "extra": json.dumps(segment)}  # fmt: skip
    yield pa.RecordBatch.from_pylist([*others, last], schema=SCHEMA)


class _Damaged(ValueError):
    """A record the format's reader let through with a value that does not fit its column."""


# A side row's column and the record's key it comes from, where they differ.
_KEYS = {("filter", "error"): "reason", ("filter", "command"): "action",
         ("filter", "messages"): "n"}  # fmt: skip
# A frame row's values (``decode_segment``), by the record's keys, and their Arrow types.
_FRAME_VALUES = (("c", pa.int64()), ("d", pa.bool_()), ("t", pa.int64()), ("w", pa.int64()),
                 ("cmd", pa.string()), ("n", pa.int64()), ("rid", pa.uint64()),
                 ("pid", pa.uint64()), ("seq", pa.uint64()), ("cid", pa.uint64()),
                 ("topic", pa.string()), ("msgs", pa.int64()), ("invalid", pa.string()),
                 ("error", pa.string()))  # fmt: skip


_Check = Callable[[Any], bool]


def _is_string(value: Any) -> bool:
    return value is None or type(value) is str


def _is_int64(value: Any) -> bool:
    return value is None or (type(value) is int and -(2**63) <= value < 2**63)


def _is_uint64(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value < 2**64)


def _is_bool(value: Any) -> bool:
    return value is None or type(value) is bool


# Whether a value goes into a column of an Arrow type (None does), and into
# each column of SCHEMA: worked out once, not per value (side rows can be
# half a segment's records: one conn and one close per short connection).
_FITS: dict[pa.DataType, _Check] = {pa.string(): _is_string, pa.int64(): _is_int64,
                                   pa.uint64(): _is_uint64, pa.bool_(): _is_bool}  # fmt: skip
_CHECKS = {name: _FITS[kind] for name, kind in _FIELDS}
# The columns of a side row that come from its record (``record``, ``file``
# and ``extra`` are made here, ``direction`` is one of DIRECTIONS, the
# header's ``capture`` is checked once).
_FROM_RECORD = tuple((name, _CHECKS[name]) for name in ("conn", "wall_ns", "mono_ns"))
_FROM_FILTER = _FROM_RECORD + tuple(
    (name, _CHECKS[name]) for name in ("topic", "command", "error", "messages")
)


def _fits(value: Any, kind: pa.DataType) -> bool:
    """Whether ``value`` goes into a column of ``kind`` (None does)."""
    return _FITS[kind](value)


def _first_bad_frame(capture: str, path: str, rows: list[tuple[Any, ...]]) -> tuple[int, str]:
    """Where the first frame that does not build into a batch is, and what is wrong with it."""
    step = 4096
    for start in range(0, len(rows), step):
        try:
            _frame_batch(capture, path, rows[start : start + step])
            continue
        except Exception:
            pass
        for at in range(start, min(start + step, len(rows))):
            for (key, kind), value in zip(_FRAME_VALUES, rows[at], strict=True):
                if not _fits(value, kind):
                    return at, f"a frame record with {key!r} of the wrong type"
            try:
                _frame_batch(capture, path, rows[at : at + 1])
            except Exception as exc:
                return at, f"a frame record that does not fit a row: {exc}"
    return len(rows), "a frame batch that does not build"


def _frame_batch(capture: str, path: str, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    count = len(rows)
    (
        conn,
        outbound,
        mono,
        wall,
        command,
        size,
        rid,
        pid,
        seq,
        cid,
        topic,
        messages,
        invalid,
        error,
    ) = zip(*rows, strict=True)
    columns: dict[str, pa.Array] = {
        "record": pa.repeat(pa.scalar("frame"), count),
        "capture": pa.repeat(pa.scalar(capture), count),
        "file": pa.repeat(pa.scalar(path), count),
        "conn": pa.array(conn, pa.int64()),
        "direction": pa.array(DIRECTIONS).take(pa.array(outbound, pa.bool_()).cast(pa.int8())),
        "mono_ns": pa.array(mono, pa.int64()),
        "wall_ns": pa.array(wall, pa.int64()),
        "command": pa.array(command, pa.string()),
        "size": pa.array(size, pa.int64()),
        "topic": pa.array(topic, pa.string()),
        "messages": pa.array(messages, pa.int64()),
        "invalid": pa.array(invalid, pa.string()),
        "error": pa.array(error, pa.string()),
    }
    # uint64 ids as Spark longs: the all-ones "no request" id becomes -1.
    for name, values in (("request_id", rid), ("producer_id", pid), ("sequence_id", seq),
                         ("consumer_id", cid)):  # fmt: skip
        columns[name] = pa.array(values, pa.uint64()).cast(pa.int64(), safe=False)
    arrays = [columns[name] if name in columns else pa.nulls(count, kind) for name, kind in _FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


_TAGS = {"frame": "F", "conn": "C", "close": "X", "segment": "S", "http": "H", "ws": "W"}


def parse_file(path: str, content: bytes) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """A segment's rows as plain tuples, without Spark (tests, tools).

    ``("F", values)`` per frame, in :data:`FRAME_COLUMNS` order; ``("C" | "X" |
    "S" | "H" | "W", (capture, file, conn, wall_ns, extra))`` for connection,
    close, segment, HTTP exchange and WebSocket rows, ``extra`` decoded. The
    same rows the executors produce.
    """
    for batch in decode_segment(path, content):
        for row in batch.to_pylist():
            if row["record"] == "frame":
                yield "F", tuple(row[name] for name in FRAME_COLUMNS)
            else:
                yield _TAGS[row["record"]], (row["capture"], row["file"], row["conn"],
                                             row["wall_ns"], json.loads(row["extra"]))  # fmt: skip
