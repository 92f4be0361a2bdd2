"""The in-memory ring of ``--record-ring``: the recent past, no disk writes.

The recorder's writer hands the ring what it would have written, one batch
at a time (a *part*: the packed records of one batch, joined). The ring
keeps parts until their bytes pass the bound, or the oldest is older than
the time bound; so memory stays within the bound plus one part. A snapshot
takes the parts of the last N seconds (all of them by default).

A snapshot must read as a recording of its own, so it restates, at its
start, the ``conn`` record of every connection whose records it holds but
whose opening has left the ring: the recorder keeps those of open
connections, and of closed ones for as long as their records may be in the
ring (``forget_closed_before``).
"""

from __future__ import annotations

import collections
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

    def add(self, mono_ns: int, packed: list[bytes], records: int | None = None) -> None:
        """Keep ``packed``, ``records`` records (default: one each)."""
        if not packed:
            return
        data = b"".join(packed)
        count = len(packed) if records is None else records
        self.parts.append(Part(mono_ns, data, self.records, count))
        self.records += count
        self.bytes += len(data)
        self.evict(mono_ns)

    def evict(self, now_ns: int) -> None:
        """Drop the oldest parts: while the others alone reach the byte
        bound (the newest part stays, however large), and every part older
        than the time bound (the newest too: after a quiet spell a ring of
        60 s holds nothing from an hour ago)."""
        parts = self.parts
        while parts and (
            (len(parts) > 1 and self.bytes - len(parts[0].data) >= self.max_bytes)
            or (self.max_ns is not None and parts[0].mono_ns < now_ns - self.max_ns)
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


def needed(parts: list[Part]) -> Needed:
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
