"""Recordings as connections of decoded frames, for replay and serve: one
loader for every protocol, each frame decoded by the protocol the file's
header names (``ProtocolSpec.decode``)."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import heapq
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.protocols import registry
from sluice.recording.format import (
    Gone,
    ReadResult,
    RecordingError,
    Unfinished,
    denied,
    read_records,
    recording_files,
)


@dataclass
class RecordedFrame:
    from_client: bool
    mono_ns: int
    wall_ns: int
    frame: Any  # the protocol's decoded frame
    summary: dict[str, Any]
    index: int  # position in the whole capture, for ordering across connections


@dataclass(frozen=True)
class RecordedFault:
    """A fault injected while recording (a ``fault`` annotation)."""

    rule: str
    action: str
    command: str
    from_client: bool
    index: int  # frames of the capture recorded before it

    def describe(self) -> str:
        arrow = "C→B" if self.from_client else "B→C"
        return f"FAULT {self.action} by rule {self.rule} on {arrow} {self.command}"


@dataclass(frozen=True)
class RecordedFilter:
    """A message filter's verdict on a client frame (a ``filter``
    annotation): ``position``, how many frames of the connection were
    recorded before it; ``sent``, the frame as the filter sent it on
    (replaced or encrypted), if it changed it."""

    position: int
    action: str
    reason: str
    sent: bytes | None


@dataclass(frozen=True)
class Gap:
    """Frames the recorder could not record (a ``gap`` record): ``dropped``
    of them, on connections among ``open`` (those open then; which is not
    recorded), just before the frame of ``index``."""

    index: int
    dropped: int
    open: frozenset[tuple[str, int]]


@dataclass
class RecordedConnection:
    key: tuple[str, int]  # (capture, connection id)
    kind: str  # lookup | proxied
    client: str
    broker: str
    frames: list[RecordedFrame] = field(default_factory=list)
    faults: list[RecordedFault] = field(default_factory=list)
    filters: list[RecordedFilter] = field(default_factory=list)  # on client frames
    # Closed (by either side) before the frame of this index was recorded:
    # replay closes it there too. None: open to the end of the recording.
    closed_at: int | None = None
    # Recorded from mid-stream: the recording starts after it opened (a
    # snapshot, or a segment whose predecessors are gone), so what it said
    # before is not in it.
    late: bool = False

    @property
    def name(self) -> str:
        return f"c{self.key[1]}"


@dataclass
class Recording:
    connections: list[RecordedConnection]
    payloads: str
    frames: int
    truncated: list[Path]
    gaps: list[Gap] = field(default_factory=list)
    # What the HTTP listener recorded beside the binary protocol (``http``
    # exchanges, ``ws`` frames): not loaded, counted so that replay and
    # serve can say they left it out.
    http: int = 0
    ws: int = 0

    def incomplete(self, conn: RecordedConnection, index: int | None = None) -> str | None:
        """Why the recording may not hold all that led to ``conn``'s frame
        at ``index`` (None: to anything on it), or None when it does: what
        replay tells apart from a broker's divergence."""
        if conn.late:
            return "recorded from mid-stream"
        gap = self._first_gaps.get(conn.key)
        if gap is None or (index is not None and index < gap.index):
            return None
        return f"after a gap: {gap.dropped} frames not recorded"

    @functools.cached_property
    def _first_gaps(self) -> dict[tuple[str, int], Gap]:
        """The first gap each connection was open at."""
        first: dict[tuple[str, int], Gap] = {}
        for gap in sorted(self.gaps, key=lambda gap: gap.index):
            for key in gap.open:
                first.setdefault(key, gap)
        return first


class Repeats:
    """Records that a flight-recorder snapshot read now holds and one read
    before it already held: two snapshots of one recorder (one capture)
    covering the same seconds (``--last 60``, then the whole ring) hold the
    same records, byte for byte. Each holds, after its ``snapshot``
    record, a run of the ring's records numbered from the ``ring`` that
    record names (one more each, in file order; the ring numbers every
    record once); records whose numbers a file of the same capture read
    earlier held are repeats. (Not told by their times: the frames of one
    read share ``t`` and ``w``.) Snapshots written before the numbers were
    (no ``ring``) are read whole, as they were.

    ``repeated`` is given every record of every file, in reading order."""

    def __init__(self) -> None:
        self._held: dict[str, list[tuple[int, int]]] = {}  # capture -> runs read, merged
        self._capture = ""
        self._first: int | None = None  # the ring number of the file's first numbered record
        self._next = 0  # that of the next one

    def repeated(self, record: dict[str, Any]) -> bool:
        kind = record.get("k")
        if kind == "header":
            self._done()
            self._capture = str(record.get("capture", ""))
            return False
        if self._first is not None:
            number = self._next
            self._next += 1
            return self._holds(number)
        ring = record.get("ring")
        if kind == "snapshot" and isinstance(ring, int) and not isinstance(ring, bool):
            self._first = self._next = ring
        return False

    def _holds(self, number: int) -> bool:
        runs = self._held.get(self._capture, [])
        at = bisect.bisect_right(runs, (number, float("inf"))) - 1
        return at >= 0 and runs[at][0] <= number < runs[at][1]

    def _done(self) -> None:
        """The file read so far (its numbered run) is held from now on."""
        if self._first is None:
            return
        if self._next > self._first:
            merged: list[tuple[int, int]] = []
            for low, high in sorted([*self._held.get(self._capture, []),
                                     (self._first, self._next)]):  # fmt: skip
                if merged and low <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], high))
                else:
                    merged.append((low, high))
            self._held[self._capture] = merged
        self._first = None


# A file name as the recorder writes it: the UTC time it started (never
# earlier than the capture's file before it), the capture, the file's number.
_OWN_NAME = re.compile(r"sluice-(\d{8}T\d{6})-([0-9a-f]{12})-(\d{4,})\.sluice")


def in_capture_order(paths: list[Path]) -> list[Path]:
    """``paths`` (in name order), with each capture's own files, wherever
    they lie, read in the order of the records they hold: a flight
    recorder's snapshots by the first ring number they hold (``ring``),
    other files (and snapshots written before the numbers) by the time and
    number in their names. Snapshot directories are named by the second,
    then the reason, so two snapshots of one second could be listed the
    later one first; and a short snapshot (``--last 10``) taken before a
    whole-ring one holds newer records than the whole one's first: read
    first, the older records only the whole one holds would come after
    them, in each connection. Other files, and the places between
    captures, stay as they are."""
    slots: dict[str, list[int]] = {}
    for at, path in enumerate(paths):
        if (own := _OWN_NAME.fullmatch(path.name)) is not None:
            slots.setdefault(own[2], []).append(at)
    ordered = list(paths)
    for ats in slots.values():
        mine = sorted((paths[at] for at in ats), key=lambda p: (_ring_start(p), p.name, str(p)))
        for at, path in zip(ats, mine, strict=True):
            ordered[at] = path
    return ordered


def _ring_start(path: Path) -> int:
    """The ring number of the first record a snapshot file holds after its
    ``snapshot`` record; -1 for a segment, a snapshot without numbers, or
    a file that does not read (its reader says why)."""
    try:
        for record in read_records(path):
            kind = record.get("k")
            if kind == "snapshot":
                ring = record.get("ring")
                return ring if isinstance(ring, int) and not isinstance(ring, bool) else -1
            if kind not in ("header", "conn", "close"):
                return -1  # past a file's head: no snapshot record
    except (RecordingError, OSError, ValueError):
        pass
    return -1


def listed(target: Path) -> list[Path]:
    """The recording files at ``target`` (``recording_files``), with a file
    or directory this user may not read said so (a RecordingError naming
    it) rather than passed over: a directory that cannot be listed, at
    ``target`` or anywhere below it (``recording_files``), or a path
    inside a directory that cannot be entered."""
    try:
        return recording_files(target)
    except PermissionError as exc:  # (a path inside a directory we may not enter)
        raise denied(exc, target) from None


def holds_nothing(target: Path, skipped: list[Unfinished | Gone]) -> RecordingError:
    """The refusal of several files at ``target`` none of which holds a whole
    record (``skipped``: why each was, every writer stopped before or during
    its first flush): no recording, said as a lone such file is, not read as
    a capture of 0 frames."""
    n = len(skipped)
    empty = sum(isinstance(e, Unfinished) and e.size == 0 for e in skipped)
    if empty == n:
        return RecordingError(f"{target}: all {n} files are empty, not a Sluice recording")
    cut = sum(isinstance(e, Unfinished) and e.size > 0 for e in skipped)
    kinds = ((empty, "empty"), (cut, "cut inside its header"), (n - empty - cut, "removed"))
    found = ", ".join(f"{count} {what}" for count, what in kinds if count)
    return RecordingError(
        f"{target}: none of its {n} files holds a whole record ({found}), not a Sluice recording"
    )


def load(target: Path, *, need_payloads: bool = True) -> Recording:
    """Every connection of the recording(s) at ``target``, in order of opening.

    Raises RecordingError (with a message for users) when the files cannot be
    used, e.g. recorded without payloads when ``need_payloads``.
    """
    paths = in_capture_order(listed(target))
    if not paths:
        raise RecordingError(f"{target}: no recordings (*.sluice) here")
    connections: dict[tuple[str, int], RecordedConnection] = {}
    policies: set[str] = set()
    truncated: list[Path] = []
    index = 0
    capture = ""
    decode = registry.get(registry.DEFAULT_PROTOCOL).decode
    # When each close and fault was recorded (wall clock, and frames before it).
    closed: dict[tuple[str, int], tuple[int, int]] = {}
    faulted: dict[int, int] = {}  # id(RecordedFault) -> wall clock
    gaps: list[tuple[str, int, Gap]] = []  # with their capture and wall clock
    open_now: set[tuple[str, int]] = set()
    # Connections recorded from mid-stream: those a file restates (its
    # first records after the header) that no file read before opened, in
    # a snapshot (all of them: a ``snapshot`` record follows them) or in a
    # segment read without the one before it (those marked ``restated``:
    # the others opened as it started).
    segments: dict[str, int] = {}  # capture -> the last segment read
    heading: list[tuple[RecordedConnection, bool]] | None = None  # (connection, marked)
    joined = False  # the file read now is a segment read without the one before it
    skipped: list[Unfinished | Gone] = []  # files of no whole record, or removed
    web: collections.Counter[str] = collections.Counter()  # http and ws records
    repeats = Repeats()  # what overlapping snapshots both hold, read once
    for path in paths:
        result = ReadResult(path)
        records = read_records(path, result)
        try:
            first = next(records, None)  # what makes a file unreadable as a whole is met here
        except (Unfinished, Gone) as exc:
            if len(paths) == 1 and not (isinstance(exc, Unfinished) and exc.size == 0):
                raise
            truncated.append(path)  # a segment with nothing yet, or pruned since listed
            skipped.append(exc)
            continue
        for record in itertools.chain([first] if first is not None else [], records):
            if repeats.repeated(record):
                continue
            kind = record["k"]
            if kind not in ("conn", "header") and heading is not None:
                for restated, marked in heading:
                    restated.late = kind == "snapshot" or (joined and marked)
                heading = None  # past the file's first records
            if kind == "header":
                capture = record["capture"]
                policies.add(record["payloads"])
                # With the settings the proxy decoded with (a Cursus
                # broker's compression), which the header keeps.
                spec = registry.get(record.get("protocol", registry.DEFAULT_PROTOCOL))
                decode = spec.decode_with(record.get("decoding"))
                segment = record.get("segment", 1)
                joined = segment > 1 and segments.get(capture) != segment - 1
                segments[capture] = segment
                heading = []
            elif kind == "conn":
                key = (capture, record["c"])
                open_now.add(key)
                if key not in connections:
                    connections[key] = RecordedConnection(
                        key, record["kind"], record["client"], record["broker"]
                    )
                    if heading is not None:
                        heading.append((connections[key], bool(record.get("restated"))))
            elif kind == "gap":
                ours = frozenset(key for key in open_now if key[0] == capture)
                gaps.append((capture, record.get("w", 0), Gap(index, record["dropped"], ours)))
            elif kind == "frame":
                conn = connections.get((capture, record["c"]))
                if conn is None:
                    continue  # its conn record was lost with a dropped segment
                if "raw" not in record:
                    raise RecordingError(
                        f"{path}: damaged after {result.records - 1} records "
                        "(a frame without its bytes)"
                    )
                conn.frames.append(
                    RecordedFrame(
                        record["d"] == 0,
                        record["t"],
                        record["w"],
                        decode(record["raw"], record["d"] == 0),
                        record["s"],
                        index,
                    )
                )
                index += 1
            elif kind == "close":
                conn = connections.get((capture, record["c"]))
                open_now.discard((capture, record["c"]))
                if conn is not None:
                    conn.closed_at = index
                    closed[conn.key] = (record["w"], index)
            elif kind == "fault":
                conn = connections.get((capture, record["c"]))
                if conn is not None:
                    fault = RecordedFault(
                        record["rule"], record["action"], record["cmd"], record["d"] == 0, index
                    )
                    conn.faults.append(fault)
                    faulted[id(fault)] = record["w"]
            elif kind in ("http", "ws"):
                web[kind] += 1
            elif kind == "filter" and record.get("d") == 0:
                conn = connections.get((capture, record["c"]))
                if conn is not None:
                    raw = (record.get("sent") or {}).get("raw") or None
                    conn.filters.append(
                        RecordedFilter(len(conn.frames), record.get("action", ""),
                                       record.get("reason", ""), bytes(raw) if raw else None)
                    )  # fmt: skip
        if result.truncated_bytes:
            truncated.append(path)
    if len(skipped) == len(paths):  # (several: a lone one is refused as it is read)
        raise holds_nothing(target, skipped)
    if need_payloads and policies - {"full"}:
        raise RecordingError(
            f"{target}: recorded without message payloads (--record-payloads "
            f"{'/'.join(sorted(policies - {'full'}))}); replaying and serving need a recording "
            "made with --record-payloads full"
        )
    found = [gap for *_, gap in gaps]
    if len({key[0] for key in connections}) > 1:
        found = _in_time_order(list(connections.values()), closed, faulted, gaps)
    ordered = sorted(connections.values(), key=lambda c: c.frames[0].index if c.frames else 0)
    return Recording([c for c in ordered if c.frames], policies.pop() if policies else "", index,
                     truncated, found, web["http"], web["ws"])  # fmt: skip


def _in_time_order(
    connections: list[RecordedConnection],
    closed: dict[tuple[str, int], tuple[int, int]],
    faulted: dict[int, int],
    gaps: list[tuple[str, int, Gap]],
) -> list[Gap]:
    """Frames of several captures (``--workers``: a writer each, their files
    read one after another) numbered again in the order they were recorded:
    each capture's records keep their own order, and the captures are
    interleaved by the wall clock, the closes, faults and gaps going along
    in their places (the gaps are returned). Replay then goes through the
    traffic as it happened, not a worker at a time. (Interleaved, not
    sorted: a wall clock stepped back must not put a connection's answer
    before its request.)"""
    # Per capture, its frames, closes, faults and gaps as read: (wall,
    # position, 0 for a close, fault or gap recorded before the frame of that
    # position, 1 for the frame, the connection (None for a gap), the frame,
    # fault or gap; None: the close).
    Item = tuple[
        int, int, int, RecordedConnection | None, RecordedFrame | RecordedFault | Gap | None
    ]
    streams: dict[str, list[Item]] = {}
    for capture, wall, gap in gaps:
        streams.setdefault(capture, []).append((wall, gap.index, 0, None, gap))
    for conn in connections:
        stream = streams.setdefault(conn.key[0], [])
        stream.extend((f.wall_ns, f.index, 1, conn, f) for f in conn.frames)
        if conn.key in closed:
            wall, position = closed[conn.key]
            stream.append((wall, position, 0, conn, None))
        stream.extend((faulted[id(f)], f.index, 0, conn, f) for f in conn.faults)
    for stream in streams.values():
        stream.sort(key=lambda item: (item[1], item[2]))
    number = 0
    faults: dict[tuple[str, int], list[RecordedFault]] = {c.key: [] for c in connections}
    found: list[Gap] = []
    for _, _, _, whose, what in heapq.merge(*streams.values(), key=lambda item: item[0]):
        if isinstance(what, RecordedFrame):
            what.index = number
            number += 1
        elif isinstance(what, Gap):
            found.append(dataclasses.replace(what, index=number))
        elif whose is None:
            continue
        elif what is None:
            whose.closed_at = number
        else:
            faults[whose.key].append(dataclasses.replace(what, index=number))
    for conn in connections:
        conn.frames.sort(key=lambda f: f.index)
        conn.faults = faults[conn.key]
    return found
