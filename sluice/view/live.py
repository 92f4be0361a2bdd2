"""``sluice view --live ADMIN``: the page over a running proxy's traffic.

A thread asks the proxy's admin endpoint (``POST /live``, with the admin
token) for the records after the last it has, long polling, and feeds them
to a ``LiveIndex``: the same index, filters, pages, details, timeline,
sequence diagram and summary as for a capture, growing as traffic comes.
The page polls the status and follows the newest frames unless paused.

Both sides are bounded. The proxy holds at most 8 MiB (50,000 records) for
its watchers (``sluice/proxy/live.py``); what it lost before this view
asked is counted and shown (``dropped by the proxy``). This side holds at
most ``MAX_FRAMES`` frames and ``MAX_BYTES`` of records: past that the
oldest are let go, and the page says how many (``let go here``). "Save" writes what this side holds
as a capture directory, the flight recorder's way (a file per proxy
process: a header, the connections, a ``snapshot`` record, then the
records), which every reader takes. Each process's records are numbered as
the recorder's ring numbers its own (from 0, as taken), and its saves are
one capture, so that readers take two saves of one view that hold the same
records as overlapping snapshots: each record once.
"""

from __future__ import annotations

import base64
import bisect
import http.client
import io
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from array import array
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from sluice.protocols import registry
from sluice.recording.format import Record, pack, record_at
from sluice.recording.writer import DIRECTORY_MODE, create_new
from sluice.view.index import COLUMNS, Index, Note, Reading

log = logging.getLogger("sluice.view")

# Frames held here at most; past it the oldest half goes. And bytes of
# records held at most (a proxy under --record-payloads full sends whole
# payloads: 200,000 frames of 1 MiB would be 200 GiB); past it, the oldest
# frames go until the records held are half of it.
MAX_FRAMES = 200_000
MAX_BYTES = 512 * 1024 * 1024
# With no page asking anything for this long, the view stops asking the
# proxy (which then stops watching, as it does 15 s after its last ask);
# a page that asks again starts it again.
PAGE_GONE_SECONDS = 60.0
# An answer of the proxy's is at most 2 MiB of records (and a record larger
# than that alone), base64: what is read of one at most (another service on
# the port could answer without end).
MAX_ANSWER = 256 * 1024 * 1024
# The file number of records held in memory (``Index.file``).
LIVE = 0xFFFF
# The bits of a record number below its process's (``sluice/proxy/live.py``).
PROCESS_SHIFT = 40


class NothingReceived(Exception):
    """Save asked for before the proxy has answered (no header to write)."""


@dataclass
class Process:
    """A proxy process this view was told of (by its header): its header,
    the reading of its records (a capture of its own: its connection ids
    are its own), and its protocol's summary filler."""

    identity: Any
    header: Record
    reading: Reading
    summaries: Any = None
    # Its records numbered as the flight recorder's ring numbers its own
    # (``Ring.records``), from 0 in the order taken: ``taken`` is the next
    # one's number. Its saves are one capture, so readers pass over the
    # records an earlier save held (``Repeats``).
    taken: int = 0
    saved_as: str = field(default_factory=lambda: secrets.token_hex(6))


def identity_of(header: Record) -> Any:
    """Which proxy process a header is of: the ``process`` it names (the
    high bits of the numbers it gives, ``sluice/proxy/live.py``), or, from
    a Sluice before it, its start time."""
    return header.get("process", ("started", header.get("started")))


def slots_of(cursor: str) -> dict[int, int]:
    """The process answering in each slot (a worker's index; 0 for a lone
    proxy), from the cursor an answer gave: ``N`` or ``0:N,1:M``."""
    slots: dict[int, int] = {}
    for part in filter(None, cursor.split(",")):
        index, sep, number = part.rpartition(":")
        try:
            slots[int(index) if sep else 0] = int(number) >> PROCESS_SHIFT
        except ValueError:
            continue
    return slots


class LiveIndex(Index):
    """An index fed by ``feed`` rather than read from files. ``source``:
    what it watches (for the page)."""

    def __init__(
        self, source: str, max_frames: int = MAX_FRAMES, max_bytes: int = MAX_BYTES
    ) -> None:
        super().__init__(Path(source))
        self.source = source
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.held_bytes = 0  # the bytes of the records held (``_records``)
        self.building = False
        self.live_error = ""
        self.dropped_upstream = 0  # records the proxy lost before they were asked for
        self.let_go = 0  # frames let go here (the oldest, past max_frames)
        self.asks = 0
        self.asked = time.monotonic()  # when a page last asked (``asked_now``), or started
        self.resting = False  # not asking the proxy: no page asks (``watch``)
        self._reading = Reading(LIVE)  # the reading of the process whose records come now
        self._records: list[bytes] = []  # every record held, packed, summaries filled in
        self._owners: list[str] = []  # each record's process (its reading's capture)
        self._first = 0  # the number of the first record held (for offsets)
        self._newest: tuple[int, int] = (0, 0)  # the newest record's times (monotonic, wall)
        self._header: Record | None = None  # the first process's
        # (capture, connection) -> the number of its conn record
        self._opened: dict[tuple[str, int], int] = {}
        # The proxy processes told of, by identity; the one whose records
        # come now; which answers in each slot (a worker's index, 0 for a
        # lone proxy); how many were replaced under this view (a restart).
        self._processes: dict[Any, Process] = {}
        self._process: Process | None = None
        self._slots: dict[int, int] = {}
        self._replacing: set[Any] = set()  # (processes that replaced another)
        self.restarts = 0
        self._saves = 0  # saves written (each file's number)
        # Connections, notes or records past this many (frames or not):
        # those no frame held needs go (``_tidy``).
        self._tidy_at = max_frames

    def feed(self, records: list[Record], dropped: int = 0, cursor: str = "") -> None:
        """Records from the proxy, in order; ``dropped``: how many it lost
        just before them; ``cursor``: the answer's (which process answers
        in each slot: one that replaced another closes the other's
        connections)."""
        with self.lock:
            self.asks += 1
            self.dropped_upstream += dropped
        headers = [r for r in records if r.get("k") == "header"]
        if dropped and not any("dropped" in r for r in headers):
            # (a Sluice before headers said whose records were dropped: all may be)
            for held in self._processes.values():
                held.reading.gap = True
        self._replaced(cursor, {identity_of(r) for r in headers})
        for at, record in enumerate(records):
            kind = record.get("k")
            if kind == "header":
                self._told_of(record)
                if record.get("dropped") and self._process is not None:
                    self._process.reading.gap = True  # (before this process's next frame)
                if "open" in record and self._process is not None:
                    self._closed_unseen(self._process, record["open"], records[at + 1 :])
                continue
            if self._process is not None:  # (None: no header yet, not from a proxy's /live)
                self._keep(self._process, record)
        if self.frames > self.max_frames:
            self._let_go(self.frames - self.max_frames // 2)
        if self.held_bytes > self.max_bytes and self.frames > 1:
            self._let_go(self._frames_over_bytes())
        elif max(len(self.connections), len(self.notes), len(self._records) - self.frames) > (
            self._tidy_at
        ):
            with self.lock:
                self._tidy()
        if records:  # answers worked out for fewer frames are stale now
            with self.lock:
                self._selections.clear()
                self._timelines.clear()
                self._summary = None

    def _keep(self, process: Process, record: Record) -> None:
        """One of ``process``'s records: held (for details and a save) and taken."""
        kind = record.get("k")
        summaries = process.summaries
        if summaries is not None:
            if kind == "frame" and "s" not in record:
                summaries.fill(record)
            elif kind == "conn":
                summaries.opened(record)
            elif kind == "close":
                summaries.closed(record)
        reading = process.reading
        number = self._first + len(self._records)
        if kind == "conn":
            self._opened[(reading.capture, record["c"])] = number
        if "t" in record and record["t"] >= self._newest[0]:
            self._newest = (int(record["t"]), int(record.get("w", 0)))
        data = pack(record)
        process.taken += 1
        self._records.append(data)
        self.held_bytes += len(data)
        self._owners.append(reading.capture)
        self.take(record, reading, number)

    def _close(self, process: Process, reason: str, keep: Collection[int] = ()) -> None:
        """A ``close`` record for each of ``process``'s connections this view
        holds open (but those in ``keep``), stamped with the newest time
        held: the proxy's went unseen (it restarted, or the records were
        not kept for this view), and a save must not leave them open."""
        capture = process.reading.capture
        t, w = self._newest
        for connection in [c for c in self.connections if c.capture == capture]:
            if not connection.closed and connection.conn not in keep:
                self._keep(process, {"k": "close", "c": connection.conn, "t": t, "w": w,
                                     "reason": reason})  # fmt: skip

    def _closed_unseen(self, process: Process, open_then: list[int], after: list[Record]) -> None:
        """A header naming the connections open as of the answer's last
        record (where the view may have missed records: a new watcher's
        answer, or one after records the proxy dropped; not those open
        when it answered, which may have opened or closed in records left
        to the next answers): the others this view holds open closed
        unseen, but those whose ``close`` comes in the answer (``after``,
        up to the next header)."""
        keep = set(open_then)
        for record in after:
            if record.get("k") == "header":
                break
            if record.get("k") == "close":
                keep.add(record["c"])
        self._close(process, "closed while this view was not told", keep)

    def _told_of(self, header: Record) -> None:
        """A header: the records after it are its process's. One not seen
        before starts a reading of its own (a capture of its own), and
        closes nothing: whether it replaced another the answer's cursor
        says (``_replaced``)."""
        identity = identity_of(header)
        process = self._processes.get(identity)
        if process is None:
            capture = str(header.get("capture", ""))
            if self._processes:  # (its connection ids are its own)
                capture = f"{capture}-{len(self._processes) + 1}"
            # (not what one answer said: the connections open then, records dropped)
            said = ("open", "dropped")
            header = {k: v for k, v in header.items() if k not in said} | {"capture": capture}
            spec = registry.get(str(header.get("protocol", registry.DEFAULT_PROTOCOL)))
            reading = Reading(LIVE, gap=identity in self._replacing)
            process = Process(identity, header, reading,
                              spec.load(spec.summaries)() if spec.summaries else None)  # fmt: skip
            with self.lock:
                self._processes[identity] = process
                if self._header is None:
                    self._header = header
            self.take(header, process.reading, 0)
        self._process = process
        self._reading = process.reading

    def _replaced(self, cursor: str, told: set[Any]) -> None:
        """Where an answer's ``cursor`` names another process in a slot than
        the last one did (both told of by their headers: ``told``, this
        answer's), the last one is gone (the proxy restarted, or the
        supervisor replaced a worker): its open connections are closed, and
        the page says so. A slot not seen before closes nothing."""
        lone = ":" not in cursor
        for slot, identity in slots_of(cursor).items():
            gone = self._slots.get(slot)
            self._slots[slot] = identity
            if gone is None or gone == identity:
                continue
            if identity not in told and identity not in self._processes:
                continue  # (not told of: an answer from a Sluice before process numbers)
            old = self._processes.get(gone)
            if old is None:
                continue
            self._replacing.add(identity)
            said = "the proxy restarted" if lone else f"worker {slot} was replaced"
            with self.lock:
                self.restarts += 1
            self._close(old, said)
            t = self.t[-1] / 1e9 if self.frames else 0.0
            self.notes.append(Note("restart", t, None, f"{said}: a new process from here on"))

    def _let_go(self, count: int) -> None:
        """The oldest ``count`` frames (and the records before them) go:
        the columns are cut first and put in place together, under the lock
        every question takes, so that a question sees them all before or
        all after; the frames held keep their ids (``base`` moves on)."""
        kept = {name: getattr(self, name)[count:] for name in COLUMNS if name != "pair"}
        kept["pair"] = array("q", (p - count if p >= count else -1 for p in self.pair[count:]))
        with self.lock:
            first_kept = self.offset[count]
            for name, column in kept.items():
                setattr(self, name, column)
            for process in self._processes.values():
                waiting = process.reading.waiting
                for key, frame in list(waiting.items()):
                    if frame < count:
                        del waiting[key]
                    else:
                        waiting[key] = frame - count
            self._forget_records(first_kept)
            self.base += count
            self.let_go += count
            self._tidy()

    def _forget_records(self, first_kept: int) -> None:
        """The records before number ``first_kept`` go (under the lock)."""
        cut = first_kept - self._first
        self.held_bytes -= sum(map(len, self._records[:cut]))
        del self._records[:cut]
        del self._owners[:cut]
        self._first = first_kept

    def _frames_over_bytes(self) -> int:
        """How many of the oldest frames go for the records held to be half
        of ``max_bytes`` at most (the newest frame stays, however large)."""
        excess = self.held_bytes - self.max_bytes // 2
        gone = cut = 0
        for cut, data in enumerate(self._records):  # noqa: B007 - (where it stopped)
            if gone >= excess:
                break
            gone += len(data)
        else:
            cut += 1
        # (a frame's offset is its record's number, in order)
        return max(1, min(self.frames - 1, bisect.bisect_left(self.offset, self._first + cut)))

    def _tidy(self) -> None:
        """What no frame held needs goes (under the lock): the notes before
        the first frame held, closed connections no frame held is on (and
        that ended before the first, or all of them when there are too
        many), the records before the first frame's; past the bound still,
        the oldest notes and records. Connections keep their ids."""
        half = self.max_frames // 2
        first = self.t[0] if self.frames else None
        if first is not None:
            self.notes = [n for n in self.notes if n.t * 1e9 >= first]
        if len(self.notes) > self.max_frames:
            self.notes = self.notes[-half:]
        on = set(self.conn)
        kept = [c for c in self.connections if not c.closed or c.index in on
                or (first is not None and c.end_ns - self.origin_ns >= first)]  # fmt: skip
        if len(kept) > self.max_frames:
            kept = [c for c in kept if not c.closed or c.index in on]
        if len(kept) < len(self.connections):
            self.connections = kept
            self.by_id = {c.index: c for c in kept}
            for process in self._processes.values():
                reading = process.reading
                reading.by_key = {k: c for k, c in reading.by_key.items() if c.index in self.by_id}
        if self.frames:
            first_kept = self.offset[0]
        else:  # (connections and notes only: the newest half of them, past the bound)
            over = len(self._records) > self.max_frames
            first_kept = self._first + (len(self._records) - half if over else 0)
        if first_kept > self._first:
            self._forget_records(first_kept)
        self._opened = {c: n for c, n in self._opened.items() if n >= self._first}
        self._tidy_at = max(self.max_frames, 2 * max(len(self.connections), len(self.notes)))
        self._selections.clear()
        self._timelines.clear()
        self._summary = None

    def shown(self, items: list[Any], limit: int) -> list[Any]:
        """The newest ``limit`` of ``items``."""
        return items[-limit:]

    def asked_now(self) -> None:
        """A page asked something: watching goes on (or starts again)."""
        self.asked = time.monotonic()

    def notes_shown(self) -> list[Note]:
        """The newest 500 notes (those of the frames coming in)."""
        return self.notes[-500:]

    def _record(self, file: int, offset: int) -> Record:
        if file != LIVE:
            return record_at(self.files[file], offset, self.versions[file])
        data = self._records[offset - self._first]
        record: Record = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return record

    def _file_name(self, file: int) -> str:
        return "live" if file == LIVE else self.files[file].name

    def _status(self) -> dict[str, Any]:
        out = super()._status()
        out.update(
            live=True,
            source=self.source,
            error=self.live_error,
            dropped_upstream=self.dropped_upstream,
            let_go=self.let_go,
            restarts=self.restarts,
            resting=self.resting,
            max_frames=self.max_frames,
            max_mib=self.max_bytes // (1024 * 1024),
            files=0,
        )
        return out

    def save(self, directory: Path) -> Path:
        """What this side holds, written as a snapshot capture directory in
        ``directory``: a file per proxy process (its own header, its own
        connection ids, its own capture: the same in every save of this
        view), numbered as a ring snapshot is (its ``snapshot`` record's
        ``ring``: the number of the first record after it); the capture's
        directory."""
        with self.lock:
            if self._header is None:
                raise NothingReceived("nothing received from the proxy yet")
            processes = list(self._processes.values())
            records = list(zip(self._owners, self._records, strict=True))
            # (the number of the record after each process's last: what is
            # held of a process is its newest records, ``_forget_records``)
            taken = {p.reading.capture: p.taken for p in processes}
            held = {key for key, number in self._opened.items() if number >= self._first}
            connections = [c for c in self.connections if (c.capture, c.conn) not in held]
            seconds = (self.t[-1] - self.t[0]) / 1e9 if self.frames else 0.0
            self._saves += 1
            number = self._saves
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        out = directory / f"snapshot-{stamp}-live-{secrets.token_hex(6)}"
        # (as the recorder's: payloads, topics, clients' addresses are not every user's)
        out.mkdir(parents=True, mode=DIRECTORY_MODE)
        for n, process in enumerate(processes, 1):
            key = process.reading.capture
            own = [data for owner, data in records if owner == key]
            opened = [c for c in connections if c.capture == key]
            if n > 1 and not own and not opened:
                continue  # (a process nothing held is of)
            name = process.saved_as
            header = {**process.header, "capture": name, "segment": number,
                      "started": time.time_ns()}  # fmt: skip
            path = out / f"sluice-{stamp}-{name}-{number:04d}.sluice"
            partial = path.with_name(path.name + ".part")
            with open(partial, "wb", opener=create_new) as handle:
                handle.write(pack(header))
                # The connections whose opening is no longer held, before their frames.
                for c in opened:
                    record = {"k": "conn", "c": c.conn, "t": c.start_ns, "w": 0,
                              "client": c.client, "broker": c.broker, "kind": c.kind,
                              "listener": ""}  # fmt: skip
                    if c.via:
                        record["via"] = c.via
                    handle.write(pack(record))
                handle.write(pack({"k": "snapshot", "t": self.origin_ns, "w": self.origin_wall_ns,
                                   "reason": f"sluice view --live {self.source}",
                                   "seconds": seconds, "ring": taken[key] - len(own)}))  # fmt: skip
                for data in own:
                    handle.write(data)
            partial.rename(path)
        return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: it would carry the admin token elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# The admin endpoint is asked directly: not through the HTTP proxy the
# environment names (``http_proxy``, which would be given the token), and
# not where an answer redirects.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def watch(
    index: LiveIndex,
    url: str,
    token: str,
    stop: threading.Event,
    page_gone: float = PAGE_GONE_SECONDS,
) -> None:
    """Feed ``index`` from the proxy's ``/live`` until ``stop`` (a thread's
    work), while a page asks: with none asking for ``page_gone`` seconds,
    the proxy is not asked (it stops watching: it costs nothing then) until
    one asks again; what came meanwhile was not kept (a gap)."""
    after = ""
    resumed = False  # the first ask after resting
    while not stop.is_set():
        if time.monotonic() - index.asked > page_gone:
            if not index.resting:
                log.info("live view: no page has asked for %.0f s: not watching", page_gone)
                index.resting = True
            stop.wait(0.25)
            continue
        if index.resting:
            index.resting, resumed = False, True
        body = json.dumps({"after": after}).encode()
        request = urllib.request.Request(
            url, data=body, method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with _OPENER.open(request, timeout=15) as answer:
                body = answer.read(MAX_ANSWER + 1)
            if len(body) > MAX_ANSWER:
                index.live_error = (
                    f"{url}: not what a Sluice admin endpoint answers "
                    f"(an answer of more than {MAX_ANSWER} bytes)"
                )
                stop.wait(2)
                continue
            data = json.loads(body)
        except urllib.error.HTTPError as exc:
            said = exc.read(1000).decode(errors="replace").strip()
            index.live_error = f"{url}: {exc.code} {said}"
            if exc.code in (401, 403, 404, 405):
                return  # nothing will change by asking again
            stop.wait(2)
            continue
        except (OSError, ValueError, http.client.HTTPException) as exc:
            index.live_error = f"cannot reach {url}: {getattr(exc, 'reason', exc)}"
            stop.wait(2)
            continue
        try:
            records = list(msgpack.Unpacker(io.BytesIO(base64.b64decode(data["records"])),
                                            raw=False, strict_map_key=False))  # fmt: skip
            next_ = str(data["next"])
        except (TypeError, KeyError, ValueError, msgpack.UnpackException) as exc:
            # Another service on the port (a JSON answer of its own): said on
            # the page, and asked again, as for an endpoint that is away.
            index.live_error = f"{url}: not what a Sluice admin endpoint answers ({exc!r})"
            stop.wait(2)
            continue
        index.live_error = ""
        if resumed and any(r.get("k") == "header" and "open" in r for r in records):
            # The proxy stopped watching meanwhile: what came then was not kept.
            with index.lock:
                for process in index._processes.values():
                    process.reading.gap = True
        resumed = False
        try:
            index.feed(records, int(data.get("dropped", 0)), next_)
        except Exception as exc:  # a bad record must not stop the view
            log.error("live view: could not take records: %r", exc, exc_info=exc)
        after = next_


def live_url(text: str) -> str:
    """The ``/live`` URL of an admin endpoint given as ``HOST:PORT`` or a URL."""
    base = text if "://" in text else f"http://{text}"
    return base.rstrip("/") + "/live"
