"""What ``sluice view`` knows of a capture: a compact index of its frames,
built in a thread while the page is already served.

One row per frame, column by column in typed arrays (a million frames take
tens of megabytes, not a gigabyte of dicts): connection, direction, time,
command, topic, size, what is wrong with it, the request it answers and how
long that took, and where its record is (file and offset) so that the
detail is read back only when asked for. Commands, topics and errors are
interned. Filters and pages are answered from the arrays; only the frames
of a page become dicts.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.protocols import registry
from sluice.recording.format import (
    Gone,
    ReadResult,
    RecordingError,
    Unfinished,
    read_records,
    record_at,
)
from sluice.recording.reader import Repeats, holds_nothing, in_capture_order, listed

log = logging.getLogger("sluice.view")

# What can be wrong with a frame, as bits of its flags.
INVALID, ERROR, FAULT, GAP_BEFORE, REDACTED, FILTERED = 1, 2, 4, 8, 16, 32
PROBLEMS = INVALID | ERROR | FAULT | GAP_BEFORE
# Request/answer pairs: which id fields pair a frame with its answer.
_PAIR_KEYS = ("rid", "seq")
# The commands that carry messages (counted in the rates plot).
_MESSAGES = ("SEND", "MESSAGE")
# At most this many frames in a sequence diagram, and topics in the rates plot.
SEQUENCE_LIMIT = 400
# A time filter's bound, in seconds: its nanoseconds are a 64-bit integer.
MAX_SECONDS = 9e9
RATE_TOPICS = 8
RATE_BINS = 60
# At most this many connections in the page's table (of a capture: the
# first; of a live view: the newest), and lanes in the timeline: a capture
# of 100,000 connections (a day of lookups) drew a lane and a row for each,
# and the page took minutes to show.
CONNECTIONS_SHOWN = 500
TIMELINE_LANES = 200
# Latency histogram buckets, in seconds (upper bounds).
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


# The index's columns, one value per frame (``Index.__post_init__``).
COLUMNS = ("conn", "direction", "t", "cmd", "topic", "size", "flags", "msgs", "error_id", "pid",
           "cid", "pair", "latency", "file", "offset")  # fmt: skip


class LetGo(LookupError):
    """A frame asked for by an id that a live view has let go."""


class Interned:
    def __init__(self) -> None:
        self.names: list[str] = [""]
        self._ids: dict[str, int] = {"": 0}

    def id(self, name: str | None) -> int:
        if not name:
            return 0
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass
class Connection:
    index: int  # its id: never another's, also once a live view has let it go
    capture: str
    conn: int
    kind: str = ""
    client: str = ""
    via: str = ""  # the balancer whose PROXY header named the client
    broker: str = ""
    protocol: str = registry.DEFAULT_PROTOCOL
    start_ns: int = 0
    end_ns: int = 0
    frames: int = 0
    problems: int = 0
    closed: str = ""

    def to_json(self, origin: int) -> dict[str, Any]:
        return {
            "id": self.index,
            "name": f"c{self.conn}",
            "capture": self.capture,
            "kind": self.kind,
            "client": self.client,
            "via": self.via,
            "broker": self.broker,
            "protocol": self.protocol,
            "start": (self.start_ns - origin) / 1e9,
            "duration": max(0, self.end_ns - self.start_ns) / 1e9,
            "frames": self.frames,
            "problems": self.problems,
            "closed": self.closed,
        }


@dataclass
class Note:
    """Something that is not a frame: a gap, a fault, a trigger, a snapshot."""

    kind: str
    t: float
    connection: int | None
    text: str


@dataclass
class Exchange:
    """One of the HTTP listener's exchanges (an ``http`` record), with the
    WebSocket frames of the session that followed it, if any."""

    i: int
    capture: str
    conn: int  # the HTTP connection (``h``)
    t: float  # seconds from the capture's origin
    client: str
    method: str
    path: str
    status: int
    kind: str
    seconds: float  # request read to answer ended
    request_bytes: int
    response_bytes: int
    redirects: int
    refused: str
    ended: str
    redacted: bool

    def to_json(self, frames: int, session: str) -> dict[str, Any]:
        return {**vars(self), "frames": frames, "session": session}


@dataclass
class HttpFilter:
    """Exchanges whose path holds ``path`` and whose status is ``status``
    (``404``, or a class: ``4xx``)."""

    path: str = ""
    status: str = ""
    kind: str = ""

    @classmethod
    def from_query(cls, query: dict[str, str]) -> HttpFilter:
        status = query.get("status", "").strip().lower()
        if status and not (
            status.isdigit() or (len(status) == 3 and status[0].isdigit() and status[1:] == "xx")
        ):
            raise ValueError(f"status must be a code (404) or a class (4xx), not {status!r}")
        return cls(query.get("path", "").strip(), status, query.get("kind", "").strip())

    def keep(self, e: Exchange) -> bool:
        if self.path and self.path not in e.path:
            return False
        if self.kind and e.kind != self.kind:
            return False
        if self.status.endswith("xx"):
            return e.status // 100 == int(self.status[0])
        return not self.status or e.status == int(self.status)


@dataclass
class Filter:
    cmd: str = ""
    topic: str = ""
    producer: int | None = None
    consumer: int | None = None
    connection: int | None = None
    start: float | None = None  # seconds from the capture's start
    end: float | None = None
    problems: bool = False

    @classmethod
    def from_query(cls, query: dict[str, str]) -> Filter:
        def number(key: str) -> float | None:
            text = query.get(key, "").strip()
            if not text:
                return None
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{key} must be a number, not {text!r}") from None
            if not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, not {text!r}")
            return value

        def seconds(key: str) -> float | None:
            value = number(key)
            # (matched in nanoseconds, as the 64-bit integers frame times are)
            if value is not None and not -MAX_SECONDS <= value <= MAX_SECONDS:
                text = query[key].strip()
                raise ValueError(f"{key} must be seconds between -9e9 and 9e9, not {text!r}")
            return value

        def whole(key: str) -> int | None:
            value = number(key)
            return None if value is None else int(value)

        return cls(
            cmd=query.get("cmd", "").strip().upper(),
            topic=query.get("topic", "").strip(),
            producer=whole("producer"),
            consumer=whole("consumer"),
            connection=whole("conn"),
            start=seconds("from"),
            end=seconds("to"),
            problems=query.get("problems", "") in ("1", "true", "yes", "on"),
        )

    @property
    def empty(self) -> bool:
        return self == Filter()


def _size(path: Path) -> int:
    """A file's size; 0 for one removed since listed (reading it says so)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _skipped(path: Path, exc: Unfinished | Gone) -> str:
    """What the page says of a segment skipped among others."""
    if isinstance(exc, Gone):
        return f"{path.name}: removed while being read (retention), skipped"
    if exc.size == 0:
        return f"{path.name}: empty (the writer stopped before its first flush)"
    return (
        f"{path.name}: cut inside its header ({exc.size} bytes; "
        "the writer stopped during its first flush)"
    )


@dataclass
class Reading:
    """Where reading one file (or one live stream) has got to: its number,
    its capture, its connections by id, the requests waiting for answers,
    whether a gap comes before the next frame."""

    number: int
    capture: str = ""
    by_key: dict[int, Connection] = field(default_factory=dict)
    waiting: dict[tuple[int, str, int, int], int] = field(default_factory=dict)
    gap: bool = False


@dataclass
class Index:
    """A capture's frames, growing while ``building``."""

    target: Path
    files: list[Path] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    # Each file's header ``decoding`` (what its frames decode with: a Cursus
    # broker's compression), for the frame detail.
    decodings: list[Mapping[str, Any] | None] = field(default_factory=list)
    protocol: str = registry.DEFAULT_PROTOCOL
    payloads: str = ""
    origin_ns: int = 0  # the first record's monotonic time
    origin_wall_ns: int = 0
    connections: list[Connection] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    # The HTTP listener's exchanges, and the WebSocket frames and endings of
    # the sessions after them, by (capture, HTTP connection).
    exchanges: list[Exchange] = field(default_factory=list)
    ws_frames: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    ws_ended: dict[tuple[str, int], str] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    problems_found: list[str] = field(default_factory=list)
    building: bool = True
    error: str = ""
    read_bytes: int = 0
    total_bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    built_in: float = 0.0
    # Called once everything is read, before ``building`` turns False.
    on_built: Callable[[Index], None] | None = None

    def __post_init__(self) -> None:
        self.commands = Interned()
        self.topics = Interned()
        self.errors = Interned()
        self.conn = array("I")
        self.direction = array("B")  # 0 client to broker, 1 broker to client
        self.t = array("q")  # ns from origin
        # (names the wire chose, a Cursus client's commands, a broker's
        # error codes: more than 16 bits can number)
        self.cmd = array("I")
        self.topic = array("I")
        self.size = array("I")
        self.flags = array("B")
        self.msgs = array("H")  # messages a SEND or MESSAGE carries (a batch's count)
        self.error_id = array("I")
        self.pid = array("q")  # producer id, -1 none
        self.cid = array("q")  # consumer id, -1 none
        self.pair = array("q")  # the frame it answers or is answered by, -1 none
        self.latency = array("f")  # seconds, for answers; 0 otherwise
        self.file = array("H")
        self.offset = array("Q")
        # Held by whoever changes the columns, and by every question asked
        # of them (a live view's are changed while the page asks).
        self.lock = threading.RLock()
        # Frames let go before the first held (a live view's): a frame's id
        # is this plus its position, the same for as long as it is held.
        self.base = 0
        self.by_id: dict[int, Connection] = {}  # ``connections`` by id (the ``conn`` column)
        self._next_connection = 0
        self._selections: dict[tuple[Any, ...], array[int]] = {}
        self._summary: dict[str, Any] | None = None
        self._timelines: dict[tuple[Any, ...], dict[str, Any]] = {}

    @property
    def frames(self) -> int:
        return len(self.t)

    # --- building ------------------------------------------------------------

    def build(self) -> None:
        """Read every file (in a thread: the server answers meanwhile)."""
        try:
            # Each capture's files in the order written, and what a
            # flight-recorder snapshot repeats of an earlier one's left out.
            self.files = in_capture_order(listed(self.target))
            if not self.files:
                raise RecordingError(f"{self.target}: no recordings (*.sluice) here")
            sizes = [_size(p) for p in self.files]
            self.total_bytes = sum(sizes)
            skipped: list[Unfinished | Gone] = []
            repeats = Repeats()
            for number, path in enumerate(self.files):
                problem = self._read(number, path, sum(sizes[:number]), repeats)
                if problem is not None:
                    skipped.append(problem)
            if len(skipped) == len(self.files):  # (a lone one is refused as it is read)
                raise holds_nothing(self.target, skipped)
        except RecordingError as exc:
            self.error = str(exc)
        except OSError as exc:
            self.error = f"{exc.filename or self.target}: {exc.strerror or exc}"
        finally:
            self._in_time_order()
            self.built_in = time.monotonic() - self.started
            if self.on_built is not None:
                self.on_built(self)
            self.building = False

    def _in_time_order(self) -> None:
        """Several writers' files over the same time (``--workers``) are read
        one after another: their frames, put in time order (a stable sort,
        each file's own order kept), and the origin moved to the earliest."""
        t = self.t
        if all(t[i] <= t[i + 1] for i in range(len(t) - 1)) and (not t or t[0] >= 0):
            return
        order = sorted(range(len(t)), key=t.__getitem__)
        where = array("q", bytes(8 * len(order)))
        for new, old in enumerate(order):
            where[old] = new
        shift = min(0, t[order[0]])
        with self.lock:
            for name in COLUMNS:
                column = getattr(self, name)
                setattr(self, name, array(column.typecode, (column[i] for i in order)))
            self.pair = array("q", (where[p] if p >= 0 else -1 for p in self.pair))
            if shift:
                self.t = array("q", (v - shift for v in self.t))
                self.origin_ns += shift
                self.origin_wall_ns += shift
                for note in self.notes:
                    note.t -= shift / 1e9
                for exchange in self.exchanges:
                    exchange.t -= shift / 1e9
            self._selections.clear()
            self._timelines.clear()

    def _read(
        self, number: int, path: Path, before: int, repeats: Repeats
    ) -> Unfinished | Gone | None:
        """One file's records; ``before``: the bytes of the files read before it;
        ``repeats``: what the files read before held (records an earlier
        snapshot of the same capture held are passed over).
        Returns why it was skipped, if it was (among others: no whole record
        in it, or removed since listed)."""
        result = ReadResult(path)
        reading = Reading(number)
        self.versions.append(0)
        self.decodings.append(None)
        records = read_records(path, result)
        try:
            first = next(records, None)  # what makes a file unreadable as a whole is met here
        except (Unfinished, Gone) as exc:
            if len(self.files) == 1:  # alone, it holds no recording: refused
                raise
            # Among other segments (as inspect and replay take it): one
            # that holds nothing yet, or one removed since listed (retention).
            self.truncated.append(_skipped(path, exc))
            return exc
        for record in itertools.chain([first] if first is not None else [], records):
            if repeats.repeated(record):
                self.read_bytes = before + result.offset
                continue
            if record.get("k") == "header":
                self.versions[number] = result.version
            try:
                self.take(record, reading, result.offset)
            except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
                # (crafted, not written: a map where a value was, or the other way)
                raise RecordingError(
                    f"{path.name}: damaged after {result.records} records (a {record.get('k')} "
                    f"record this view cannot take: {exc!r})"
                ) from None
            self.read_bytes = before + result.offset
        if result.truncated_bytes:
            self.truncated.append(
                f"{path.name}: ends with {result.truncated_bytes} bytes of an incomplete record"
            )
        return None

    def take(self, record: dict[str, Any], reading: Reading, offset: int) -> None:
        """One record (its summary filled in) of the file ``reading`` reads,
        found at ``offset`` there (where ``detail`` reads it back)."""
        kind = record.get("k")
        by_key = reading.by_key
        if kind == "header":
            reading.capture = capture = record.get("capture", "")
            self.protocol = record.get("protocol", registry.DEFAULT_PROTOCOL)
            self.payloads = record.get("payloads", "")
            if reading.number < len(self.decodings):  # (a live stream has no file number)
                self.decodings[reading.number] = record.get("decoding")
            reading.by_key = {c.conn: c for c in self.connections if c.capture == capture}
            return
        if not self.origin_ns and "t" in record:
            self.origin_ns = record["t"]
            self.origin_wall_ns = record.get("w", 0)
        if kind == "frame":
            connection = by_key.get(record["c"])
            if connection is None:  # its opening was in a file no longer there
                connection = self._connection(reading.capture, record["c"], record["t"])
                by_key[record["c"]] = connection
            self._frame(reading.number, offset, record, connection, reading.waiting, reading.gap)
            reading.gap = False
        elif kind == "conn":
            connection = by_key.get(record["c"])
            if connection is None:
                connection = self._connection(reading.capture, record["c"], record["t"])
                by_key[record["c"]] = connection
            connection.kind = record.get("kind", "")
            connection.client = record.get("client", "")
            connection.via = record.get("via", "")
            connection.broker = record.get("broker", "")
        elif kind == "close":
            connection = by_key.get(record["c"])
            if connection is not None:
                connection.closed = record.get("reason", "") or "closed"
                connection.end_ns = max(connection.end_ns, record["t"])
        elif kind == "http":
            self._exchange(reading.capture, record)
        elif kind == "ws":
            self.ws_frames[(reading.capture, int(record["h"]))] += 1
        elif kind == "ws_end":
            self.ws_ended[(reading.capture, int(record["h"]))] = str(record.get("reason", ""))
        else:
            self._note(kind, record, by_key)
            reading.gap = reading.gap or kind == "gap"

    def _exchange(self, capture: str, record: dict[str, Any]) -> None:
        exchange = Exchange(
            i=len(self.exchanges),
            capture=capture,
            conn=int(record["h"]),
            t=(record["t"] - self.origin_ns) / 1e9,
            client=record.get("client", ""),
            method=record.get("method", ""),
            path=record.get("path", ""),
            status=int(record.get("status", 0)),
            kind=record.get("kind", ""),
            seconds=max(0, record.get("te", record["t"]) - record["t"]) / 1e9,
            request_bytes=int(record.get("req", {}).get("n", 0)),
            response_bytes=int(record.get("res", {}).get("n", 0)),
            redirects=len(record.get("hops", ())),
            refused=record.get("refused", ""),
            ended=record.get("ended", ""),
            redacted=bool(record.get("redacted")),
        )
        with self.lock:
            self.exchanges.append(exchange)

    def http_page(self, f: HttpFilter, offset: int, limit: int) -> dict[str, Any]:
        """The HTTP listener's exchanges that pass ``f``, a page of them."""
        with self.lock:
            chosen = [e for e in self.exchanges if f.keep(e)]
        rows = [
            e.to_json(
                self.ws_frames[(e.capture, e.conn)] if e.status == 101 else 0,
                self.ws_ended.get((e.capture, e.conn), "") if e.status == 101 else "",
            )
            for e in chosen[offset : offset + limit]
        ]
        return {"total": len(chosen), "offset": offset, "rows": rows, "building": self.building}

    def _connection(self, capture: str, conn: int, t: int) -> Connection:
        connection = Connection(
            self._next_connection, capture, conn, protocol=self.protocol, start_ns=t, end_ns=t
        )
        self._next_connection += 1
        with self.lock:
            self.connections.append(connection)
            self.by_id[connection.index] = connection
        return connection

    def _frame(
        self,
        number: int,
        offset: int,
        record: dict[str, Any],
        connection: Connection,
        waiting: dict[tuple[int, str, int, int], int],
        gap: bool,
    ) -> None:
        summary = record.get("s") or {}
        cmd = str(summary.get("cmd", "?"))
        flags = GAP_BEFORE if gap else 0
        if "invalid" in summary:
            flags |= INVALID
        if "error" in summary:
            flags |= ERROR
        if summary.get("redacted") or record.get("redacted"):
            flags |= REDACTED
        index = len(self.t)
        t = int(record["t"])
        direction = 0 if record["d"] == 0 else 1
        pid = int(summary.get("pid", -1))
        pair, latency, slot = -1, 0.0, None
        for key in _PAIR_KEYS:
            if key in summary and not (
                key == "seq" and cmd not in ("SEND", "SEND_RECEIPT", "SEND_ERROR")
            ):
                # (a request id is the connection's own; a sequence id the
                # producer's: a PRODUCER's answer names no producer)
                slot = (connection.index, key, pid if key == "seq" else -1, int(summary[key]))
                if direction == 1:
                    pair = waiting.get(slot, -1)
                    if pair >= 0:
                        latency = (t - self.t[pair] - self.origin_ns) / 1e9
                break
        # Every value worked out (and checked) first, and the columns grown
        # together: a record that does not fit them leaves them as they were.
        values = (
            (self.conn, connection.index),
            (self.direction, direction),
            (self.t, t - self.origin_ns),
            (self.cmd, self.commands.id(cmd)),
            (self.topic, self.topics.id(str(summary.get("topic") or ""))),
            (self.size, int(record.get("n", len(record.get("raw", b""))))),
            (self.flags, flags),
            (self.msgs, min(0xFFFF, int(summary.get("msgs", cmd in _MESSAGES)))),
            (
                self.error_id,
                self.errors.id(str(summary.get("error") or summary.get("invalid") or "")),
            ),
            (self.pid, pid),
            (self.cid, int(summary.get("cid", -1))),
            (self.pair, pair),
            (self.latency, max(0.0, latency)),
            (self.file, number),
            (self.offset, offset),
        )
        with self.lock:
            try:
                for column, value in values:
                    column.append(value)  # type: ignore[arg-type]
            except (OverflowError, TypeError) as exc:
                for column, _ in values:
                    del column[index:]
                raise ValueError(f"a frame record that does not fit the index: {exc}") from None
            if slot is not None:
                if direction == 0:
                    waiting[slot] = index
                elif pair >= 0:
                    del waiting[slot]
                    self.pair[pair] = index
        connection.frames += 1
        connection.problems += bool(flags & PROBLEMS)
        connection.end_ns = max(connection.end_ns, t)

    def _note(
        self, kind: str | None, record: dict[str, Any], by_key: dict[int, Connection]
    ) -> None:
        t = (record.get("t", self.origin_ns) - self.origin_ns) / 1e9
        conn = by_key.get(record["c"]) if "c" in record else None
        if kind == "gap":
            text = f"{record.get('dropped', 0)} frames were not recorded here"
        elif kind == "fault":
            text = (
                f"fault {record.get('action')} by rule {record.get('rule')} on {record.get('cmd')}"
            )
            if self.frames and conn is not None:
                self.flags[self.frames - 1] |= FAULT
                conn.problems += 1
        elif kind == "filter":
            reason = f" ({record['reason']})" if record.get("reason") else ""
            text = (
                f"filter {record.get('filter')} {record.get('action')} "
                f"{record.get('n', 1)} message(s){reason}"
            )
            if self.frames and conn is not None:
                self.flags[self.frames - 1] |= FILTERED
        elif kind == "trigger":
            text = f"snapshot rule {record.get('rule')} ({record.get('on')}) fired"
        elif kind == "snapshot":
            text = f"snapshot of {record.get('seconds', 0):.1f} s: {record.get('reason', '')}"
        else:
            text = f"{kind} record"
        self.notes.append(Note(str(kind), t, conn.index if conn else None, text))

    # --- questions -------------------------------------------------------------

    def matching(self, f: Filter) -> Iterator[int]:
        """Frame indexes that pass the filter, in order."""
        n = self.frames
        cmd = self.commands._ids.get(f.cmd, -1) if f.cmd else None
        topics: set[int] | None = None
        if f.topic:
            wanted = f.topic
            topics = {
                i
                for i, name in enumerate(self.topics.names)
                if name and (name == wanted or name.rsplit("/", 1)[-1] == wanted or wanted in name)
            }
        start = None if f.start is None else int(f.start * 1e9)
        end = None if f.end is None else int(f.end * 1e9)
        for i in range(n):
            if cmd is not None and self.cmd[i] != cmd:
                continue
            if topics is not None and self.topic[i] not in topics:
                continue
            if f.connection is not None and self.conn[i] != f.connection:
                continue
            if f.producer is not None and self.pid[i] != f.producer:
                continue
            if f.consumer is not None and self.cid[i] != f.consumer:
                continue
            if start is not None and self.t[i] < start:
                continue
            if end is not None and self.t[i] > end:
                continue
            if f.problems and not self.flags[i] & PROBLEMS:
                continue
            yield i

    def row(self, i: int) -> dict[str, Any]:
        """The frame at position ``i`` (its id: ``base + i``)."""
        flags = self.flags[i]
        return {
            "i": self.base + i,
            "t": self.t[i] / 1e9,
            "conn": self.conn[i],
            "name": self._name(self.conn[i]),
            "dir": "C→B" if self.direction[i] == 0 else "B→C",
            "cmd": self.commands.names[self.cmd[i]],
            "topic": self.topics.names[self.topic[i]],
            "size": self.size[i],
            "problem": self.errors.names[self.error_id[i]] or ("fault" if flags & FAULT else ""),
            "flags": [
                name
                for bit, name in (
                    (INVALID, "invalid"),
                    (ERROR, "error"),
                    (FAULT, "fault"),
                    (GAP_BEFORE, "gap"),
                    (REDACTED, "redacted"),
                    (FILTERED, "filtered"),
                )
                if flags & bit
            ],
            "pair": self.base + self.pair[i] if self.pair[i] >= 0 else None,
            # (an exported file's page filters its rows by them)
            "pid": self.pid[i] if self.pid[i] >= 0 else None,
            "cid": self.cid[i] if self.cid[i] >= 0 else None,
            "latency": round(self.latency[i], 6)
            if self.pair[i] >= 0 and self.direction[i]
            else None,
        }

    def _name(self, connection: int) -> str:
        """A connection's name on the page (``c`` and its number in its capture)."""
        found = self.by_id.get(connection)
        return f"c{found.conn}" if found is not None else str(connection)

    def selection(self, f: Filter) -> Sequence[int]:
        """The frames that pass ``f``: all of them without a filter; once
        the index is built, remembered for the last few filters (so paging
        through a million frames reads the arrays once)."""
        if f.empty:
            return range(self.frames)
        if self.building:
            return array("I", self.matching(f))
        key = tuple(vars(f).values())
        found = self._selections.get(key)
        if found is None:
            found = self._selections[key] = array("I", self.matching(f))
            while len(self._selections) > 8:
                del self._selections[next(iter(self._selections))]
        return found

    def page(self, f: Filter, offset: int, limit: int) -> dict[str, Any]:
        with self.lock:
            chosen = self.selection(f)
            rows = [self.row(i) for i in chosen[offset : offset + limit]]
            return {"total": len(chosen), "offset": offset, "rows": rows,
                    "building": self.building}  # fmt: skip

    def detail(self, frame: int) -> dict[str, Any]:
        """The frame whose id is ``frame``: KeyError where there is none
        (yet), ``LetGo`` where a live view no longer holds it."""
        with self.lock:
            i = frame - self.base
            if i < 0 and frame >= 0:
                raise LetGo(
                    f"frame {frame} was let go: this view holds frames {self.base} to "
                    f"{self.base + self.frames - 1}"
                )
            if not 0 <= i < self.frames:
                raise KeyError(frame)
            file = self.file[i]
            record = self._record(file, self.offset[i])
            out = self.row(i)
            out["file"] = self._file_name(file)
        raw: bytes = record.get("raw", b"")
        out["raw_hex"] = raw[:4096].hex(" ")
        out["raw_size"] = len(raw)
        out["raw_cut"] = len(raw) > 4096
        p = record.get("p")
        if isinstance(p, list) and p and type(p[0]) is int:  # payload left out: its size
            digest = p[1] if len(p) > 1 and isinstance(p[1], bytes) else None  # (and digest)
            out["payload"] = {"size": p[0], **({"sha256": digest.hex()} if digest else {})}
        out["time"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.get("w", 0) / 1e9))
        withheld = (record.get("s") or {}).get("withheld")  # credentials could not be ruled out
        out["command"] = (
            {"bytes not recorded": withheld} if withheld else self._decoded(raw, out, file)
        )
        return out

    def _record(self, file: int, offset: int) -> dict[str, Any]:
        """The record at ``offset`` of file number ``file``, read back."""
        return record_at(self.files[file], offset, self.versions[file])

    def _file_name(self, file: int) -> str:
        return self.files[file].name

    def _decoded(self, raw: bytes, out: dict[str, Any], file: int) -> Any:
        spec = registry.get(self.protocol)
        if spec.detail is not None:
            decoding = self.decodings[file] if 0 <= file < len(self.decodings) else None
            return spec.detail(raw, out, spec.decode_with(decoding))
        text = raw.decode("utf-8", errors="replace")
        return {"text": "".join(c if c.isprintable() else "·" for c in text[:2000])}

    def summary(self) -> dict[str, Any]:
        """Rates per topic, latency histograms per command, the most
        frequent errors (worked out once the index is built)."""
        with self.lock:
            if self._summary is not None:
                return self._summary
            building = self.building
            found = self._summarize()
            if not building:
                self._summary = found
            return found

    def _summarize(self) -> dict[str, Any]:
        duration = max(1e-9, (max(self.t) if self.frames else 0) / 1e9)
        topics: collections.Counter[str] = collections.Counter()
        topic_bytes: collections.Counter[str] = collections.Counter()
        latency: dict[str, list[int]] = {}
        errors: collections.Counter[str] = collections.Counter()
        for i in range(self.frames):
            name = self.topics.names[self.topic[i]]
            cmd = self.commands.names[self.cmd[i]]
            if name and cmd in ("SEND", "MESSAGE"):
                topics[f"{name} {'B→C' if self.direction[i] else 'C→B'}"] += 1
                topic_bytes[name] += self.size[i]
            if self.pair[i] >= 0 and self.direction[i] == 1:
                asked = self.commands.names[self.cmd[self.pair[i]]]
                counts = latency.setdefault(asked, [0] * (len(BUCKETS) + 1))
                value = self.latency[i]
                counts[
                    next((b for b, top in enumerate(BUCKETS) if value <= top), len(BUCKETS))
                ] += 1
            if self.error_id[i]:
                errors[f"{cmd} {self.errors.names[self.error_id[i]]}"] += 1
        return {
            "frames": self.frames,
            "seconds": duration,
            "started_wall": self.origin_wall_ns / 1e9,
            "rates": self._rates(duration),
            "connections": len(self.connections),
            "topics": [
                {"topic": k, "frames": v, "per_second": v / duration}
                for k, v in topics.most_common(50)
            ],
            "latency": {"buckets": list(BUCKETS), "by_command": latency},
            "errors": [{"error": k, "count": v} for k, v in errors.most_common(20)],
        }

    def _rates(self, duration: float) -> dict[str, Any]:
        """Messages per second by topic over the capture (its busiest
        ``RATE_TOPICS`` topics, produced and delivered apart), in bins of a
        second, or ``RATE_BINS`` equal ones over a longer capture."""
        bins = min(RATE_BINS, max(1, math.ceil(duration)))
        width = duration / bins if duration > RATE_BINS else 1.0
        per: dict[tuple[int, int], list[int]] = {}
        totals: collections.Counter[tuple[int, int]] = collections.Counter()
        message_cmds = {self.commands._ids.get(c, -1) for c in _MESSAGES}
        for i in range(self.frames):
            if self.cmd[i] not in message_cmds or not self.topic[i]:
                continue
            key = (self.topic[i], self.direction[i])
            counts = per.get(key)
            if counts is None:
                counts = per[key] = [0] * bins
            counts[min(bins - 1, max(0, int(self.t[i] / 1e9 / width)))] += self.msgs[i]
            totals[key] += self.msgs[i]
        series = []
        for (topic, direction), total in totals.most_common(RATE_TOPICS):
            series.append({
                "topic": self.topics.names[topic],
                "direction": "produced" if direction == 0 else "delivered",
                "messages": total,
                "per_second": [round(n / width, 3) for n in per[topic, direction]],
            })  # fmt: skip
        return {"bin_seconds": width, "series": series, "topics": len(totals)}

    def sequence(self, f: Filter, offset: int = 0, limit: int = SEQUENCE_LIMIT) -> dict[str, Any]:
        with self.lock:
            return self._sequence(f, offset, limit)

    def _sequence(self, f: Filter, offset: int, limit: int) -> dict[str, Any]:
        """The frames that pass ``f`` (a page of them) as a sequence
        diagram's arrows between lanes: the clients (by host), Sluice, the
        brokers. A frame on a relayed connection goes between client and
        broker through Sluice, except an invalid frame (which Sluice refuses,
        as ``--on-invalid`` does by default) and what Sluice wrote itself (a
        fault rule's or a filter's answer, the answer to an invalid frame);
        on a connection Sluice answers itself (lookups, a refused handshake)
        it goes between client and Sluice."""
        chosen = self.selection(f)
        lanes: list[dict[str, str]] = []
        where: dict[tuple[str, str], int] = {}

        def lane(kind: str, name: str) -> int:
            found = where.get((kind, name))
            if found is None:
                found = where[kind, name] = len(lanes)
                lanes.append({"kind": kind, "name": name})
            return found

        arrows = []
        shown = chosen[offset : offset + limit]
        clients = {self.by_id[self.conn[i]].client.rpartition(":")[0] for i in shown}
        for host in sorted(clients):
            lane("client", host or "client")
        sluice = lane("sluice", "Sluice")
        for i in shown:
            connection = self.by_id[self.conn[i]]
            client = lane("client", connection.client.rpartition(":")[0] or "client")
            relayed = connection.kind == "proxied"
            asked = self.pair[i]
            own = bool(self.flags[i] & (FAULT | FILTERED)) or (
                asked >= 0 and bool(self.flags[asked] & INVALID)  # refused by Sluice
            )
            if self.direction[i] == 0:
                source = client
                stops = not relayed or self.flags[i] & INVALID  # (--on-invalid reject)
                target = sluice if stops else lane("broker", connection.broker or "broker")
            else:
                source = lane("broker", connection.broker or "broker") if relayed and not own \
                    else sluice  # fmt: skip
                target = client
            arrows.append({
                **self.row(i),
                "name": f"c{connection.conn}",
                "from": source,
                "to": target,
                "via": sluice if relayed and source != sluice and target != sluice else None,
            })  # fmt: skip
        return {"lanes": lanes, "arrows": arrows, "total": len(chosen), "offset": offset,
                "building": self.building}  # fmt: skip

    def status(self) -> dict[str, Any]:
        with self.lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "protocol": self.protocol,
            "payloads": self.payloads,
            "files": len(self.files),
            "frames": self.frames,
            "connections": len(self.connections),
            "http": len(self.exchanges),
            "building": self.building,
            "progress": (
                self.read_bytes / self.total_bytes if self.building and self.total_bytes else 1.0
            ),
            "error": self.error,
            "truncated": self.truncated,
            "notes": [vars(n) for n in self.notes_shown()],
            "started_wall": self.origin_wall_ns / 1e9,
            "built_in": round(self.built_in, 3),
        }

    def notes_shown(self) -> list[Note]:
        """The notes the page is given: a capture's first 500."""
        return self.notes[:500]

    def connections_json(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The connections, or ``limit`` of them at most (``shown``)."""
        with self.lock:
            chosen = self.connections
            if limit is not None and len(chosen) > limit:
                chosen = self.shown(chosen, limit)
            return [c.to_json(self.origin_ns) for c in chosen]

    def shown(self, items: list[Any], limit: int) -> list[Any]:
        """Which ``limit`` of ``items`` (in order) the page shows: a
        capture's first (a live view's are its newest)."""
        return items[:limit]

    def timeline(self, f: Filter, marks: int = 4000) -> dict[str, Any]:
        with self.lock:
            return self._timeline(f, marks)

    def _timeline(self, f: Filter, marks: int) -> dict[str, Any]:
        """Marks per connection lane: problems and frames each sampled so
        that at most ``marks`` of each are drawn (every problem up to that:
        a capture of a million failures is not a million marks to send and
        draw); answers joined to requests."""
        key = (*vars(f).values(), marks)
        if not self.building and key in self._timelines:
            return self._timelines[key]
        chosen = self.selection(f)
        flags = self.flags
        problems = sum(1 for i in chosen if flags[i] & PROBLEMS)
        step = max(1, len(chosen) // marks)
        problem_step = max(1, problems // marks)
        shown = []
        connections: set[int] = set()  # those the marks are on
        seen_problems = 0
        for n, i in enumerate(chosen):
            problem = flags[i] & PROBLEMS
            if problem:
                seen_problems += 1
                if (seen_problems - 1) % problem_step:
                    continue
            elif n % step:
                continue
            pair = self.pair[i]
            connections.add(self.conn[i])
            shown.append(
                [
                    self.base + i,
                    self.conn[i],
                    self.t[i] / 1e9,
                    self.direction[i],
                    int(bool(problem)),
                    self.base + pair if pair >= 0 else -1,
                    self.commands.names[self.cmd[i]],
                ]
            )
        # A lane per connection a mark is on (at most TIMELINE_LANES: the
        # marks on others are left out, and the page says so).
        on = sorted(connections)
        lanes = self.shown(on, TIMELINE_LANES)
        if len(lanes) < len(on):
            kept = set(lanes)
            shown = [mark for mark in shown if mark[1] in kept]
        found = {
            "marks": shown,
            "lanes": [[c, self._name(c)] for c in lanes],
            "lanes_total": len(on),
            "sampled": step > 1 or problem_step > 1,
            "problems": problems,
            "problems_sampled": problem_step > 1,
            "frames": len(chosen),
            "notes": [vars(n) for n in self.notes_shown()],
            # The HTTP listener's exchanges, a lane of their own: [i, start,
            # seconds, status], at most ``marks`` of them.
            "http": [[e.i, e.t, e.seconds, e.status] for e in self.exchanges[:marks]],
        }
        if not self.building:
            self._timelines[key] = found
            while len(self._timelines) > 8:
                del self._timelines[next(iter(self._timelines))]
        return found
