"""The flight recorder's ring on its own: what it keeps, by bytes and by time."""

from __future__ import annotations

from sluice.recording.ring import Ring

S = 1_000_000_000  # ns


def test_a_ring_in_seconds_holds_nothing_older_after_a_quiet_spell() -> None:
    """``--record-ring 60s``: traffic, then an hour of none. A snapshot then
    (the writer evicts at the time of asking) holds none of that traffic: it
    is older than the ring's 60 s, even the newest part of it."""
    ring = Ring(64 * 1024 * 1024, max_seconds=60)
    ring.add(1 * S, [b"a" * 10])
    ring.add(2 * S, [b"b" * 10])
    ring.evict(30 * S)
    assert [p.data for p in ring.since(None)] == [b"a" * 10, b"b" * 10]
    ring.evict(3600 * S)
    assert ring.since(None) == [] and ring.bytes == 0
    assert ring.evicted_until_ns == 2 * S  # closed connections' records may go too
    ring.add(3601 * S, [b"c"])
    assert [p.data for p in ring.since(None)] == [b"c"] and ring.bytes == 1


def test_a_ring_in_bytes_keeps_its_newest_part_however_large() -> None:
    ring = Ring(100)
    ring.add(1 * S, [b"a" * 60])
    ring.add(2 * S, [b"b" * 60])
    ring.add(3 * S, [b"c" * 60])
    assert [p.data[:1] for p in ring.parts] == [b"b", b"c"]  # the bound plus one part
    ring.add(4 * S, [b"d" * 500])
    assert [p.data[:1] for p in ring.parts] == [b"d"] and ring.bytes == 500
    ring.evict(10_000 * S)  # no time bound: kept
    assert ring.bytes == 500
