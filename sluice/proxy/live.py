"""The live view's side in the proxy: traffic as recording records, held in
memory for whoever watches (``POST /live`` on the admin endpoint,
``sluice view --live``).

A ``LiveTap`` is one of the proxy's taps, idle until someone watches: then
``frames`` returns at once, ``Taps.quick`` passes it over, and the compiled
relay steps carry every read as they do without it. So it costs nothing
while nobody watches (a dict entry per connection opened, for the
connections a new watcher is told of). Each poll keeps it watching for
``WATCH_SECONDS`` (15). The first poll after it went idle moves the taps'
generation on, so every relayed connection builds its compiled step again
at its next read, now with the tap as where its frame records go
(``quick_records``, as the recorder's; where the protocol lays its records
out in Python, or a recorder takes them too, the reads come through Python
and ``frames`` instead). The first read after the last poll's time ran out
moves the generation on again, and the steps are built without the tap.

While watched, each read's frames become frame records laid out as the
recorder lays them out (the protocol's summarizer, under the proxy's
``--record-payloads`` policy), connections their ``conn`` and ``close``
records, fault rules' and filters' acts their annotations, and all of them
go into a ring of at most ``MAX_BYTES`` numbered records. A watcher asks
for the records after the last number it has; what the ring lost before it
asked is counted (``dropped``), and the view says so.

The numbers say which process gave them: a tap numbers its records from
``process << PROCESS_SHIFT``, ``process`` drawn at random when the proxy
starts (and named in the header, ``"process"``). A cursor another process
gave (the proxy restarted, or a worker was replaced, under the watcher) is
outside this one's numbers and is answered as a new watcher's; a cursor
stays a plain number, which a supervisor passes to its workers as it is.
Every answer starts with the header, so that the view can tell whose
records follow where a supervisor puts several workers' answers together;
where the watcher may have missed records (a new watcher's answer, or one
after records the ring lost), the header names the connections open as of
the answer's last record (``open``: an answer holds at most
``BATCH_BYTES`` of the ring, so the connections open now may have opened
or closed in records it leaves to the next), so that the view closes
those it holds that closed unseen, and no other.
"""

from __future__ import annotations

import base64
import collections
import itertools
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from sluice.protocols import registry
from sluice.protocols.core import Closed, Conn, Event, FaultInjected, Filtered, Opened, Taps
from sluice.proxy.admin import AdminRequest, Refused, authorize, json_body
from sluice.recording.format import NamedFrames, PayloadPolicy, Record, header, packer

# The ring: at most this many bytes of records (and of records).
MAX_BYTES = 8 * 1024 * 1024
MAX_RECORDS = 50_000
# A watcher that stops polling for this long is gone (SLUICE_LIVE_IDLE_AFTER
# in the proxy's environment sets another number of seconds).
WATCH_SECONDS = 15.0


def watch_seconds() -> float:
    text = os.environ.get("SLUICE_LIVE_IDLE_AFTER", "")
    try:
        return max(0.1, float(text)) if text else WATCH_SECONDS
    except ValueError:
        return WATCH_SECONDS


# What one answer holds at most.
BATCH_BYTES = 2 * 1024 * 1024
# A tap's record numbers: its process (1 to 2**22, at random) above these
# bits, its records' count below them (a cursor stays within int64).
PROCESS_SHIFT = 40


def process_of(cursor: int) -> int:
    """The process (as its header names it) that gave a record number."""
    return cursor >> PROCESS_SHIFT


@dataclass
class Taken:
    """An answer to a watcher: the header, then the records after its
    cursor, packed (for a new watcher, first the open connections), the
    cursor for the next ask, how many records the ring lost before this
    ask, and whether it is a new watcher's answer."""

    records: list[bytes]
    next: int
    dropped: int
    fresh: bool = False


class LiveTap:
    """See the module's notes. ``taps``: the proxy's (their generation
    moves on when this one starts or stops watching); ``listen`` and
    ``broker`` for the header a watcher is given."""

    def __init__(
        self,
        taps: Taps,
        protocol: str,
        payloads: PayloadPolicy,
        *,
        listen: list[str],
        broker: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._taps = taps
        spec = registry.get(protocol)
        make = spec.load(spec.summarizer) if spec.summarizer is not None else NamedFrames
        self._summarizer = make(payloads)
        self._pack = packer()
        self.process = secrets.randbelow(2**22) + 1
        self._header = header(
            capture="live", segment=1, started_ns=time.time_ns(), payloads=payloads,
            sluice_version=_version(), protocol=protocol, listen=listen, broker=broker,
        )  # fmt: skip
        self._header["process"] = self.process
        self._packed_header = self._pack(self._header)
        self._clock = clock
        self._watch = watch_seconds()
        self.idle = True  # read by Taps.quick: no frames wanted now
        self._until = 0.0
        self._ring: collections.deque[tuple[int, bytes]] = collections.deque()
        self._bytes = 0
        self._next = (self.process << PROCESS_SHIFT) + 1  # the number the next record gets
        self._open: dict[int, Conn] = {}  # connections open now, for a new watcher
        self._conn_at: dict[int, int] = {}  # an open connection -> its conn record's number
        # The close records in the ring, oldest first: (its number, the
        # connection, the number of the connection's conn record).
        self._closes: collections.deque[tuple[int, int, int]] = collections.deque()

    # --- watching ------------------------------------------------------------------

    def take(self, after: int | None) -> Taken:
        """The header and the records after number ``after`` (None: a new
        watcher, who is told of every open connection first); keeps the tap
        watching. A cursor this tap never gave (another process's: the
        proxy restarted, or a worker was replaced) or one asked with while
        idle (what happened meanwhile was not kept) is a new watcher's too."""
        now = self._clock()
        first = self.process << PROCESS_SHIFT  # (a cursor before any record)
        if after is not None and (self.idle or not first <= after <= self.newest):
            after = None
        if self.idle:
            self.idle = False
            self._taps.changed()
            self._ring.clear()
            self._closes.clear()
            self._bytes = 0
            for conn in list(self._open.values()):
                self._add_conn(conn)
        self._until = now + self._watch
        records = [self._packed_header]
        dropped = 0
        oldest = self._ring[0][0] if self._ring else self._next
        fresh = after is None
        if after is None:
            # Told of every open connection: in the ring, or (its record
            # gone from it: a watcher who came later) here, before the ring,
            # stamped with the time of the ring's oldest record: none of the
            # answer's records is older (the view's times count from the
            # first), and the view starts where the ring does.
            at = self._oldest_times()
            for conn in list(self._open.values()):
                if self._conn_at.get(conn.id, 0) < oldest:
                    records.append(self._pack(self._conn_record(conn, at)))
            after = oldest - 1
        if after + 1 < oldest:
            dropped = oldest - after - 1
        size = 0
        last = max(after, oldest - 1)
        # Numbers are consecutive: the first wanted is found, not searched for.
        for number, data in itertools.islice(self._ring, max(0, after + 1 - oldest), None):
            if size and size + len(data) > BATCH_BYTES:
                break
            records.append(data)
            size += len(data)
            last = number
        if fresh or dropped:
            records[0] = self._header_saying(dropped, last)
        return Taken(records, last, dropped, fresh)

    def _header_saying(self, dropped: int, last: int) -> bytes:
        """The header of an answer after which the watcher may have missed
        records (a new watcher's: what happened while nobody watched was
        not kept; or one after records the ring lost), naming the
        connections open as of the answer's ``last`` record (``open``: one
        the watcher holds open that is not among them, and has no ``close``
        in the answer, closed unseen) and how many records this process
        lost (``dropped``: its next frame has a gap before it, not another
        process's where a supervisor puts several answers together and sums
        their counts)."""
        said: dict[str, Any] = {**self._header, "open": self._open_at(last)}
        if dropped:
            said["dropped"] = dropped
        return self._pack(said)

    def _open_at(self, last: int) -> list[int]:
        """The connections open as of record number ``last``: those open
        now but for those opened after it, and those closed after it that
        were open then (their ``close`` is still to come to the watcher),
        told apart by the numbers of their ``conn`` and ``close`` records."""
        conn_at = self._conn_at
        open_then = {c for c in self._open if conn_at.get(c, 0) <= last}
        open_then.update(c for number, c, opened in self._closes if number > last >= opened)
        return sorted(open_then)

    def _oldest_times(self) -> tuple[int, int] | None:
        """The monotonic and wall times of the ring's oldest record (None:
        the ring is empty)."""
        if not self._ring:
            return None
        oldest = msgpack.unpackb(self._ring[0][1], raw=False, strict_map_key=False)
        return int(oldest["t"]), int(oldest.get("w", 0))

    @property
    def newest(self) -> int:
        """The number of the newest record (``process << PROCESS_SHIFT``: none yet)."""
        return self._next - 1

    def _expired(self) -> bool:
        """Whether the watchers are gone (then idle from now on)."""
        if self._clock() < self._until:
            return False
        self.idle = True
        self._taps.changed()
        self._ring.clear()
        self._closes.clear()
        self._bytes = 0
        self._summarizer = type(self._summarizer)(self._header["payloads"])
        return True

    def _add_conn(self, conn: Conn) -> None:
        self._conn_at[conn.id] = self._next
        self._add(self._conn_record(conn))

    def _add(self, record: Record | bytes) -> None:
        data = record if isinstance(record, bytes) else self._pack(record)
        self._ring.append((self._next, data))
        self._next += 1
        self._bytes += len(data)
        while self._ring and (self._bytes > MAX_BYTES or len(self._ring) > MAX_RECORDS):
            number, gone = self._ring.popleft()
            self._bytes -= len(gone)
            if self._closes and self._closes[0][0] == number:
                self._closes.popleft()

    # --- the tap -------------------------------------------------------------------

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        if self.idle or not frames or self._expired():
            return
        for data in self._summarizer.packed(
            conn.id, 0 if from_client else 1, time.monotonic_ns(), time.time_ns(), frames
        ):
            self._add(data)

    def quick_records(self, conn: Conn) -> tuple[Callable[[list[bytes], int], None], int] | None:
        """While watched: where a compiled relay step may put the frame
        records of the reads it carries (laid out by the protocol's compiled
        code, as the recorder's are), so that a watched connection stays on
        the compiled path; None where the records are laid out in Python."""
        code = getattr(self._summarizer, "compiled_code", None)
        if code is None or conn.id > 0xFFFFFFFF:
            return None
        return self.carried, code

    def carried(self, records: list[bytes], size: int) -> None:
        """``frames`` for a read a compiled relay step carried."""
        if self.idle or self._expired():
            return
        for data in records:
            self._add(data)

    def event(self, conn: Conn | None, event: Event) -> None:
        if conn is None:
            return
        kind = type(event)
        if kind is Opened:
            self._open[conn.id] = conn
            if not self.idle:
                self._add_conn(conn)
        elif kind is Closed:
            self._open.pop(conn.id, None)
            opened = self._conn_at.pop(conn.id, 0)
            self._summarizer.forget(conn.id)
            if not self.idle:
                assert isinstance(event, Closed)
                self._closes.append((self._next, conn.id, opened))
                self._add(self._note(conn, "close", reason=event.reason))
        elif self.idle:
            return
        elif kind is FaultInjected:
            assert isinstance(event, FaultInjected)
            self._add(self._note(conn, "fault", rule=event.rule, action=event.action,
                                 cmd=event.command, d=0 if event.from_client else 1,
                                 **({"topic": event.topic} if event.topic else {})))  # fmt: skip
        elif kind is Filtered:
            assert isinstance(event, Filtered)
            self._add(self._note(conn, "filter", filter=event.filter, action=event.action,
                                 d=0 if event.from_client else 1, n=event.messages,
                                 **({"topic": event.topic} if event.topic else {}),
                                 **({"reason": event.reason} if event.reason else {})))  # fmt: skip

    def _conn_record(self, conn: Conn, at: tuple[int, int] | None = None) -> Record:
        """``conn``'s record, stamped now or ``at`` (monotonic and wall)."""
        record = self._note(conn, "conn", client=conn.client, broker=conn.broker,
                            kind=conn.kind, listener=conn.listener)  # fmt: skip
        if at is not None:
            record["t"], record["w"] = at
        if conn.via:
            record["via"] = conn.via
        state = conn.state
        producers = getattr(state, "producers", None)
        consumers = getattr(state, "consumers", None)
        if producers or consumers:  # what it made before the watcher came
            record["producers"] = dict(producers or {})
            record["consumers"] = dict(consumers or {})
        return record

    @staticmethod
    def _note(conn: Conn, record_kind: str, **fields: Any) -> Record:
        return {"k": record_kind, "c": conn.id, "t": time.monotonic_ns(), "w": time.time_ns(),
                **fields}  # fmt: skip


def _version() -> str:
    from sluice import __version__

    return __version__


# How long an ask with nothing new waits for something (long polling), and
# how often it looks: a watcher gets at most 1 / POLL_STEP answers a second,
# each holding what came meanwhile (an answer costs the proxy more than the
# records in it, at low rates).
POLL_SECONDS = 1.0
POLL_STEP = 0.25


def parse_after(body: bytes) -> dict[int, int]:
    """The cursor a watcher sends, ``{"after": "N"}`` (one process) or
    ``{"after": "0:N,1:M"}`` (workers, by index); a process it names no
    number for has a new watcher."""
    data = json_body(body, empty={})
    if not isinstance(data, dict) or set(data) - {"after"}:
        raise Refused(400, 'the body is {"after": CURSOR}, CURSOR as the last answer gave it')
    text = str(data.get("after", "") or "")
    cursors: dict[int, int] = {}
    try:
        for part in filter(None, text.split(",")):
            index, sep, number = part.rpartition(":")
            cursors[int(index) if sep else 0] = int(number)
    except ValueError:
        raise Refused(400, f"after {text!r}: not a cursor an answer gave") from None
    if any(n < 0 for n in cursors.values()):
        raise Refused(400, f"after {text!r}: not a cursor an answer gave")
    return cursors


def answer(taken: Taken, cursor: str) -> dict[str, Any]:
    return {"next": cursor, "dropped": taken.dropped,
            "records": base64.b64encode(b"".join(taken.records)).decode()}  # fmt: skip


@dataclass
class LiveEndpoint:
    """``POST /live`` of one proxy process: the records after the cursor
    (needs the admin token: frames show what ``/metrics`` does not)."""

    live: LiveTap | None
    token: str | None = None

    async def __call__(self, request: AdminRequest) -> tuple[int, Any]:
        if request.target != "/live":
            raise Refused(404, "try POST /live")
        if request.method != "POST":
            raise Refused(405, "POST /live", [("Allow", "POST")])
        authorize(request, self.token, "watching traffic live")
        after = parse_after(request.body).get(0)
        if self.live is None:
            raise Refused(409, "this proxy has no live view")
        live = self.live
        taken = live.take(after)  # (starts watching)
        deadline = trio.current_time() + POLL_SECONDS
        while not (taken.fresh or len(taken.records) > 1 or taken.dropped) and (
            trio.current_time() < deadline
        ):
            await trio.sleep(POLL_STEP)
            if after is not None and live.newest > after:  # something new: take it
                taken = live.take(after)
        return 200, answer(taken, str(taken.next))
