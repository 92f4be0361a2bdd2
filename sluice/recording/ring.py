"""The in-memory ring of ``--record-ring``: the recent past, no disk writes.

The recorder's writer hands the ring what it would have written, one batch
at a time (a *part*: the packed records of one batch, joined). The ring
keeps parts until their bytes pass the bound, or the oldest is older than
the time bound; so memory stays within the bound plus one part. A snapshot
takes the parts of the last N seconds (all of them by default).

While a snapshot is written it holds its parts (``Ring.hold``), and they
stay in the ring, counted against its bound, until each is written: the
ring evicts its oldest parts as ever, but never one still to be written,
and takes no new part while what it must keep already reaches the bound
(``has_room``). The writer then leaves new records in its queue, bounded
on its own, where traffic past the queue's bound is counted as dropped, as
when a disk is slow. So the ring and the snapshot together stay within the
bound plus one part, and the snapshot holds the ring as it was when asked.

A snapshot must read as a recording of its own, so it restates, at its
start, the ``conn`` record of every connection whose records it holds but
whose opening has left the ring: the recorder keeps those of open
connections, and of closed ones for as long as their records may be in the
ring (``forget_closed_before``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from sluice.recording.format import Record


@dataclass
class Part:
    mono_ns: int  # when the batch was taken (its records are from up to then)
    data: bytes
    # The ring number of its first record (the ring numbers every record it
    # takes, from 0, never again), and how many records it holds: a
    # snapshot's ``ring``, by which readers know the records that
    # overlapping snapshots both hold.
    first: int = 0
    records: int = 0
    # A snapshot holds it, not yet written: the ring does not evict it.
    held: bool = False


class Ring:
    def __init__(self, max_bytes: int, max_seconds: float | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_ns = None if max_seconds is None else int(max_seconds * 1e9)
        self.parts: collections.deque[Part] = collections.deque()
        self.bytes = 0
        self.evicted_parts = 0
        self.records = 0  # records taken so far: the next one's ring number
        # When the newest evicted part was taken: records from before then
        # may be gone (None: nothing evicted yet).
        self.evicted_until_ns: int | None = None
        # The snapshot being written (one at a time), and the bytes of the
        # parts taken since it began: with its parts, what the ring must keep.
        # The snapshot's thread lets parts go while the writer adds.
        self._lock = threading.Lock()
        self._hold: Hold | None = None
        self._since_hold = 0

    def hold(self, parts: Iterable[Part]) -> Hold:
        """Hold ``parts`` (ring parts, oldest first: the newest of it) for a
        snapshot, in the ring until the snapshot says each is written."""
        with self._lock:
            if self._hold is not None and self._hold.parts:
                raise RuntimeError("a snapshot holds the ring's parts already")
            held = Hold(self, collections.deque(parts))
            for part in held.parts:
                part.held = True
                held.bytes += len(part.data)
            self._hold = held
            self._since_hold = 0
            return held

    def has_room(self) -> bool:
        """Whether the ring may take a part: always, unless a snapshot's
        parts and those taken since reach the bound (it cannot evict them)."""
        with self._lock:
            held = self._hold
            return held is None or held.bytes + self._since_hold < self.max_bytes

    def _let_go(self, held: Hold, part: Part | None) -> None:
        """``part`` is written (None: nothing more is); the hold ends with
        its last part."""
        with self._lock:
            if part is not None and part.held:
                part.held = False
                held.bytes -= len(part.data)
            if not held.parts and self._hold is held:
                self._hold = None
                self._since_hold = 0

    def add(self, mono_ns: int, packed: list[bytes], records: int | None = None) -> None:
        """Keep ``packed``, ``records`` records (default: one each)."""
        if not packed:
            return
        data = b"".join(packed)
        count = len(packed) if records is None else records
        with self._lock:
            self.parts.append(Part(mono_ns, data, self.records, count))
            self.records += count
            self.bytes += len(data)
            if self._hold is not None:
                self._since_hold += len(data)
        self.evict(mono_ns)

    def evict(self, now_ns: int) -> None:
        """Drop the oldest parts: while the others alone reach the byte
        bound (the newest part stays, however large), and every part older
        than the time bound (the newest too: after a quiet spell a ring of
        60 s holds nothing from an hour ago). Never a part a snapshot holds:
        eviction waits for it to be written."""
        parts = self.parts
        with self._lock:
            while (
                parts
                and not parts[0].held
                and (
                    (len(parts) > 1 and self.bytes - len(parts[0].data) >= self.max_bytes)
                    or (self.max_ns is not None and parts[0].mono_ns < now_ns - self.max_ns)
                )
            ):
                part = parts.popleft()
                self.bytes -= len(part.data)
                self.evicted_parts += 1
                self.evicted_until_ns = part.mono_ns

    @property
    def oldest_ns(self) -> int | None:
        return self.parts[0].mono_ns if self.parts else None

    def since(self, start_ns: int | None) -> list[Part]:
        """The parts holding records from ``start_ns`` on (None: all)."""
        if start_ns is None:
            return list(self.parts)
        # A part taken at t holds records from (previous part's t, t].
        return [p for p in self.parts if p.mono_ns >= start_ns]


class Hold:
    """The parts a snapshot is writing, oldest first: ``next`` the one to
    write, ``written`` once it is (the snapshot then holds it no more, and
    the ring may evict it), ``close`` to let all go. Keep no other list of
    them: a part let go must be free to go."""

    def __init__(self, ring: Ring, parts: collections.deque[Part]) -> None:
        self.ring = ring
        self.parts = parts
        self.bytes = 0  # of the parts still held

    def next(self) -> Part | None:
        return self.parts[0] if self.parts else None

    def written(self, part: Part) -> None:
        if self.parts and self.parts[0] is part:
            self.parts.popleft()
        self.ring._let_go(self, part)

    def keep_newest(self, count: int) -> None:
        """Let go of all but the newest ``count`` (those not to be written)."""
        while len(self.parts) > count:
            self.written(self.parts[0])

    def close(self) -> None:
        while self.parts:
            self.written(self.parts[0])
        self.ring._let_go(self, None)  # (held nothing: ends it too)


def newest_within(parts: list[Part], budget: int) -> list[Part]:
    """The newest of ``parts`` whose bytes together fit ``budget``."""
    size = 0
    for at in range(len(parts) - 1, -1, -1):
        size += len(parts[at].data)
        if size > budget:
            return parts[at + 1 :]
    return parts


@dataclass
class Needed:
    """What a snapshot over some parts must restate: connections whose
    records it holds without their ``conn`` record."""

    connections: set[int]
    opened: set[int]
    records: int


def needed(parts: Iterable[Part]) -> Needed:
    """Read the parts' records (off the hot path, at snapshot time)."""
    connections: set[int] = set()
    opened: set[int] = set()
    count = 0
    for part in parts:
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(part.data)
        for record in unpacker:
            count += 1
            conn = record.get("c")
            if conn is None:
                continue
            connections.add(conn)
            if record.get("k") == "conn":
                opened.add(conn)
    return Needed(connections - opened, opened, count)


def restate(
    missing: set[int], open_records: dict[int, Record], closed_records: dict[int, Record]
) -> list[Record]:
    """The ``conn`` records to put first, oldest first."""
    found = [open_records.get(c) or closed_records.get(c) for c in missing]
    return sorted((r for r in found if r is not None), key=lambda r: r["t"])
