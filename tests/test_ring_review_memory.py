"""The flight recorder's memory while a snapshot is being written: the ring
of ``--record-ring SIZE`` holds SIZE plus one part, the snapshot's parts
included (docs/recording-format.md, the flight recorder). Before, a
snapshot kept the ring's old parts while new traffic filled the ring
afresh: nearly twice SIZE for as long as the write took."""

from __future__ import annotations

import time
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import trio
import trio.testing

from sluice.recording.format import read_records
from sluice.recording.ring import Part, Ring
from sluice.recording.writer import Recorder, RecorderConfig

KiB = 1024
MiB = 1024 * KiB
S = 1_000_000_000  # ns


def _record(size: int) -> dict[str, Any]:
    """Traffic that is not a protocol's frame (a WebSocket frame), ``size``
    bytes of it: queued, counted and dropped as frames are."""
    return {"k": "ws", "h": 1, "d": 0, "t": time.monotonic_ns(), "w": time.time_ns(),
            "n": size, "op": "binary", "blob": b"x" * size}  # fmt: skip


def _live_part_bytes(seen: list[weakref.ref[Part]]) -> int:
    """Bytes of every part still alive, whoever holds it (the ring, a
    snapshot): what the recorder's parts take in memory."""
    return sum(len(p.data) for p in (ref() for ref in seen) if p is not None)


async def test_a_snapshot_being_written_keeps_the_ring_within_its_bound(tmp_path: Path) -> None:
    """A snapshot whose write is held while four times the ring's size of
    traffic arrives: the parts alive (the ring's and the snapshot's) stay
    within SIZE plus one part, and so does the memory the process holds;
    the snapshot still holds the ring as it was when it was asked for, and
    what the ring could not take meanwhile is counted as dropped."""
    bound = 2 * MiB
    queue = 256 * KiB
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=bound, flush_interval=0.005,
                                       queue_bytes=queue))  # fmt: skip
    ring = recorder._ring
    assert ring is not None
    seen: list[weakref.ref[Part]] = []
    adding = ring.add

    def add(mono_ns: int, packed: list[bytes], records: int | None = None) -> None:
        adding(mono_ns, packed, records)
        if ring.parts and (not seen or seen[-1]() is not ring.parts[-1]):
            seen.append(weakref.ref(ring.parts[-1]))

    ring.add = add  # type: ignore[method-assign]
    largest_part = 0
    release = trio.Event()
    write_in_thread = recorder._io

    async def held_io(fn: Any, *args: Any) -> Any:
        await release.wait()
        return await write_in_thread(fn, *args)

    recorder._io = held_io  # type: ignore[method-assign]
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")

    async def feed(total: int) -> None:
        nonlocal largest_part
        fed = 0
        while fed < total:
            recorder.note(_record(16 * KiB))
            fed += 16 * KiB
            if fed % (128 * KiB) == 0:
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0.006)  # past a flush interval: the writer takes them
                largest_part = max([largest_part, *(len(p.data) for p in ring.parts)])

    tracemalloc.start()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            await feed(3 * bound)  # a full ring
            taken: list[Any] = []

            async def take() -> None:
                taken.append(await recorder.snapshot(reason="held"))

            nursery.start_soon(take)
            await trio.testing.wait_all_tasks_blocked()  # its write is held now
            at_snapshot = [(p.first, p.records) for p in ring.parts]
            before, _ = tracemalloc.get_traced_memory()
            dropped_before = recorder.dropped_total
            await feed(4 * bound)  # traffic goes on while it is written
            during, _ = tracemalloc.get_traced_memory()
            alive = _live_part_bytes(seen)
            held_by_ring = ring.bytes
            dropped_during = recorder.dropped_total - dropped_before
            release.set()
            deadline = trio.current_time() + 30
            while not taken:
                assert trio.current_time() < deadline, "the snapshot was never written"
                await trio.sleep(0.01)
            await feed(bound // 4)  # the ring takes traffic again once it is written
            after_write = [(p.first, p.records) for p in ring.parts]
            later = await recorder.snapshot(reason="later")
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    print(f"parts alive {alive}, ring {held_by_ring}, memory grew {during - before} bytes, "
          f"largest part {largest_part}, dropped {dropped_during}")  # fmt: skip
    assert largest_part > 0
    # Every part alive, the ring's or the snapshot's, within SIZE + one part.
    assert alive <= bound + largest_part, (alive, bound, largest_part)
    assert held_by_ring <= bound + largest_part
    # Nor did the process's memory grow by more than the writer's queue
    # (what waits for the ring) and some slack: not by the ring again.
    assert during - before < queue + bound // 4, (during - before, queue)
    # What could not be kept meanwhile is counted, not lost unsaid.
    assert dropped_during > 0
    # The snapshot holds the ring as it was when asked for, whole.
    snap = taken[0]
    assert snap.records == sum(count for _, count in at_snapshot)
    records = list(read_records(snap.file))
    marker = next(r for r in records if r["k"] == "snapshot")
    assert marker["ring"] == at_snapshot[0][0]
    bodies = [r for r in records if r["k"] == "ws"]
    assert len(bodies) >= bound // (16 * KiB)
    # And once written, the ring moves on: a gap record says what it missed.
    assert after_write[-1][0] > at_snapshot[-1][0]
    gaps = [r["dropped"] for r in read_records(later.file) if r["k"] == "gap"]
    assert sum(gaps) >= dropped_during, (gaps, dropped_during)


def test_the_ring_keeps_a_snapshots_parts_until_each_is_written() -> None:
    """The parts a snapshot holds stay in the ring's count, and the ring
    takes nothing that would carry it past its bound, until the snapshot
    says it has written them; then it evicts them as it would have."""
    ring = Ring(100)
    for at in range(1, 4):
        ring.add(at * S, [bytes([96 + at]) * 40])
    assert [p.data[:1] for p in ring.parts] == [b"a", b"b", b"c"] and ring.has_room()
    held = ring.hold(ring.since(None))
    assert held.bytes == 120 and not ring.has_room()  # what it must keep reaches the bound
    assert [p.data[:1] for p in held.parts] == [b"a", b"b", b"c"]
    first = held.next()
    assert first is not None and first.data[:1] == b"a"
    held.written(first)
    assert held.bytes == 80 and ring.has_room()
    ring.add(4 * S, [b"d" * 40])  # evicts what was written, never what is held
    assert [p.data[:1] for p in ring.parts] == [b"b", b"c", b"d"]
    assert not ring.has_room()
    ring.evict(10_000 * S)  # no time bound here; held parts stay whatever it is
    held.close()  # written, or given up: all let go
    assert held.bytes == 0 and not held.parts and ring.has_room()
    ring.add(5 * S, [b"e" * 40])
    assert [p.data[:1] for p in ring.parts] == [b"c", b"d", b"e"]


def test_a_ring_in_seconds_keeps_held_parts_until_written() -> None:
    ring = Ring(64 * MiB, max_seconds=60)
    ring.add(1 * S, [b"a" * 10])
    ring.add(2 * S, [b"b" * 10])
    held = ring.hold(ring.since(2 * S))  # the last part only
    ring.evict(3600 * S)
    assert [p.data for p in ring.parts] == [b"b" * 10]  # the older one went
    held.close()
    ring.evict(3600 * S)
    assert not ring.parts and ring.bytes == 0
