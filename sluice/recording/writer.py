"""The recorder tap: frames in on the proxy's hot path, files out on a writer task.

On the hot path the frames of a read become their packed records as soon
as the read is handled (redaction, payload policy), while they are still
in the CPU's caches: done later, in the writer task, the same work took
measurably longer and kept every frame alive until then (bench/README.md).
The bytes go to a queue bounded in records and in bytes; the records of
reads a compiled relay step carried are laid out in compiled code into one
buffer (``RecordSink``, rust/src/record.rs) under the same bounds, with no
Python object per record, and taken into the queue, in order, before
anything else is queued and whenever the writer takes. The writer task
takes them in batches and writes them from a worker thread, flushing every
``flush_interval`` seconds, and rotates files by size and age.

Recording never stalls traffic: when the queue is full (a slow disk) or the
disk fails (full, unwritable, over a file-size limit), frames are dropped
and counted, and the next file write starts with a ``gap`` record saying how
many. ``lossless=True`` makes the proxy wait for queue space instead, for
captures that must be complete.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import msgpack
import trio

from sluice import __version__
from sluice.protocols import registry
from sluice.protocols.core import Closed, Conn, Event, FaultInjected, Filtered, Opened
from sluice.protocols.registry import ProtocolSpec
from sluice.recording.format import (
    SUFFIX,
    NamedFrames,
    PayloadPolicy,
    Record,
    header,
    pack,
    packer,
)
from sluice.recording.retention import Removed, Retention, enforce, hold
from sluice.recording.ring import Hold, Ring, needed, newest_within, restate
from sluice.recording.triggers import Trigger

try:  # the compiled steps' record buffer (rust/src/record.rs)
    from sluice._frames import RecordSink
except ImportError:  # a source tree nobody built: every record is queued here
    RecordSink = None  # type: ignore[assignment,misc]

log = logging.getLogger("sluice.recorder")

_RECORDED_EVENTS = frozenset({Opened, Closed, FaultInjected, Filtered})
_DIRECTION = (1, 0)  # the recorded direction, indexed by "from the client"
_mono_ns, _wall_ns = time.monotonic_ns, time.time_ns  # read for every frame

# Packed records are handed to the file (a worker thread's write) once this
# many bytes are waiting, or at the flush interval, whichever comes first:
# one thread round trip per read would cost more than the records. The
# writer task is woken by the same amount queued (records are packed as
# they are queued, so there is nothing to do for them sooner), by records
# that are not frames, and by its clock: never once per read, which at low
# rates would be a wake-up, timers and cancel scopes for every frame.
WRITE_BYTES = 1024 * 1024

# Recordings hold payloads, topics and clients' addresses: their files and
# the directories made for them are the proxy's user's (and group's), never
# every user's (the umask may take more away).
FILE_MODE = 0o640
DIRECTORY_MODE = 0o750


class Summarizer(Protocol):
    """Turns a protocol's frames into ``frame`` records (the protocol's
    ``ProtocolSpec.summarizer``), keeping what it needs per connection."""

    def record(
        self, conn: int, direction: int, mono_ns: int, wall_ns: int, frame: Any
    ) -> Record: ...

    def packed(
        self, conn: int, direction: int, mono_ns: int, wall_ns: int, frames: Sequence[Any]
    ) -> list[bytes]:
        """``record()`` of each frame of one read, packed."""
        ...

    def forget(self, conn: int) -> None: ...

    # The payloads code a compiled relay step lays this protocol's frame
    # records out with (rust/src/record.rs), or None.
    compiled_code: int | None


@dataclass(frozen=True)
class RecorderConfig:
    directory: Path
    payloads: PayloadPolicy = PayloadPolicy.HASH
    lossless: bool = False
    max_file_bytes: int = 256 * 1024 * 1024
    max_file_age: float = 3600.0
    flush_interval: float = 1.0
    queue_frames: int = 50_000
    queue_bytes: int = 64 * 1024 * 1024
    # Bounded space: the directory's whole size and its files' age (None:
    # unbounded). See sluice.recording.retention.
    retain_bytes: int | None = None
    retain_age: float | None = None
    # The flight recorder: keep the recent past in memory only (this many
    # bytes, and no older than ring_seconds), written out by snapshots.
    ring_bytes: int | None = None
    ring_seconds: float | None = None
    # Rules that take a snapshot by themselves (needs the ring).
    triggers: tuple[Trigger, ...] = ()
    # What the protocol's frames decode with besides their bytes
    # (``ProtocolSpec.recorded``: Cursus's broker compression), written in
    # every file's header (``decoding``) for its readers.
    decoding: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ring(self) -> bool:
        return self.ring_bytes is not None or self.ring_seconds is not None


# After disk trouble, a new file is tried this often.
RETRY_SECONDS = 2.0

# A snapshot a rule asked for, due while another is being written, is
# tried again this much later.
BUSY_RETRY = 0.1

# A ring given in seconds alone is still bounded in memory by this.
RING_BYTES_WITH_SECONDS = 256 * 1024 * 1024


class SnapshotError(Exception):
    """A snapshot that cannot be taken (no ring); the message says why."""


class SnapshotBusy(SnapshotError):
    """Another snapshot is being written now."""


@dataclass(frozen=True)
class Snapshot:
    directory: Path  # the snapshot's own capture directory
    file: Path
    records: int
    bytes: int
    seconds: float  # how far back it goes


class Recorder:
    def __init__(
        self,
        config: RecorderConfig,
        *,
        listen: list[str] | None = None,
        broker: str = "",
        protocol: ProtocolSpec | None = None,
        writers: int = 1,
    ) -> None:
        self.config = config
        # When recording began: the first segment's ``started``, so that no
        # record in it is older than its header (the file is made when the
        # first records are written, a moment after they were taken).
        self._began_ns = time.time_ns()
        # Bounded space (sluice.recording.retention): this writer writes a
        # quantum after a pass that left room for every writer's quantum, and
        # files rotate at the retention's cap. A snapshot is written after a
        # pass that left room for it and for every other writer's snapshot
        # (each at most a writer's share of the budget).
        self._retention = Retention(config.retain_bytes, config.retain_age)
        self._writers = writers
        self._file_cap = self._retention.file_cap(config.max_file_bytes, writers)
        self._quantum = self._retention.quantum(writers)
        self._allowance = 0  # bytes this writer may still write before a pass
        self._room_at = 0.0  # after a pass that could not make room: when to try again
        self._no_room_logged = False
        self._retained_at = 0.0
        self.removed_files_total = 0
        self.removed_bytes_total = 0
        # The flight recorder's ring (None: recording to files), the conn
        # records of connections closed while their records may still be in
        # it (with when they closed), and snapshots.
        self._ring: Ring | None = None
        if config.ring:
            self._ring = Ring(config.ring_bytes or RING_BYTES_WITH_SECONDS, config.ring_seconds)
        self._closed: dict[int, tuple[Record, int]] = {}
        self._snapshotting = False
        self._snapshot_seq = 0
        self.snapshots_total: dict[str, int] = {}
        self._triggers = list(config.triggers) if self._ring is not None else []
        # Snapshots triggers asked for: when to write them, and what fired.
        self._pending: list[tuple[float, Trigger, float, Record]] = []
        spec = protocol if protocol is not None else registry.get(registry.DEFAULT_PROTOCOL)
        self.protocol = spec.name
        self._decode = spec.decode_with(config.decoding)
        self.capture = uuid.uuid4().hex[:12]
        self._listen = listen or []
        self._broker = broker
        # Packed records waiting for the writer task: each entry one record,
        # or (taken from the sink) many; how many frames each holds (0: a
        # record that is not a frame); which are connection openings (by
        # position), for a new file to skip.
        self._queue: list[bytes] = []
        self._queue_counts: list[int] = []
        self._queued_opens: list[tuple[int, int]] = []  # (position, connection)
        self._queued_closes: list[tuple[int, int]] = []  # (position, connection)
        self._queued_records = 0
        self._queued_frames = 0
        self._queued_bytes = 0
        self._lossless = config.lossless
        self._max_frames = config.queue_frames
        self._max_bytes = config.queue_bytes
        # The writer is woken once this much is queued (well before a bound).
        self._wake_bytes = min(WRITE_BYTES, config.queue_bytes // 2)
        self._wake_frames = config.queue_frames // 2
        self._wakeup = trio.Event()
        self._space = trio.Event()
        # The trio run the writer runs in, once it runs: taps may be called
        # from a relay thread (sluice/proxy/relay_thread.py), which wakes the
        # writer through it.
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake_asked = False
        self._dropped = 0  # since the last gap record
        # Frame records: the same kinds for every protocol, its own summaries.
        make = spec.load(spec.summarizer) if spec.summarizer is not None else NamedFrames
        self._summarizer: Summarizer = make(config.payloads)
        self._frame_records = self._summarizer.packed
        self._pack = packer()
        # Where compiled relay steps lay out their reads' records (None: the
        # records are laid out here; lossless: every read waits for room).
        self._sink: Any = None
        self._sink_dropped = 0  # the sink's drops already counted in _dropped
        # (a protocol's summarizer may say nothing of compiled code: none)
        compiled = getattr(self._summarizer, "compiled_code", None) is not None
        if RecordSink is not None and compiled and not self._lossless:
            self._sink = RecordSink(self._max_frames, self._max_bytes, self._wake_frames,
                                    self._wake_bytes, self._wake)  # fmt: skip
        # Records taken off the queue and waiting to be written, as queued:
        # the frames of each entry, and which are connection openings (by
        # position).
        self._packed: list[bytes] = []
        self._packed_counts: list[int] = []
        self._packed_bytes = 0
        self._packed_frames = 0
        self._packed_opens: list[tuple[int, int]] = []  # (position, connection)
        self._packed_closes: list[tuple[int, int]] = []  # (position, connection)
        self._open: dict[int, Record] = {}  # conn records, repeated in new segments
        # Connections closed whose close record no file holds yet, as a new
        # segment re-states them (as at the close): their last frames and
        # their close may be written to a file started after the close.
        self._closing: dict[int, Record] = {}
        self._conns: dict[int, Conn] = {}  # their connections, for what the core learned
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._file_frames = 0  # frame records handed to the open file
        self._file_first = 0  # the size of its header record
        self._file_header = 0  # the header and restated connections of the open file
        self._file_started = 0.0
        self._segment = 0
        self._last_stamp = ""  # the newest time a file name of this capture holds
        self._retry_at = 0.0
        self._failing = False  # in an episode of disk trouble
        self._dropped_at_failure = 0
        self.files: list[Path] = []
        self._reported_bug = False
        # Frames handed to the file since it was last flushed: lost, and
        # counted as dropped, if the flush or close fails (a full disk).
        self._unflushed = 0
        self._last_flush = 0.0  # (trio's clock) when the writer last flushed
        # Drops that gap records handed to the file since then say: said
        # again by the next gap record if the flush or close fails.
        self._unflushed_gaps = 0
        # Figures the proxy exports as sluice_recorder_* metrics.
        self.frames_written = 0
        self.bytes_written = 0
        self._dropped_total = 0  # by this class (the sink counts its own)
        self.failures_total = 0  # episodes of disk trouble

    @property
    def queued(self) -> int:
        """Records queued for the writer (the sink's too)."""
        return self._queued_records + (self._sink.frames if self._sink is not None else 0)

    @property
    def dropped_total(self) -> int:
        """Frames not recorded since the start (the sink's too)."""
        return self._dropped_total + (self._sink.dropped if self._sink is not None else 0)

    # --- the tap -------------------------------------------------------------

    def event(self, conn: Conn | None, event: Event) -> None:
        kind = type(event)
        if self._triggers and conn is not None:
            self._check_triggers(conn, event)
        if conn is None or kind not in _RECORDED_EVENTS:
            return
        if kind is Opened:
            self._conns[conn.id] = conn
            self.open_connection(
                conn.id,
                client=conn.client,
                kind=conn.kind,
                listener=conn.listener,
                broker=conn.broker,
                via=conn.via,
            )
        elif kind is Closed:
            assert isinstance(event, Closed)
            self.close_connection(conn.id, event.reason)
        elif kind is FaultInjected:
            assert isinstance(event, FaultInjected)
            self.note_fault(conn.id, event)
        elif kind is Filtered:
            assert isinstance(event, Filtered)
            self.note_filter(conn.id, event)

    # --- hot path ----------------------------------------------------------

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        """Queue the records of one read's frames, all with the time of the
        read; when the queue is full, drop them (counted) unless lossless.

        In lossless mode callers wait for ``room()`` before reading more
        traffic, so the queue overshoots its bounds by at most one read per
        reading task; so does it otherwise, as the bounds are checked once
        per call.
        """
        if not frames:
            return
        self._take_sink()
        if not self._lossless and (
            self._queued_records >= self._max_frames or self._queued_bytes >= self._max_bytes
        ):
            self._drop(len(frames))
            return
        try:
            records = self._frame_records(
                conn.id, _DIRECTION[from_client], _mono_ns(), _wall_ns(), frames
            )
        except Exception as exc:  # a recorder bug must never break traffic
            self._bug(exc)
            self._drop(len(frames))
            return
        self._queue_frames(records, sum(map(len, records)))

    def quick_records(self, conn: Conn) -> tuple[Any, int] | None:
        """Where a compiled relay step may lay out the frame records of the
        reads it carries for ``conn`` (the ``RecordSink``), and the payloads
        code it lays them out with; None when every read must come through
        ``frames``: a protocol whose records are laid out in Python, a
        lossless recorder (the relay waits for room first), a connection id
        wider than the record's, or a snapshot rule on slow answers (it
        looks at each read's receipt times)."""
        code = getattr(self._summarizer, "compiled_code", None)
        if code is None or self._sink is None or conn.id > 0xFFFFFFFF:
            return None
        if any(trigger.on == "slow" for trigger in self._triggers):
            return None
        return self._sink, code

    def set_triggers(self, triggers: Sequence[Trigger]) -> None:
        """A reloaded configuration's snapshot rules (the flight recorder's:
        none without a ring)."""
        self._triggers = list(triggers) if self._ring is not None else []

    def _queue_frames(self, records: list[bytes], size: int) -> None:
        self._queue += records
        self._queue_counts += [1] * len(records)
        self._queued_records += len(records)
        self._queued_frames += len(records)
        self._queued_bytes += size
        if self._queued_bytes >= self._wake_bytes or self._queued_frames >= self._wake_frames:
            self._wake()

    def _take_sink(self) -> None:
        """Queue what compiled steps laid out in the sink since it was last
        taken, with the drops it counted: before anything else is queued,
        so that records stay in the order they were made (a connection's
        opening before its frames, its frames before its close)."""
        sink = self._sink
        if sink is None:
            return
        data, count = sink.take(self._queued_records, self._queued_bytes)
        dropped = sink.dropped - self._sink_dropped
        if dropped:
            self._sink_dropped += dropped
            self._dropped += dropped
        if count:
            self._queue.append(data)
            self._queue_counts.append(count)
            self._queued_records += count
            self._queued_frames += count
            self._queued_bytes += len(data)

    async def room(self) -> None:
        """In lossless mode, wait until the queue has space again. Every
        reader waiting (both directions of every connection may) waits for
        the one event the writer sets next, made anew only once set."""
        while (
            self._queued_records >= self.config.queue_frames
            or self._queued_bytes >= self.config.queue_bytes
        ):
            if self._space.is_set():
                self._space = trio.Event()
            await self._space.wait()

    def open_connection(self, conn: int, *, client: str, kind: str, listener: str,
                        broker: str = "", via: str = "") -> None:  # fmt: skip
        record: dict[str, Any] = {
            "k": "conn",
            "c": conn,
            "t": time.monotonic_ns(),
            "w": time.time_ns(),
            "client": client,
            "broker": broker,
            "kind": kind,
            "listener": listener,
        }
        if via:  # a balancer's PROXY header named the client
            record["via"] = via
        self._open[conn] = record
        self._enqueue(record, opens=conn)

    def close_connection(self, conn: int, reason: str = "") -> None:
        self._summarizer.forget(conn)
        opened = self._open.get(conn)
        if opened is not None and self._ring is not None:
            self._closed[conn] = (self._restated(opened), time.monotonic_ns())
        elif opened is not None:
            self._closing[conn] = self._restated(opened)
        self._conns.pop(conn, None)
        if self._open.pop(conn, None) is None:
            return
        record = {"k": "close", "c": conn, "t": time.monotonic_ns(), "w": time.time_ns(),
                  "reason": reason}  # fmt: skip
        self._enqueue(record, closes=conn)

    def note_fault(self, conn: int, fault: FaultInjected) -> None:
        """An annotation: a fault rule acted on the frame recorded just before
        (or, for a frame Sluice wrote itself, just after) this record."""
        record = {"k": "fault", "c": conn, "t": time.monotonic_ns(), "w": time.time_ns(),
                  "rule": fault.rule, "action": fault.action, "cmd": fault.command,
                  "d": 0 if fault.from_client else 1}  # fmt: skip
        if fault.topic:
            record["topic"] = fault.topic
        self._enqueue(record)

    def note_filter(self, conn: int, filtered: Filtered) -> None:
        """An annotation: a message filter acted on the frame recorded just
        before this record (which keeps it as it came). A changed frame is
        kept as it went on too (``sent``), under the same payload policy and
        with credentials taken out as in a frame record."""
        record: Record = {"k": "filter", "c": conn, "t": time.monotonic_ns(),
                          "w": time.time_ns(), "filter": filtered.filter,
                          "action": filtered.action, "d": 0 if filtered.from_client else 1,
                          "n": filtered.messages}  # fmt: skip
        if filtered.topic:
            record["topic"] = filtered.topic
        if filtered.reason:
            record["reason"] = filtered.reason
        if filtered.sent is not None:
            frame = self._decode(filtered.sent, filtered.from_client)
            sent = self._summarizer.record(conn, record["d"], record["t"], record["w"], frame)
            kept = ("n", "raw", "p", "redacted")
            record["sent"] = {key: sent[key] for key in kept if key in sent}
        self._enqueue(record)

    def note(self, record: Record) -> None:
        """Queue a record that is traffic but not one of the protocol's
        frames (an HTTP exchange, a WebSocket frame: ``http``, ``ws``),
        counted and dropped as frames are (unless lossless: these callers
        cannot wait for room, so the queue may overshoot by their records)."""
        self._take_sink()
        if not self._lossless and (
            self._queued_records >= self._max_frames or self._queued_bytes >= self._max_bytes
        ):
            self._drop(1)
            return
        try:
            data = self._pack(record)
        except Exception as exc:  # a recorder bug must never break traffic
            self._bug(exc)
            self._drop(1)
            return
        self._queue_frames([data], len(data))

    def _enqueue(self, record: Record, opens: int | None = None, closes: int | None = None) -> None:
        """Queue a record that is not a frame's (never dropped: they are
        few); ``opens``, ``closes``: it is the opening, the close of that
        connection."""
        data = self._pack(record)
        self._take_sink()
        if opens is not None:
            self._queued_opens.append((len(self._queue), opens))
        if closes is not None:
            self._queued_closes.append((len(self._queue), closes))
        self._queue.append(data)
        self._queue_counts.append(0)
        self._queued_records += 1
        self._queued_bytes += len(data)
        self._wake()

    def _wake(self) -> None:
        """Wake the writer, from trio or from a relay thread (once until
        it is woken: every read past the threshold calls this)."""
        if trio.lowlevel.in_trio_run():
            self._wakeup.set()
        elif not self._wake_asked and self._token is not None and not self._wakeup.is_set():
            self._wake_asked = True
            self._token.run_sync_soon(self._woken)

    def _woken(self) -> None:
        self._wake_asked = False
        self._wakeup.set()

    def _drop(self, n: int) -> None:
        self._dropped += n
        self._dropped_total += n

    # --- writer ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.config.directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
        _warn_if_open(self.config.directory)
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        self._last_flush = trio.current_time()
        try:
            while True:
                if not self._wakeup.is_set():
                    with trio.move_on_after(self._next_wake()):
                        await self._wakeup.wait()
                self._wakeup = trio.Event()
                # A batch taken off the queue is always written: cancelling
                # (shutdown) must not lose it between the queue and the file.
                with trio.CancelScope(shield=True):
                    try:
                        ring = self._ring
                        if ring is None:
                            self._take_queued()
                        now = trio.current_time()
                        if ring is not None:
                            # Not while a snapshot being written holds the
                            # ring's bound: the records wait in the queue,
                            # bounded on its own (ring.Hold).
                            if ring.has_room():
                                self._take_queued()
                                self._to_ring()
                            if self._pending:
                                await self._save_due()
                            self._say_storms(force=False)
                        elif now - self._last_flush >= self.config.flush_interval:
                            await self._write_packed()
                            if self._file is not None:
                                await self._flush()
                            self._last_flush = now
                        elif self._packed_bytes >= WRITE_BYTES or self._file is None:
                            await self._write_packed()
                        if self.config.retain_age is not None and now - self._retained_at >= min(
                            10.0, self.config.retain_age / 4
                        ):
                            await self._retain(headroom=0)
                    except Exception as exc:  # recording must never take the proxy down
                        self._bug(exc)
                        await self._close_file()
        finally:
            self._say_storms(force=True)
            with trio.CancelScope(shield=True):
                self._take_queued()
                if self._ring is None:
                    if self._dropped and not self._packed:
                        # Drops no record followed (a flush that failed last):
                        # their gap record goes on its own.
                        gap = pack({"k": "gap", "t": time.monotonic_ns(), "w": time.time_ns(),
                                    "dropped": self._dropped})  # fmt: skip
                        self._dropped = 0
                        self._packed.append(gap)
                        self._packed_counts.append(0)
                        self._packed_bytes += len(gap)
                    await self._write_packed()
                await self._close_file()

    def _next_wake(self) -> float:
        """Seconds until the writer has work by the clock: the next flush
        (a flush interval after the last one, however often records woke
        the writer meanwhile: what ``kill -9`` can lose is at most that
        interval), or sooner a snapshot a trigger asked for."""
        wait = self.config.flush_interval
        if self._ring is None:
            wait = max(0.0, self._last_flush + wait - trio.current_time())
        if self._pending:
            due = min(p[0] for p in self._pending) - time.monotonic()
            wait = max(0.0, min(wait, due))
        return wait

    # --- the flight recorder's ring ----------------------------------------

    def _say_storms(self, *, force: bool) -> None:
        """Log what each rule's storm of unsaved firings left unsaid, once
        due (``Trigger.summary``); ``force``: all of it, on closing."""
        now = time.monotonic()
        for trigger in self._triggers:
            if (line := trigger.summary(now, force=force)) is not None:
                log.info("%s", line)

    def _check_triggers(self, conn: Conn, event: Event) -> None:
        for trigger in self._triggers:
            found = trigger.fires(self.protocol, event)
            if found is None:
                continue
            now = time.monotonic()
            save, storm = trigger.fire(now)  # a storm: one line per STORM_LOG_EVERY
            if storm is not None:
                log.info("%s", storm)
            if not save:
                continue
            note: Record = {"rule": trigger.id, "on": trigger.on, "c": conn.id, **found}
            # Where it happened, in the stream itself.
            self._enqueue({"k": "trigger", "t": time.monotonic_ns(), "w": time.time_ns(),
                           **note})  # fmt: skip
            self._pending.append((now + trigger.after, trigger, now, note))
            self._wake()  # to wait until it is due
            log.warning("snapshot rule %s fired on conn-%d %s: %s; saving %gs before and %gs "
                        "after", trigger.id, conn.id, conn.client,
                        " ".join(f"{k}={v}" for k, v in found.items()), trigger.before,
                        trigger.after)  # fmt: skip

    async def _save_due(self) -> None:
        """Write the snapshots triggers asked for, once their ``after`` is over."""
        now = time.monotonic()
        for item in [p for p in self._pending if p[0] <= now]:
            _, trigger, fired_at, note = item
            try:
                await self.snapshot(last=now - fired_at + trigger.before, reason=trigger.id,
                                    note=note)  # fmt: skip
            except SnapshotBusy:
                # An on-demand one is being written: again a little later
                # (not at once: the writer would go round without a pause
                # for as long as that write lasts). What it covers is from
                # when the rule fired, whenever it is written.
                self._pending[self._pending.index(item)] = (now + BUSY_RETRY, *item[1:])
                continue
            except Exception as exc:  # given up, never retried in a loop
                log.error("snapshot for rule %s failed: %s", trigger.id, exc)
            self._pending.remove(item)
            trigger.saved += 1

    def _to_ring(self) -> None:
        """What the disk would have got goes to the ring."""
        assert self._ring is not None
        packed = self._packed
        # An entry holds its frames' records (a compiled step's, several),
        # or one record that is not a frame's (counted 0).
        records = sum(max(count, 1) for count in self._packed_counts)
        if self._dropped:
            gap = {"k": "gap", "t": time.monotonic_ns(), "w": time.time_ns(),
                   "dropped": self._dropped}  # fmt: skip
            packed = [pack(gap), *packed]
            records += 1
            self._dropped = 0
        self.frames_written += self._packed_frames
        self._packed, self._packed_opens, self._packed_counts = [], [], []
        self._packed_closes = []
        self._packed_bytes = self._packed_frames = 0
        now = time.monotonic_ns()
        self._ring.add(now, packed, records)
        self._ring.evict(now)
        # A connection's conn record is needed while any of its records may
        # be in the ring: until a part taken after it closed is evicted.
        gone = self._ring.evicted_until_ns
        if gone is not None and self._closed:
            for conn in [c for c, (_, closed) in self._closed.items() if closed < gone]:
                del self._closed[conn]

    @property
    def ring_bytes(self) -> int:
        return self._ring.bytes if self._ring is not None else 0

    async def snapshot(
        self, *, last: float | None = None, reason: str = "", name: str = "",
        note: Record | None = None,
    ) -> Snapshot:  # fmt: skip
        """Write the ring (its last ``last`` seconds) to a new capture
        directory in the recording directory: ``name``, or one named after
        the time and ``reason``. ``note`` goes in as a record after the
        restated connections (what fired a trigger)."""
        ring = self._ring
        if ring is None:
            raise SnapshotError("snapshots need the flight recorder: start with --record-ring")
        if self._snapshotting:
            raise SnapshotBusy("a snapshot is being written; try again when it is done")
        self._snapshotting = True
        # Its parts stay in the ring's bound until each is written, and only
        # ``held`` holds them, so that each may go once written (ring.Hold).
        held: Hold | None = None
        try:
            self._take_queued()
            self._to_ring()
            now_ns = time.monotonic_ns()
            start = None if last is None else now_ns - int(last * 1e9)
            held = ring.hold(ring.since(start))
            oldest = held.parts[0].mono_ns if held.parts else now_ns
            seconds = (now_ns - oldest) / 1e9 if last is None else last
            stamp = self._stamp()
            directory = self.config.directory / (name or snapshot_name(stamp, reason))
            self._snapshot_seq += 1
            path = directory / f"sluice-{stamp}-{self.capture}-{self._snapshot_seq:04d}{SUFFIX}"
            first: list[Record] = [self._header(self._snapshot_seq)]
            open_records = {c: self._restated(r) for c, r in self._open.items()}
            closed = {c: r for c, (r, _) in self._closed.items()}
            marker: Record = {"k": "snapshot", "t": now_ns, "w": time.time_ns(),
                              "reason": reason or "on demand", "seconds": seconds}  # fmt: skip
            if note:
                marker.update(note)
            # The ring number of the first record after it (the largest it
            # can be, while the head is measured against the share).
            marker["ring"] = ring.records

            def write(held: Hold) -> tuple[int, int, Removed]:
                chosen = held.parts
                share = self._snapshot_share()
                if share is not None:  # the newest parts that fit, with any restatement
                    every = needed(chosen)
                    most = every.connections | every.opened
                    longest = len(pack_all([*first, *restate(most, open_records, closed), marker]))
                    held.keep_newest(len(newest_within(list(chosen), share - longest)))
                need = needed(chosen)
                counted = sum(p.records for p in chosen)
                if chosen:
                    marker["ring"] = chosen[0].first
                if need.records != counted:
                    # Counted wrong somewhere: no numbers rather than wrong
                    # ones (a reader would skip records no other file holds).
                    log.error("snapshot: the ring's parts hold %d records, not %d as counted",
                              need.records, counted)  # fmt: skip
                    del marker["ring"]
                # It starts where its earliest record does, so offsets from
                # the header's start (sluice inspect --since) read from 0: in
                # any part (an HTTP exchange is written when it ends, with the
                # time it began, in a part later than records after that).
                walls = [w for w in map(_first_wall, (p.data for p in chosen)) if w is not None]
                began = min(walls, default=None)
                if began is not None:
                    first[0] = self._header(self._snapshot_seq, min(began, first[0]["started"]))
                head = pack_all([*first, *restate(need.connections, open_records, closed), marker])
                size = len(head) + held.bytes
                removed = Removed()
                if share is not None:
                    if size > share:
                        raise SnapshotError(
                            f"a snapshot of {size} bytes would not fit this writer's share of "
                            f"--record-retain-bytes ({share} bytes)"
                        )
                    removed = self._make_room(size + share * (self._writers - 1))
                directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
                if directory.is_symlink():  # planted: what it points at is not ours
                    raise SnapshotError(f"{directory} is a symbolic link: not written through")
                handle = open(path, "wb", opener=create_new)  # noqa: SIM115 (closed below)
                try:
                    with handle:
                        hold(handle.fileno())
                        handle.write(head)
                        while (part := held.next()) is not None:
                            handle.write(part.data)
                            held.written(part)  # the ring may let it go now
                except BaseException:
                    # Cut (the disk full, a file size limit): no file rather
                    # than one that reads as a damaged capture of the moment.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    if self._writers == 1:  # (other workers may be writing theirs there)
                        with contextlib.suppress(OSError):
                            directory.rmdir()  # only if empty
                    raise
                return need.records, size, removed

            records, size, removed = await self._io(write, held)
            self._removed(removed)
            label = (note or {}).get("rule") or "on_demand"
            self.snapshots_total[label] = self.snapshots_total.get(label, 0) + 1
            log.warning("snapshot (%s) of the last %.1f s: %s, %d records, %d bytes",
                        reason or "on demand", seconds, directory, records, size)  # fmt: skip
            return Snapshot(directory, path, records, size, seconds)
        finally:
            if held is not None:
                held.close()  # written, or given up
                self._wake()  # the ring has room again: the queue waits
            self._snapshotting = False

    def _take_queued(self) -> None:
        """Take what is queued (records packed when they were made)."""
        self._take_sink()
        queue = self._queue
        if not queue:
            return
        offset = len(self._packed)
        self._packed.extend(queue)
        self._packed_counts.extend(self._queue_counts)
        self._packed_opens.extend((offset + at, conn) for at, conn in self._queued_opens)
        self._packed_closes.extend((offset + at, conn) for at, conn in self._queued_closes)
        self._packed_bytes += self._queued_bytes
        self._packed_frames += self._queued_frames
        self._queue = []
        self._queue_counts = []
        self._queued_opens = []
        self._queued_closes = []
        self._queued_bytes = self._queued_frames = self._queued_records = 0
        self._take_sink()  # nothing (one thread runs this code): the sink learns the queue is empty
        self._space.set()

    async def _write_packed(self) -> None:
        """Write the records taken off the queue: each file takes whole
        records up to the file cap (one at least), and each part is written
        once there is room for it under --record-retain-bytes."""
        if not self._packed:
            return
        packed, counts, open_at = self._packed, self._packed_counts, dict(self._packed_opens)
        close_at = dict(self._packed_closes)
        left = self._packed_bytes  # the bytes of packed[start:]
        self._packed, self._packed_opens, self._packed_counts = [], [], []
        self._packed_closes = []
        self._packed_bytes = self._packed_frames = 0
        sums = list(itertools.accumulate(counts, initial=0))
        apart = False  # entries of many records (a sink's) taken apart

        def frames(start: int, end: int) -> int:  # the frame records among packed[start:end]
            return sums[end] - sums[start]

        def done(end: int) -> None:  # packed[:end] written (or dropped): their closes too
            for at, conn in close_at.items():
                if at < end:
                    self._closing.pop(conn, None)

        start = 0
        while start < len(packed):
            dropped = self._dropped
            gap = b""
            if dropped:
                gap = pack({"k": "gap", "t": time.monotonic_ns(), "w": time.time_ns(),
                            "dropped": dropped})  # fmt: skip
            if not apart and left > self._file_cap - self._file_bytes * bool(self._file) - len(gap):
                # Not all for this file, which takes whole records: an entry
                # of many is taken apart (once a file's worth, not per read).
                apart = True
                packed, counts, (open_at, close_at) = one_record_each(
                    packed, counts, (open_at, close_at), start
                )
                start = 0
                sums = list(itertools.accumulate(counts, initial=0))
            # (Connections whose opening is in what is left to write: a new
            # file's head leaves them to it, not re-stated.)
            opening = frozenset(conn for at, conn in open_at.items() if at >= start)
            restated = await self._ensure_file(len(gap) + len(packed[start]), opening)
            if restated is None:
                self._drop(frames(start, len(packed)))
                done(len(packed))
                return
            room = self._cap() - self._file_bytes - len(gap)
            if left <= room:  # nearly always: no walk through the records
                end, size = len(packed), left
            else:
                if not apart:  # as above (a new file's header took room)
                    apart = True
                    packed, counts, (open_at, close_at) = one_record_each(
                        packed, counts, (open_at, close_at), start
                    )
                    start = 0
                    sums = list(itertools.accumulate(counts, initial=0))
                end, size = start + 1, len(packed[start])
                while end < len(packed) and size + len(packed[end]) <= room:
                    size += len(packed[end])
                    end += 1
            left -= size
            chunk = packed if start == 0 and end == len(packed) else packed[start:end]
            # A new file starts by re-stating open connections: skip their
            # records here so nobody reads a connection opening twice.
            skip = {at for at, conn in open_at.items() if start <= at < end and conn in restated}
            if skip:
                chunk = [part for at, part in enumerate(chunk, start) if at not in skip]
            data = b"".join(chunk)
            if gap:
                data = gap + data
            count = frames(start, end)
            start = end
            done(end)
            if not await self._reserve(len(data)):
                self._drop(count)
                continue
            assert self._file is not None
            try:
                await self._io(self._file.write, data)
            except OSError as exc:
                self._failed(exc)
                self._drop(count + frames(start, len(packed)))
                done(len(packed))
                await self._close_file()
                return
            self._dropped -= dropped
            self._unflushed_gaps += dropped
            self._unflushed += count
            self._file_frames += count
            self._file_bytes += len(data)
            self.frames_written += count
            self.bytes_written += len(data)

    async def _ensure_file(
        self, upcoming: int = 0, opening: frozenset[int] = frozenset()
    ) -> set[int] | None:
        """An open file to write to, with room for ``upcoming`` bytes under
        the file cap when it holds any: None if there is none (disk trouble,
        or no room in the directory); otherwise the connections a freshly
        started file re-stated. ``opening``: connections whose opening
        record is among those about to be written: not re-stated (marked as
        joined mid-stream), as they open in what follows."""
        now = trio.current_time()
        cap = self._cap()
        if self._file is not None and (
            (self._file_bytes + upcoming > cap and self._file_bytes > self._file_header)
            or self._file_bytes >= cap
            or now - self._file_started >= self.config.max_file_age
        ):
            await self._close_file()
        if self._file is not None:
            return set()
        if now < self._retry_at:
            return None
        segment = self._segment + 1
        stamp = self._stamp()
        path = self.config.directory / f"sluice-{stamp}-{self.capture}-{segment:04d}{SUFFIX}"
        head = [pack(self._header(segment, self._began_ns if segment == 1 else None))]
        self._file_first = len(head[0])
        head += [pack(self._restated(r)) for c, r in self._open.items() if c not in opening]
        head += [pack(record) for c, record in self._closing.items() if c not in opening]
        # Many connections to restate can make the head larger than this
        # writer may write between two retention passes: it is written in
        # pieces of whole records, each reserved as records are.
        first, *more = pieces(head, self._quantum)
        if not await self._reserve(len(first)):
            return None
        self._segment = segment
        try:
            # (made again if it was removed, as at the start)
            await self._io(functools.partial(self.config.directory.mkdir, parents=True,
                                             exist_ok=True, mode=DIRECTORY_MODE))  # fmt: skip
            handle = await self._io(functools.partial(open, path, "wb", opener=create_new))
            await self._io(hold, handle.fileno())  # being written: retention leaves it alone
            await self._io(handle.write, first)
        except OSError as exc:
            self._failed(exc)
            return None
        self._file = handle
        self._file_bytes = self._file_header = len(first)
        self._file_frames = 0
        self._file_started = now
        self.files.append(path)
        for piece in more:
            if not await self._reserve(len(piece)):  # the file is flushed for the pass
                await self._close_file()  # its head cut short: a new file tries again
                return None
            try:
                await self._io(handle.write, piece)
            except OSError as exc:
                self._failed(exc)
                await self._close_file()
                return None
            self._file_bytes = self._file_header = self._file_bytes + len(piece)
        # Each try during disk trouble is not a line of its own: the trouble
        # was said once, and its end will say where recording resumed.
        (log.debug if self._failing else log.info)("recording to %s", path)
        return (set(self._open) | set(self._closing)) - opening

    def _stamp(self) -> str:
        """The UTC time for a new file's name, never earlier than the last
        one's: readers take a directory's files in name order, so a wall
        clock set back must not put a capture's later files before its
        earlier ones."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._last_stamp = max(stamp, self._last_stamp)
        return self._last_stamp

    def _cap(self) -> int:
        """Where the open file rotates: at the file cap, or, when its head
        alone fills that, a cap's worth of records after its head (not a
        new file, and a new head, for every write)."""
        if self._file_header < self._file_cap:
            return self._file_cap
        return self._file_header + self._file_cap

    async def _reserve(self, size: int) -> bool:
        """Whether this writer may write ``size`` more bytes now under
        --record-retain-bytes (always, without it): from what is left of its
        quantum, or after a pass that made room for every writer's quantum.
        No: too large for a quantum, or no room could be made (dropped,
        counted, and said once)."""
        quantum = self._quantum
        if quantum is None:
            return True
        if size <= self._allowance:
            self._allowance -= size
            return True
        now = trio.current_time()
        if size <= quantum and now >= self._room_at:
            if self._file is not None:
                # The pass counts what this writer wrote from the file's
                # size: none of it may wait in the file's buffer.
                await self._flush()
                if self._file is None:  # the disk failed (said, and counted)
                    return False
            if await self._retain(headroom=quantum * self._writers):
                self._allowance = quantum - size
                return True
            self._room_at = now + 1.0  # try again in a while, not for every batch
        if not self._no_room_logged:  # once: the gap records and the counter say the rest
            self._no_room_logged = True
            why = (
                f"a record of {size} bytes is larger than a writer may write between two "
                f"passes ({quantum} bytes)"
                if size > quantum
                else "the oldest files could not make room (files being written)"
            )
            log.warning("recording under --record-retain-bytes: %s; frames that do not fit are "
                        "not recorded (counted, and a gap record says so)", why)  # fmt: skip
        return False

    def _snapshot_share(self) -> int | None:
        """The most one snapshot may take of --record-retain-bytes: the
        writers' equal share (None: no size bound)."""
        budget = self.config.retain_bytes
        return None if budget is None else budget // self._writers

    def _make_room(self, headroom: int) -> Removed:
        """A pass, in a worker thread, that leaves ``headroom`` free (or
        says why it cannot)."""
        removed = self._remove(headroom, None)
        if not self._retention.fits(removed, headroom):
            raise SnapshotError(
                f"no room for the snapshot under --record-retain-bytes: {removed.left} bytes "
                f"could not be removed (files being written), {headroom} needed"
            )
        return removed

    async def _retain(self, keep: Path | None = None, *, headroom: int) -> bool:
        """One retention pass (in a worker thread: it lists and removes
        files); never the file being written, nor ``keep``. Whether what is
        left plus ``headroom`` fits the size bound."""
        self._retained_at = trio.current_time()
        if keep is None and self._file is not None:
            keep = Path(self._file.name)
        try:
            removed = await self._io(self._remove, headroom, keep)
        except OSError as exc:
            log.warning("recording retention failed: %s", exc)
            return False
        self._removed(removed)
        return self._retention.fits(removed, headroom)

    def _remove(self, headroom: int, keep: Path | None) -> Removed:
        return enforce(self.config.directory, self._retention, headroom=headroom,
                       now=time.time(), keep=keep)  # fmt: skip

    def _removed(self, removed: Removed) -> None:
        self.removed_files_total += removed.files
        self.removed_bytes_total += removed.bytes

    def _header(self, segment: int, started_ns: int | None = None) -> Record:
        """The first record of a file this recorder writes (segment or
        snapshot); ``started_ns``: when what it holds began (default: now)."""
        return header(
            capture=self.capture,
            segment=segment,
            started_ns=time.time_ns() if started_ns is None else started_ns,
            payloads=self.config.payloads,
            sluice_version=__version__,
            protocol=self.protocol,
            host=socket.gethostname(),
            listen=self._listen,
            broker=self._broker,
            decoding=self.config.decoding,
        )

    def _restated(self, record: Record) -> Record:
        """A connection's record as a new segment (or a snapshot) re-states
        it: marked ``restated``, so a reader starting there knows it joins
        the connection mid-stream, and with the producers and consumers (and
        their topics) the core knows of, so it can name its frames' topics."""
        conn = self._conns.get(record["c"])
        state = conn.state if conn is not None else None
        producers = getattr(state, "producers", None)
        consumers = getattr(state, "consumers", None)
        if not producers and not consumers:
            return {**record, "restated": True}
        return {**record, "restated": True, "producers": dict(producers or {}),
                "consumers": dict(consumers or {})}  # fmt: skip

    def _bug(self, exc: Exception) -> None:
        if not self._reported_bug:
            log.error("recorder could not record a frame (dropped): %r", exc, exc_info=exc)
            self._reported_bug = True

    def _failed(self, exc: OSError) -> None:
        # Logged once per episode, which ends at the next successful flush;
        # meanwhile a new file is tried every RETRY_SECONDS.
        if not self._failing:
            log.error("recording failed, dropping frames until it works again: %s", exc)
            self._failing = True
            self.failures_total += 1
            self._dropped_at_failure = self.dropped_total
        self._retry_at = trio.current_time() + RETRY_SECONDS

    async def _flush(self) -> None:
        assert self._file is not None
        try:
            linked = await self._io(_flush_linked, self._file)
        except OSError as exc:
            self._failed(exc)
            await self._close_file()
            return
        self._unflushed = self._unflushed_gaps = 0
        if not linked:
            # Removed while written (the file, or the directory with it: an
            # operator freeing space; retention never removes a file being
            # written): what it holds is gone, and writing on would lose
            # every frame until the file rotates, unsaid. Counted as
            # dropped (the next file's gap record says so), said, and a
            # new file started (its directory made again if need be).
            lost = self._file_frames
            self._drop(lost)
            log.error("recording file %s was removed while being written: %d frames it "
                      "held are lost; recording goes on in a new file", self._file.name,
                      lost)  # fmt: skip
            await self._close_file()
            return
        if self._failing:
            self._failing = False
            log.warning(
                "recording resumed in %s: %d frames were not recorded",
                self._file.name,
                self.dropped_total - self._dropped_at_failure,
            )

    async def _close_file(self) -> None:
        handle, self._file = self._file, None
        if handle is None:
            return
        try:
            await self._io(handle.close)
        except OSError as exc:
            self._failed(exc)
            self._drop(self._unflushed)  # what was still buffered is gone
            self._dropped += self._unflushed_gaps  # (counted when dropped)
            # A file the failing disk left without a whole record (empty, or
            # cut inside its header: a full disk takes part of a write): it
            # holds nothing, and a try every RETRY_SECONDS would leave one
            # such file each time.
            with contextlib.suppress(OSError):
                if os.stat(handle.name).st_size < self._file_first:
                    os.unlink(handle.name)
        self._unflushed = self._unflushed_gaps = 0

    @staticmethod
    async def _io(fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)


def _warn_if_open(directory: Path) -> None:
    """Say so when other users may enter the recording directory (one made
    before, or by someone else: Sluice makes its own ``DIRECTORY_MODE``):
    its files are not theirs to read, but they can list them, and, where
    they may write, remove them or fill the disk under the proxy."""
    with contextlib.suppress(OSError):
        mode = directory.stat().st_mode
        if mode & 0o007:
            writable = " and remove" if mode & 0o002 and not mode & 0o1000 else ""
            log.warning("recording directory %s is open to other users (mode %04o): they can "
                        "list%s its files, which hold payloads, topics and addresses; "
                        "'chmod o-rwx' it", directory, mode & 0o7777, writable)  # fmt: skip


def _flush_linked(handle: IO[bytes]) -> bool:
    """Flush ``handle``; whether its file still has a name (not removed)."""
    handle.flush()
    return os.fstat(handle.fileno()).st_nlink > 0


def create_new(path: str, flags: int) -> int:
    """Open a new recording file (``open``'s opener) with ``FILE_MODE``:
    never one already there (FileExistsError), nor through a symlink
    planted at its name, which would write the recording where it points
    and truncate what is there."""
    return os.open(path, flags | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)


def private(path: str, flags: int) -> int:
    """``open``'s opener for a file a user names that holds recorded
    traffic (an export, a pcapng, a transcript, an anonymized copy or its
    report): created with ``FILE_MODE``, as recordings are, not readable by
    every user as the umask alone leaves it; a file already there keeps its
    own mode."""
    return os.open(path, flags, FILE_MODE)


def one_record_each(
    packed: list[bytes],
    counts: list[int],
    marks: tuple[dict[int, int], dict[int, int]],
    start: int,
) -> tuple[list[bytes], list[int], tuple[dict[int, int], dict[int, int]]]:
    """``packed[start:]`` (with the frames of each entry, and records
    marked by position, the openings and the closes: position:
    connection) as entries of one record each: those holding many (a
    sink's) split at their records' boundaries."""
    out: list[bytes] = []
    out_counts: list[int] = []
    moved: dict[int, int] = {}
    for at in range(start, len(packed)):
        data, count = packed[at], counts[at]
        moved[at] = len(out)
        if count <= 1:
            out.append(data)
            out_counts.append(count)
            continue
        unpacker = msgpack.Unpacker()
        unpacker.feed(data)
        begin = 0
        for _ in range(count):
            unpacker.skip()
            end = unpacker.tell()
            out.append(data[begin:end])
            out_counts.append(1)
            begin = end
    opens, closes = ({moved[at]: conn for at, conn in m.items() if at >= start} for m in marks)
    return out, out_counts, (opens, closes)


def pieces(packed: list[bytes], most: int | None) -> list[bytes]:
    """``packed`` records joined in order into pieces of at most ``most``
    bytes (None: one piece), a record larger than that alone."""
    if most is None:
        return [b"".join(packed)]
    out: list[bytes] = []
    piece: list[bytes] = []
    size = 0
    for record in packed:
        if piece and size + len(record) > most:
            out.append(b"".join(piece))
            piece, size = [], 0
        piece.append(record)
        size += len(record)
    out.append(b"".join(piece))
    return out


def pack_all(records: list[Record]) -> bytes:
    return b"".join(pack(record) for record in records)


def _first_wall(data: bytes) -> int | None:
    """The earliest wall time of the records in ``data`` (packed records):
    not always the first's (an HTTP exchange is written when it ends, with
    the time it began)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    walls = [r.get("w") for r in unpacker if isinstance(r, dict)]
    return min((w for w in walls if isinstance(w, int)), default=None)


def snapshot_name(stamp: str, reason: str) -> str:
    """A snapshot directory's name: the time, and the reason as a slug."""
    slug = "-".join("".join(c if c.isalnum() else " " for c in reason.lower()).split())[:40]
    return f"snapshot-{stamp}" + (f"-{slug}" if slug else "") + f"-{uuid.uuid4().hex[:6]}"


def ignore_file_size_signal() -> None:
    """Get EFBIG instead of being killed when a file-size limit is hit."""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
