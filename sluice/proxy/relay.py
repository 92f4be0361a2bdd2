"""The trio side of one client connection, the same for every protocol.

``Relay`` owns the sockets of one client connection (and of the upstream it
may be relayed to) and drives a protocol core: bytes read go into the core,
the actions that come out are carried out here: writes (one writer at a
time per socket, so a slow side slows its peer instead of growing memory),
dialling, requests over the proxy's shared upstream connections, closing.
It also owns the clocks: the handshake deadline, keepalive ticks, and the
drain deadline. It knows nothing of frames, metrics or recordings.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import ssl
import struct
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol

import trio

from sluice.addresses import Address
from sluice.errors import leaves
from sluice.protocols.core import (
    Action,
    Ask,
    Close,
    Conn,
    Hold,
    OpenUpstream,
    Peer,
    QuickStep,
    Rejected,
    Relayed,
    Send,
    Tap,
)
from sluice.protocols.faults import Faults
from sluice.proxy.dial import (
    LINGER,
    discard,
    finish_dial,
    hang_up,
    socket_stream,
    stream_descriptor,
)
from sluice.proxy.relay_thread import RelayThread

log = logging.getLogger("sluice.relay")

# How much one read asks the socket for. The codec benchmark feeds the
# decoder reads of this size too.
READ_SIZE = 256 * 1024

# How many reads with data a direction makes in trio, once the connection
# relays, before the relay thread may carry it. Handing a direction to the
# thread and back costs about as much as 3 Python reads: a connection
# that makes a request or two and hangs up (a Pulsar lookup) is cheaper
# served where it is (a Cursus commit's is parked from the start: ``park``);
# one that streams goes over after these, or at its first read of
# LEAVE_SIZE bytes or more (a backlog being delivered: checked in Python,
# those first reads would cost more than the thread saves a short
# connection).
LEAVE_AFTER = 4
LEAVE_SIZE = 16 * 1024

# How many answers to a core's ``Ask`` (a Pulsar lookup's) may wait to be
# written at once before the relay reads no more from the client. They
# are written by tasks of their own, apart from the reading, so a client
# that pipelines lookups and never reads their answers would otherwise
# have Sluice keep a task and an answer per lookup, without bound.
ANSWERS_WAITING = 64

# How much a write to a peer that is not plain TCP (TLS) is given at a time
# (what trio's SSLStream encrypts and holds at once). Where the TCP
# connection under it does not say what its peer took in (``_acked``),
# each piece must be taken in within the stall bound (``Relay._stall``).
STALL_PIECE = 64 * 1024


def _descriptor(stream: trio.abc.Stream) -> int | None:
    """The socket under ``stream`` where it is plain TCP, for the relay's
    own reads and writes; None for anything else (TLS, test streams).

    trio's ``receive_some`` and ``send_all`` each pass through the scheduler
    even when the socket is ready (a checkpoint before and a yield after the
    system call), and a frame crossing alone pays three such round trips.
    On a plain socket the relay reads and writes the descriptor itself, with
    one scheduling point per read: waiting for data, or, when the last read
    filled the buffer, a yield so that other connections get their turn.
    """
    if type(stream) is trio.SocketStream:
        return stream.socket.fileno()
    return None


class Core(Protocol):
    """A protocol's sans-I/O connection core, as the relay drives it."""

    conn: Conn

    @property
    def established(self) -> bool: ...

    @property
    def in_flight_sends(self) -> int: ...

    @property
    def upstream_pending(self) -> bool:
        """Waiting for the upstream's side of the handshake."""
        ...

    def receive_client(self, data: bytes, now: float) -> list[Action]: ...

    def receive_broker(self, data: bytes, now: float) -> list[Action]: ...

    def upstream_failed(self, message: str, now: float) -> list[Action]: ...

    def upstream_ready(self, now: float) -> list[Action]:
        """The upstream was dialled and sent the ``hello``."""
        ...

    def answered(self, token: int, answer: Any, now: float) -> list[Action]: ...

    def keepalive(self, now: float, interval: float) -> list[Action]:
        """Called at every tick once established. A core whose keepalive
        never does anything says so by a ``keeps_alive = False`` attribute
        (optional; without it, True): its relay then keeps no clock after
        the handshake (a sleeping task per connection that is not free),
        but the one a relay thread's write that must wait starts
        (``_watch_stalls``)."""
        ...

    def drain(self) -> list[Action]: ...

    def closed(self, reason: str) -> None: ...


@dataclass(frozen=True)
class Timing:
    handshake_timeout: float
    connect_timeout: float
    keepalive_interval: float


@dataclass(frozen=True)
class Parking:
    """What a parked relay (``Relay.park``) tells the proxy: ``adopt`` (in
    the trio thread), trio takes it over and runs it; ``ended`` (on the
    relay thread), it ended there; and what it asks of it, ``connect``."""

    adopt: Callable[[Relay], None]
    ended: Callable[[Relay], None]
    # How it dials a plain broker from the relay thread (``start_tcp``).
    connect: Callable[[Address], tuple[int, bool] | None]


class _Progress:
    """How far a write that waits on its peer got: the descriptor of the
    TCP connection it goes out on (under TLS, the one under it), when the
    write last made progress, and how many bytes the peer had taken in
    then (``_acked``; None: not known). A write that makes none for the
    stall bound ends the connection (``Relay._send``,
    ``Relay._watch_stalls``). A write through TLS is given its time by
    ``scope``, whose deadline the stall clock pushes on while the peer
    takes bytes in."""

    __slots__ = ("acked", "scope", "since", "watch")

    def __init__(self, watch: int | None, since: float = math.inf, *, later: bool = False) -> None:
        self.watch = watch
        self.since = since
        # ``later``: read at the first look (``moved``), not now: a TLS
        # write nearly always goes at once, and the call costs about 5 us.
        self.acked = None if watch is None or later else _acked(watch)
        self.scope: trio.CancelScope | None = None

    def moved(self, now: float) -> bool:
        """Whether the peer took anything in since last looked (then
        progress, at ``now``): a peer that does is slow, not dead. The
        first look at a write whose start was not read counts as progress
        (what went before it is not known): its clock starts then."""
        if self.watch is None:
            return False
        acked = _acked(self.watch)
        if acked is None:
            return False
        if self.acked is None:
            self.acked = acked
            self.since = now
            return True
        if acked <= self.acked:
            return False
        self.acked = acked
        self.since = now
        return True


class _ThreadWrite(_Progress):
    """A write the relay thread waits to finish (``Relay._write_later``):
    the duplicate descriptor it watches for room, and the event it sets
    when it is over, made by the first trio write that must wait for it.
    With no descriptor, a write the thread began and handed back to trio
    (``Relay._hold_place``): over when trio takes it up. Its progress is
    also the room the thread found (``since``: the relay thread's clock,
    which is trio's)."""

    __slots__ = ("over",)

    def __init__(self, watch: int | None, since: float = math.inf) -> None:
        super().__init__(watch, since)
        self.over: trio.Event | None = None


Dialer = Callable[[Address, bool, float], Awaitable[trio.abc.Stream]]
Asker = Callable[[Address, Any], Awaitable[Any]]


class RuleRemovals:
    """Wakes the frames fault rules hold when rules are removed (the rule
    set's ``on_removal``): each waits for its time or for this, then looks
    whether it was let go (``Hold.released``)."""

    def __init__(self, faults: Faults) -> None:
        self._event = trio.Event()
        faults.on_removal(self._removed)

    def _removed(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class Relay:
    def __init__(
        self,
        core: Core,
        client: trio.abc.Stream | int,
        *,
        timing: Timing,
        dial: Dialer,
        ask: Asker,
        tap: Tap,
        room: Callable[[], Awaitable[None]] | None = None,
        thread: RelayThread | None = None,
        removals: RuleRemovals | None = None,
    ) -> None:
        self.core = core
        # Wakes frames held by fault rules when rules are removed (None:
        # they go at their time).
        self._removals = removals
        self.conn = core.conn
        # A core may offer a compiled step for its reads (``quick(from_client)``:
        # the step, or None for this read); one that does not is read in Python.
        self._quick: Callable[[bool], QuickStep | None] | None = getattr(core, "quick", None)
        # The client's stream, or, for a connection the relay thread
        # accepted (``park``), its socket's descriptor: its stream is made
        # when trio first needs it (``client``), as is the broker's.
        self._client = None if isinstance(client, int) else client
        self._broker: trio.abc.Stream | None = None
        self.timing = timing
        self._dial = dial
        self._ask = ask
        self._tap = tap
        self._room = room
        # Where a direction goes once the connection is established (see
        # relay_thread.py), and what it hands back: a step for trio to finish.
        self._thread = thread
        self._returned: dict[bool, Callable[[], Awaitable[bool]]] = {}
        # Each carried direction's lane in the thread's compiled loop, once armed.
        self._lanes: dict[bool, Any] = {}
        # One writer at a time per socket (made by the first write that must wait).
        self._locks: dict[Peer, trio.StrictFIFOLock] = {}
        # Writes holding or awaiting each lock: a write that must wait goes
        # before any later one (a plain count, read on every write).
        self._waiting = {Peer.CLIENT: 0, Peer.BROKER: 0}
        self._descriptors: dict[Peer, int | None] = {
            Peer.CLIENT: client if isinstance(client, int) else _descriptor(client),
            Peer.BROKER: None,
        }
        self._session: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        # Drain stops reading the client: it cancels the client's reading
        # task, which is then either waiting for data or between reads, never
        # in a write (a frame half written to the broker would be lost for
        # good): what that task must wait on runs shielded (``_do``), and
        # only ``_stop`` cancels those shields.
        self._reading: trio.CancelScope | None = None
        self._shields: set[trio.CancelScope] = set()
        self._draining = False
        self._drain_deadline: float | None = None
        self._handshake_scope: trio.CancelScope | None = None  # (``_handshake``)
        # When the handshake's clock started (a parked connection's: before
        # trio ran it), and, while the connection is parked (``park``), what
        # hands it to trio and what says it ended on the relay thread.
        self._since: float | None = None
        self._parked: Parking | None = None
        # Each parked direction's ``back`` event, for ``_read`` to wait on.
        self._backs: dict[bool, trio.Event] = {}
        # A dial a parked connection began that was not made at once.
        self._dialling: tuple[OpenUpstream, int] | None = None  # (its descriptor)
        self._ended_here = False  # (by _end_parked: once)
        # A write the relay thread waits to finish, by socket.
        self._thread_writes: dict[Peer, _ThreadWrite] = {}
        # trio's writes through TLS, by socket, for the stall clock to end
        # one whose peer takes nothing in (``_send``).
        self._tls_writes: dict[Peer, _Progress] = {}
        # Answers to Asks waiting to be written (``_answer``), and what the
        # reading waits on while there are ANSWERS_WAITING of them.
        self._answers_waiting = 0
        self._answer_room: trio.Event | None = None
        # Whether the clock of the relay thread's waiting writes runs (or is
        # asked for: ``_watch_stalls``).
        self._stall_clock = False
        self._stall_watching = False  # (its task started)
        self._stalled_peer: Peer | None = None  # (``_stalled``)
        self.bytes_in = 0
        self.reason = "closed"
        self._closing = False

    @property
    def _handshake(self) -> trio.CancelScope:
        """The handshake's clock, made when trio first needs it (a
        connection served parked from start to end never does)."""
        scope = self._handshake_scope
        if scope is None:
            scope = self._handshake_scope = trio.CancelScope()
        return scope

    @property
    def client(self) -> trio.abc.Stream:
        """The client's stream."""
        if self._client is None:
            fd = self._descriptors[Peer.CLIENT]
            assert fd is not None
            self._client = socket_stream(fd)
        return self._client

    @property
    def broker(self) -> trio.abc.Stream | None:
        """The broker's stream, once dialled."""
        if self._broker is None:
            fd = self._descriptors[Peer.BROKER]
            if fd is not None:
                self._broker = socket_stream(fd)
        return self._broker

    # --- lifecycle ---------------------------------------------------------------

    async def run(self) -> str:
        """Serve the connection until either side or the core ends it; the reason."""
        since = self._since if self._since is not None else trio.current_time()
        self._handshake.deadline = since + self.timing.handshake_timeout
        self._established()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._session = nursery.cancel_scope
                if self._closing:  # ended while its adoption was on its way
                    nursery.cancel_scope.cancel()
                # Three tasks at most: this one reads the client, one keeps
                # the clocks, one dials and then reads the broker. (A task
                # costs about 12 us to start and end, and a Cursus client
                # makes a connection per commit: see ``park``.)
                nursery.start_soon(self._clocks)
                if self._thread_writes:  # a write the thread began while parked
                    self._start_stall_clock()
                if False in self._backs:  # parked: its broker is read on the relay thread
                    nursery.start_soon(self._pump_broker)
                await self._pump_client()
        except Exception as exc:  # one connection never takes the proxy down
            self.reason = self._failed(exc)
        finally:
            thread = self._thread
            if thread is not None:
                for to in list(self._thread_writes):  # (a dup would keep the socket open)
                    self._end_thread_write(thread, to)
            for from_client in list(self._backs):  # parked directions never taken up
                fd = self._descriptors[Peer.CLIENT if from_client else Peer.BROKER]
                if thread is not None and fd is not None:
                    thread.drop(fd)
            self._backs.clear()
            if self._dialling is not None:
                os.close(self._dialling[1])
            # Both sides are hung up on so that the last frames written to
            # them arrive (a drain's goodbyes, an ERROR): a FIN after them,
            # then what the peers still send is dropped for a moment before
            # the sockets close (``hang_up``). The client's stream is the
            # proxy's to close too; closing it again there does nothing.
            ends = [self.client]
            if self.broker is not None:
                ends.append(self.broker)
            self.core.closed(self.reason)
            until = trio.current_time() + LINGER
            if self._drain_deadline is not None:  # never past the drain's end
                until = min(until, self._drain_deadline)
            stalled = self._stalled_peer
            if stalled is not None:
                # A peer that took nothing in will take no goodbye either:
                # reset, so that its end and the kernel's buffers for it
                # are freed now (a FIN would wait behind what it never took).
                end = self.client if stalled is Peer.CLIENT else self.broker
                if end is not None:
                    ends.remove(end)
                    _reset(end)
                    await trio.aclose_forcefully(end)
            await hang_up(ends, until)  # (closes them, cancelled or not)
        return self.reason

    async def drain(self, deadline: float) -> None:
        """Hand the client back to its reconnect logic without losing a send.

        Stop reading the client (what it sends meanwhile stays unreceipted,
        so it sends it again after reconnecting), let sends already forwarded
        get their receipts, then let the core say goodbye and hang up.
        """
        self._draining = True
        self._drain_deadline = deadline
        if self._reading is not None:
            self._reading.cancel()
        # A connection that ends meanwhile (a side hung up) gets no more
        # receipts: its drain is over then, not at the deadline.
        while self.core.in_flight_sends and not self._closing and trio.current_time() < deadline:
            await trio.sleep(0.02)
        if not self._closing:
            with trio.move_on_at(deadline):
                await self._do(self.core.drain())
        self._stop("drained")

    def abort(self) -> None:
        """End now: the proxy stops (a second SIGTERM), and a write a drain
        must not cut in half is cut all the same (its shield lifted)."""
        self._stop("drained")  # (a drain cut short)

    def _stop(self, reason: str) -> None:
        if not self._closing:
            self.reason = reason
        self._closing = True
        if self._session is not None:
            self._session.cancel()
        for shield in self._shields:
            shield.cancel()

    # --- parked: a short connection served by the relay thread alone -------------

    def park(self, thread: RelayThread, parking: Parking) -> None:
        """Serve the connection from the relay thread, with no trio task:
        its reads, the writes the sockets take whole, dialling a broker
        that is there at once (over loopback) and the connection's end.

        A protocol whose clients make a connection per request (Cursus: one
        per commit) is served this way from its first byte: such a
        connection cost about 0.9 ms of CPU in trio's tasks, cancel scopes
        and scheduler passes, against about 0.2 ms for the same reads and
        writes without them. At the first thing it does not do (anything
        but those: an ``Ask``, a ``Hold``, a write that must wait, a dial
        still in progress, an error), or when trio asks (``adopt``: a
        connection that lives on, a drain), the connection goes to trio:
        ``parking.adopt`` runs ``run`` for it, which takes each direction
        from where it is. Must be called in the trio thread, before ``run``.
        """
        fd = self._descriptors[Peer.CLIENT]
        assert fd is not None and self._thread is thread
        self._parked = parking
        self._since = thread.now()
        self._backs[True] = self._carry_on(thread, fd, True)

    def adopt(self) -> None:
        """In the trio thread: trio takes a parked connection over now."""
        parking, self._parked = self._parked, None
        if parking is not None:
            parking.adopt(self)

    def abandon(self) -> None:
        """In the trio thread, for a connection no trio task runs (parked,
        or handed over as the proxy stops): end it where it is."""
        if self._thread is not None:
            self._stop("closed")
            if self._dialling is not None:
                os.close(self._dialling[1])
                self._dialling = None
            self._end_parked(self._thread)

    def _act_parked(self, thread: RelayThread, action: Action, ended: bool) -> list[Action] | None:
        """An action other than Send for a parked connection, on the relay
        thread: what it led to (to do next), or None for trio to do it.
        ``ended``: the read was the end of the side's stream."""
        kind = type(action)
        if kind is Close:
            if not ended:
                # The core hangs up on a side still talking (a protocol
                # error, after its ERROR): trio does, waiting a moment for
                # what was written to arrive (``hang_up``), as this thread
                # may not.
                return None
            self._act(action)  # (logged and stopped: no task or scope to cancel yet)
            return []
        if kind is not OpenUpstream or self._descriptors[Peer.BROKER] is not None:
            return None
        assert isinstance(action, OpenUpstream)
        if action.tls or self._parked is None:
            return None
        try:
            started = self._parked.connect(action.address)
        except OSError as exc:
            message = f"cannot reach broker {action.address}: {exc}"
            return self.core.upstream_failed(message, thread.now())
        if started is None:
            return None  # a name, to look up: trio dials
        fd, connected = started
        if not connected:
            self._dialling = (action, fd)  # finished by trio
            return None
        self._upstream_now(thread, fd)
        hello: list[Action] = [Send(Peer.BROKER, action.hello)] if action.hello else []
        return hello + self.core.upstream_ready(thread.now())

    def _upstream_now(self, thread: RelayThread, fd: int) -> None:
        """The broker's connection made on the relay thread: its direction
        is carried there too (by its descriptor alone, as the client's)."""
        self._descriptors[Peer.BROKER] = fd
        self._since = thread.now()
        self._backs[False] = self._carry_on(thread, fd, False)

    def _end_parked(self, thread: RelayThread) -> None:
        """A parked connection ended on the relay thread: its sockets
        closed there (trio never waited on them), the core told, and the
        proxy (``parking.ended``)."""
        parking, self._parked = self._parked, None
        if self._ended_here:
            return
        self._ended_here = True
        for to in list(self._thread_writes):
            self._end_thread_write(thread, to)
        for stream, fd in (
            (self._client, self._descriptors[Peer.CLIENT]),
            (self._broker, self._descriptors[Peer.BROKER]),
        ):
            if stream is not None:  # a stream trio never ran: its socket
                assert isinstance(stream, trio.SocketStream)
                fd = stream.socket.detach() if stream.socket.fileno() != -1 else None
            if fd is not None:  # (its only copy: the watch of a waiting write is closed)
                thread.forget(fd)
                # What the peer sent that nobody read is dropped first: a
                # socket closed with unread bytes resets the connection, and
                # the peer loses what it had not read yet (``discard``).
                # (Nothing is waited for here: a side still talking when the
                # core hangs up on it goes to trio, ``_act_parked``.)
                discard(fd)
                os.close(fd)
        self._backs.clear()
        self.core.closed(self.reason)
        if parking is not None:
            parking.ended(self)

    # --- reading -------------------------------------------------------------------

    async def _pump_client(self) -> None:
        await self._pump(self.client, True)

    async def _pump_broker(self) -> None:
        assert self.broker is not None
        await self._pump(self.broker, False)

    async def _pump(self, stream: trio.abc.Stream, from_client: bool) -> None:
        if from_client:
            if self._draining:
                return
            with trio.CancelScope() as self._reading:
                await self._read(stream, from_client)
            self._reading = None
        else:
            await self._read(stream, from_client)

    async def _read(self, stream: trio.abc.Stream, from_client: bool) -> None:
        receive = self.core.receive_client if from_client else self.core.receive_broker
        room = self._room
        tap = self._tap
        conn = self.conn
        fd = _descriptor(stream)
        thread = self._thread if fd is not None and room is None else None
        ready = False  # the last read filled the buffer: more is likely waiting
        # A client speaks first, as soon as it has connected: its first
        # bytes are usually there by the time this runs, and reading them
        # at once saves a pass of the scheduler.
        fresh = from_client
        relayed = 0  # reads with data since the connection relays
        back = self._backs.pop(from_client, None)
        if back is not None:  # carried by the relay thread since the connection was parked
            assert thread is not None and fd is not None
            fresh = False
            if not await self._back(thread, fd, from_client, back):
                return
        while True:
            if from_client and self._answers_waiting >= ANSWERS_WAITING:
                # Answers the client's requests led to pile up (the client,
                # or the broker, reads slowly or not at all): the client is
                # read no more until some are written (backpressure).
                if self._answer_room is None:
                    self._answer_room = trio.Event()
                await self._answer_room.wait()
                continue
            if (
                thread is not None
                and fd is not None
                and relayed >= LEAVE_AFTER
                and self._may_leave(from_client)
            ):
                if not await self._away(thread, fd, from_client):
                    return
                continue
            if room is not None:
                await room()
            try:
                if fd is None:
                    data = bytes(await stream.receive_some(READ_SIZE))
                else:
                    # One scheduling point per read (see _descriptor).
                    if ready:
                        await trio.lowlevel.checkpoint()
                    elif not fresh:
                        await trio.lowlevel.wait_readable(fd)
                    fresh = False
                    try:
                        data = os.read(fd, READ_SIZE)
                    except BlockingIOError:
                        ready = False
                        continue
                    ready = len(data) == READ_SIZE
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                side = "client" if from_client else "broker"
                if from_client and not self.bytes_in and _tls_failure(exc):
                    tap.event(conn, Rejected("tls"))
                    log.warning("%s: TLS handshake failed: %s", conn.name, exc.__cause__)
                else:
                    log.info("%s: connection to %s lost: %s", conn.name, side, exc.__cause__ or exc)
                self._stop("lost")
                return
            if from_client:
                self.bytes_in += len(data)
            if self.core.established:
                relayed += 1 if len(data) < LEAVE_SIZE else LEAVE_AFTER
            started = perf_counter()
            now = trio.current_time()
            actions = receive(data, now)
            if actions:
                await self._do(actions, from_client)
                if type(actions[-1]) is Send and self.core.established:
                    tap.event(conn, Relayed(from_client, perf_counter() - started))
            if not data:
                return

    # --- the relay thread ----------------------------------------------------------

    def _may_leave(self, from_client: bool) -> bool:
        """Whether a direction may go to the relay thread now: the
        connection relays, both its sockets are plain, and nothing is
        ending it."""
        return (
            self.core.established
            and self._reads_on(from_client)
            and self._descriptors[Peer.BROKER] is not None
            and self._descriptors[Peer.CLIENT] is not None
        )

    def _reads_on(self, from_client: bool) -> bool:
        """Whether a direction is still read: not once the connection
        ends, nor the client once a drain began."""
        return not (self._closing or (from_client and self._draining))

    async def _away(self, thread: RelayThread, fd: int, from_client: bool) -> bool:
        """Let the relay thread carry a direction until it hands it back;
        then finish what it handed back. False: the direction ended."""
        back = self._carry_on(thread, fd, from_client)
        return await self._back(thread, fd, from_client, back)

    def _carry_on(self, thread: RelayThread, fd: int, from_client: bool) -> trio.Event:
        """Let the relay thread carry a direction: the event its hand-back sets."""
        back = trio.Event()
        self._lanes[from_client] = None  # made again, for this stay
        failed = functools.partial(self._step_failed, thread, fd, from_client, back, None)
        thread.carry(fd, functools.partial(self._carry, thread, fd, from_client, back), failed)
        return back

    def _step_failed(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        to: Peer | None,
        exc: BaseException,
        what: str = "a relay thread step",
    ) -> None:
        """A bug in one of this direction's steps on the relay thread (its
        read, or a write it waits to finish on ``to``), a compiled panic
        too: handed back to trio, which raises it and ends the connection
        as an internal error, both sides closed (``run``)."""
        if to is not None:
            self._end_thread_write(thread, to)
        self._disarm()
        error = _as_error(exc, what)
        self._hand_back(thread, fd, from_client, back, functools.partial(_reraise, error))

    async def _back(
        self, thread: RelayThread, fd: int, from_client: bool, back: trio.Event
    ) -> bool:
        """Wait for a carried direction to be handed back, then finish what
        was handed back. False: the direction ended."""
        try:
            await back.wait()
        except trio.Cancelled:
            thread.drop(fd)
            # Handed back, but not taken up yet: a write it started is
            # finished (a drain never cuts one in half; _stop cancels this).
            returned = self._returned.pop(from_client, None)
            if returned is not None and from_client and not self._closing:
                with trio.CancelScope(shield=True) as shield:
                    self._shields.add(shield)
                    try:
                        await returned()
                    finally:
                        self._shields.discard(shield)
            raise
        thread.drop(fd)
        return await self._returned.pop(from_client)()

    def _carry(self, thread: RelayThread, fd: int, from_client: bool, back: trio.Event) -> None:
        """One read of a carried direction, on the relay thread: what
        ``_read`` does for it, as long as that is reading, the core and
        writes the sockets take whole. Anything else is handed back."""
        if not self._reads_on(from_client):
            # Ended or draining in trio, whose cancellation of this direction
            # has not arrived yet: nothing more is read, as it would not be.
            thread.drop(fd)
            return
        to = Peer.BROKER if from_client else Peer.CLIENT
        step = self._quick(from_client) if self._quick is not None else None
        if step is not None and not self._waiting[to]:
            # Nearly every read: carried whole in one compiled call.
            sink = self._descriptors[to]
            assert sink is not None
            try:
                got = step.carry(fd, sink, from_client, thread.now())
            except BaseException as exc:  # a panic too (PyO3's PanicException)
                got = exc
            if type(got) is int:
                if from_client:
                    self.bytes_in += got
                self._arm(thread, fd, from_client, back, to, step, sink)
                return
            self._after_carry(thread, fd, from_client, back, to, got)
            return
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._disarm()
            failed = functools.partial(self._read_failed, exc, from_client)
            self._hand_back(thread, fd, from_client, back, failed)
            return
        self._carry_read(thread, fd, from_client, back, data)

    def _arm(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        to: Peer,
        step: QuickStep,
        sink: int,
    ) -> None:
        """Let the relay thread's compiled loop carry this direction's next
        reads itself, until Python code runs again (relay_thread.py). A
        lane carries with the step it was made with: when the core's step
        is another (it renewed it, the taps having changed: a live view
        began or ended), the direction gets a new lane, or the old step,
        which no longer holds what the core counts on, would carry on."""
        lane = self._lanes.get(from_client)
        if lane is None or lane.step is not step:
            slow = functools.partial(self._carry, thread, fd, from_client, back)
            after = functools.partial(self._after_carry, thread, fd, from_client, back, to)
            lane = thread.lane(step, fd, sink, from_client, slow, after)
            if lane is None:  # the Python loop: nothing to arm
                return
            self._lanes[from_client] = lane
            thread.swap(fd, lane)
        lane.arm(thread.epoch)

    def _disarm(self) -> None:
        """Python code of this connection runs on the relay thread: its
        lanes go through their Python read step once more, which looks
        again. Other connections' lanes stay armed: nothing of theirs
        changes here (trio's turn disarms every lane)."""
        for lane in self._lanes.values():
            if lane is not None:
                lane.disarm()

    def _after_carry(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        to: Peer,
        got: object,
    ) -> None:
        """What the compiled step gave back for a read it did not carry
        whole: nothing read, the bytes read (for the usual way), a read
        accounted but not written whole, or what it raised."""
        self._disarm()  # Python code that may change what its lanes rely on runs now
        if got is None or isinstance(got, BlockingIOError):
            return
        if isinstance(got, OSError):
            failed = functools.partial(self._read_failed, got, from_client)
            self._hand_back(thread, fd, from_client, back, failed)
            return
        if isinstance(got, BaseException):  # the step's bug: raised in trio, which ends it
            self._step_failed(thread, fd, from_client, back, None, got, "the compiled step")
            return
        if type(got) is bytes:  # not whole frames the scanner took: the usual way
            self._carry_read(thread, fd, from_client, back, got)
            return
        assert isinstance(got, tuple)
        self._carried_in_part(thread, fd, from_client, back, to, *got)

    def _carry_read(
        self, thread: RelayThread, fd: int, from_client: bool, back: trio.Event, data: bytes
    ) -> None:
        """A read carried the usual way: the core, and the writes the
        sockets take whole (parked, its dialling and its end too); anything
        else is handed back."""
        self._disarm()
        if not data and self._parked is None:  # the end: closed as usual, by trio
            ended = functools.partial(self._ended, from_client)
            self._hand_back(thread, fd, from_client, back, ended)
            return
        if from_client:
            self.bytes_in += len(data)
        started = perf_counter()
        try:
            receive = self.core.receive_client if from_client else self.core.receive_broker
            actions = receive(data, thread.now())
            # (As in trio: a read whose actions end in a write counts as
            # relayed; one that dialled first does not.)
            relayed = bool(actions) and type(actions[-1]) is Send
            done, rest = 0, b""
            while done < len(actions):
                action = actions[done]
                if type(action) is Send:
                    assert isinstance(action, Send)
                    try:
                        rest = self._write_now(action.to, action.data)
                    except OSError as exc:
                        lost = functools.partial(self._lost_later, action.to, exc)
                        self._hand_back(thread, fd, from_client, back, lost)
                        return
                    if rest:
                        break
                elif self._parked is None:
                    break
                else:
                    more = self._act_parked(thread, action, not data)
                    if more is None:
                        break
                    if self._closing:
                        self._end_parked(thread)
                        return
                    actions[done + 1 : done + 1] = more
                done += 1
            else:
                if not data:  # parked: this direction ended, the connection goes on
                    self._hand_back(thread, fd, from_client, back, _ends)
                elif relayed and self.core.established:
                    self._tap.event(self.conn, Relayed(from_client, perf_counter() - started))
                return
        except BaseException as exc:  # raised in trio, where it ends the connection as usual
            # (A panic of the compiled code the core runs too: see ``_as_error``.)
            self._step_failed(thread, fd, from_client, back, None, exc, "the connection's read")
            return
        held = self._hold_place(actions[done], rest)
        finish = functools.partial(self._finish_read, actions, done, rest, from_client, started,
                                   held)  # fmt: skip
        if not data:
            finish = functools.partial(self._finish_end, actions, done, rest, held)
        self._hand_back(thread, fd, from_client, back, finish)

    def _hold_place(self, action: Action, rest: bytes) -> Peer | None:
        """A write the relay thread began and hands back to trio with
        ``rest`` left of it: until trio takes it up (``_take_up``), every
        other write to that socket waits, as for a thread write, or it
        could land inside the frame (a drain's CLOSE_PRODUCER, say). The
        socket, or None for anything else."""
        if type(action) is not Send or not rest:
            return None
        assert isinstance(action, Send)
        if len(rest) == len(action.data):  # nothing written: no frame in part
            return None
        self._waiting[action.to] += 1
        self._thread_writes[action.to] = _ThreadWrite(None)
        return action.to

    def _take_up(self, held: Peer | None) -> None:
        """In trio, taking up a write handed back: the writes that waited
        for it go after it (the lock is taken in the same step)."""
        if held is not None and self._thread is not None:
            self._end_thread_write(self._thread, held)

    def _carried_in_part(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        to: Peer,
        read: int,
        rest: bytes,
        error: OSError | None,
        seconds: float,
    ) -> None:
        """A read the compiled step accounted but could not write whole:
        the rest is written by trio (the writing failed: the connection ends)."""
        if from_client:
            self.bytes_in += read
        if error is not None:
            lost = functools.partial(self._lost_later, to, error)
            self._hand_back(thread, fd, from_client, back, lost)
            return
        started = perf_counter() - seconds
        sink = self._descriptors[to]
        sends: list[Action] = [Send(to, rest)]
        if sink is None or self._closing or self._waiting[to]:  # (not as the step runs)
            finish = functools.partial(self._finish_read, sends, 0, rest, from_client, started)
            self._hand_back(thread, fd, from_client, back, finish)
            return
        try:  # a duplicate, registered for writability apart from the sink's reads
            watch = os.dup(sink)
        except OSError:
            # Out of descriptors (EMFILE): trio writes the rest, waiting for
            # room with none of its own; until it takes it up, no other
            # write to the socket goes first (as for ``_hold_place``).
            self._waiting[to] += 1
            self._thread_writes[to] = _ThreadWrite(None)
            finish = functools.partial(self._finish_read, sends, 0, rest, from_client, started, to)
            self._hand_back(thread, fd, from_client, back, finish)
            return
        self._write_later(thread, fd, from_client, back, to, sink, watch, rest, started)

    def _write_later(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        to: Peer,
        sink: int,
        watch: int,
        rest: bytes,
        started: float,
    ) -> None:
        """The rest of a write the socket did not take whole (a slow
        reader), written by the relay thread when ``watch`` (a duplicate of
        ``sink``, which this closes) says the socket has room: the
        direction reads nothing meanwhile (backpressure, as in trio), and
        no other write to that socket goes first (``_waiting``; trio's
        ``_send`` waits for ``_thread_writes``). Handing this to trio cost
        three passes of its scheduler each time: at a slow consumer's
        pace, about a fifth of a Cursus stream's CPU."""
        thread.drop(fd)  # its reads wait
        thread.write_waits += 1
        self._waiting[to] += 1
        pending = self._thread_writes[to] = _ThreadWrite(watch, thread.now())
        if not self._stall_clock:  # (once per connection: it runs on)
            self._stall_clock = True
            thread.soon(self._start_stall_clock)
        view = memoryview(rest)

        def write() -> None:
            nonlocal view
            if self._closing:  # trio ends the connection (and closes ``watch``)
                thread.drop(watch)
                return
            try:
                written = os.write(sink, view)
            except BlockingIOError:
                return
            except OSError as exc:
                done()
                self._disarm()
                lost = functools.partial(self._lost_later, to, exc)
                self._hand_back(thread, fd, from_client, back, lost)
                return
            view = view[written:]
            if view:
                if written:
                    pending.since = thread.now()
                return
            done()
            # The write's watch is dropped, and with it what the thread calls
            # should this step raise: a bug from here on ends the
            # connection here, or the direction would never be read again.
            failed = functools.partial(self._step_failed, thread, fd, from_client, back, None)
            try:
                self._disarm()
                if self.core.established:
                    self._tap.event(self.conn, Relayed(from_client, perf_counter() - started))
                if not self._reads_on(from_client):  # a drain began: trio read no more either
                    return
                lane = self._lanes.get(from_client)
                carry = lane if lane is not None else functools.partial(
                    self._carry, thread, fd, from_client, back
                )  # fmt: skip
                thread.carry(fd, carry, failed)  # read on
            except BaseException as exc:  # a compiled panic too
                failed(exc)

        def done() -> None:
            self._end_thread_write(thread, to)

        failed = functools.partial(self._step_failed, thread, fd, from_client, back, to)
        thread.watch_writable(watch, write, failed)

    def _end_thread_write(self, thread: RelayThread, to: Peer) -> None:
        """A write the relay thread waited for is over (or the connection
        is): its watch closed, later writes free to go (trio's, if one
        waits: told in trio's thread, the only wake of trio this costs)."""
        pending = self._thread_writes.pop(to, None)
        if pending is not None:
            if pending.watch is not None:
                thread.drop(pending.watch)
                os.close(pending.watch)
            self._waiting[to] -= 1
            if pending.over is not None:
                thread.soon(pending.over.set)

    def _hand_back(
        self,
        thread: RelayThread,
        fd: int,
        from_client: bool,
        back: trio.Event,
        returned: Callable[[], Awaitable[bool]],
    ) -> None:
        thread.drop(fd)
        thread.handed_back += 1
        self._returned[from_client] = returned
        thread.soon(back.set)
        if self._parked is not None:  # trio takes the connection over
            adopt, self._parked = self._parked.adopt, None
            thread.soon(functools.partial(adopt, self))

    async def _finish_read(
        self,
        actions: list[Action],
        done: int,
        rest: bytes,
        from_client: bool,
        started: float,
        held: Peer | None = None,
    ) -> bool:
        self._take_up(held)
        await self._finish(actions, done, rest, from_client)
        if type(actions[-1]) is Send and self.core.established:
            self._tap.event(self.conn, Relayed(from_client, perf_counter() - started))
        return True

    async def _finish_end(
        self, actions: list[Action], done: int, rest: bytes, held: Peer | None
    ) -> bool:
        """What a parked direction's end asked for that needs trio; the
        direction has ended."""
        self._take_up(held)
        await self._finish(actions, done, rest, False)
        return False

    async def _ended(self, from_client: bool) -> bool:
        receive = self.core.receive_client if from_client else self.core.receive_broker
        actions = receive(b"", trio.current_time())
        if actions:
            await self._do(actions, from_client)
        return False

    async def _read_failed(self, exc: OSError, from_client: bool) -> bool:
        side = "client" if from_client else "broker"
        log.info("%s: connection to %s lost: %s", self.conn.name, side, exc)
        self._stop("lost")
        return False

    async def _lost_later(self, to: Peer, exc: OSError) -> bool:
        self._lost(to, exc)
        return False

    # --- acting --------------------------------------------------------------------

    async def _do(self, actions: list[Action], drainable: bool = False) -> None:
        """Carry out ``actions`` in order. What needs no waiting (nearly
        always: a write the socket takes whole) is done without passing
        through the scheduler. ``drainable``: called from the client's
        reading loop, which a drain cancels; from the first action that must
        wait on, the rest then run shielded, so that a drain never cuts a
        write in half."""
        done, rest = self._do_now(actions)
        await self._finish(actions, done, rest, drainable)

    async def _finish(self, actions: list[Action], done: int, rest: bytes, drainable: bool) -> None:
        """``_do`` from the first action that must wait (``done``; ``rest``:
        what is left to write of it, if a Send)."""
        if done < len(actions) and not self._closing:
            if drainable:
                with trio.CancelScope(shield=True) as shield:
                    self._shields.add(shield)
                    try:
                        await self._do_waiting(actions, done, rest)
                    finally:
                        self._shields.discard(shield)
            else:
                await self._do_waiting(actions, done, rest)
        self._established()

    def _established(self) -> None:
        # (cancel() is not free even when repeated: it describes the task.)
        if not self._handshake.cancel_called and self.core.established:
            self._handshake.cancel()

    def _do_now(self, actions: list[Action]) -> tuple[int, bytes]:
        """Carry out actions up to the first that must wait: its index, and
        what is left of it to write if it is a Send."""
        for index, action in enumerate(actions):
            kind = type(action)
            if kind is Send:
                assert isinstance(action, Send)
                rest = self._send_now(action.to, action.data)
                if rest:
                    return index, rest
                if self._closing:
                    break  # the write failed, or another task ended the connection
            elif kind is Hold:
                return index, b""
            elif not self._act(action):
                break
        return len(actions), b""

    async def _do_waiting(self, actions: list[Action], start: int, rest: bytes) -> None:
        for action in actions[start:]:
            kind = type(action)
            if kind is Send:
                assert isinstance(action, Send)
                await self._send(action.to, rest or action.data)
            elif kind is Hold:
                assert isinstance(action, Hold)
                with trio.move_on_at(action.until):
                    while not action.released():  # a rule removed lets go
                        if self._removals is None:
                            await trio.sleep_forever()
                        await self._removals.wait()
            elif not self._act(action):
                return
            rest = b""

    def _act(self, action: Action) -> bool:
        """Carry out an action other than Send and Hold; False once it closed."""
        kind = type(action)
        if kind is Close:
            assert isinstance(action, Close)
            if action.message:
                log.log(action.level, "%s: %s", self.conn.name, action.message)
            self._stop(action.reason)
            return False
        if kind is OpenUpstream:
            assert isinstance(action, OpenUpstream) and self._nursery is not None
            # Dialling has its own timeout; the handshake's starts after it.
            self._handshake.deadline = math.inf
            self._nursery.start_soon(self._open_upstream, action)
        elif kind is Ask:
            assert isinstance(action, Ask) and self._nursery is not None
            self._nursery.start_soon(self._answer, action)
        return True

    def _send_now(self, to: Peer, data: bytes) -> bytes:
        """Write what the socket takes now; what is left to write."""
        try:
            return self._write_now(to, data)
        except OSError as exc:
            self._lost(to, exc)
            return b""

    def _write_now(self, to: Peer, data: bytes) -> bytes:
        """``_send_now``, raising the socket's error."""
        fd = self._descriptors[to]
        if fd is None:
            stream = self.client if to is Peer.CLIENT else self.broker
            return data if stream is not None else b""  # nowhere to send yet: dropped
        if self._waiting[to]:
            return data  # a write that had to wait goes first
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            return data
        return data[written:]

    async def _send(self, to: Peer, data: bytes) -> None:
        stream = self.client if to is Peer.CLIENT else self.broker
        if stream is None:
            return
        fd = self._descriptors[to]
        lock = self._locks.get(to)
        if lock is None:
            lock = self._locks[to] = trio.StrictFIFOLock()
        self._waiting[to] += 1
        try:
            pending = self._thread_writes.get(to)
            if pending is not None:  # the relay thread's write of what came before
                if pending.over is None:
                    pending.over = trio.Event()
                await pending.over.wait()
            # Uncontended (nearly always), the lock is taken without the
            # scheduler round trip trio's acquire() adds.
            try:
                lock.acquire_nowait()
            except trio.WouldBlock:
                await lock.acquire()
            # A peer that takes nothing in for the stall bound is dead.
            # Progress is what the peer took in (``_acked``), not the
            # socket's room: a big send buffer drained at a slow link's
            # pace says it has room only once a third of it went. On plain
            # TCP each wait for room is given the stall bound, and looks
            # again while the peer took some in. A write through TLS cannot
            # be cut and go on (its stream would be broken): it is given
            # the stall bound and a tick of the stall clock, which pushes
            # that on whenever it sees the peer take bytes in on the TCP
            # connection under it (``_watch_stalls``: its first look at
            # the write reads where the peer stood, and counts as progress,
            # so that a write that goes at once reads nothing); the bound
            # holds without the clock (cancelled with the connection's tasks).
            # Where that is not known, each piece is given the stall bound.
            clocked = False
            try:
                limit = self._stall
                view = memoryview(data)
                raw = fd if fd is not None else stream_descriptor(stream)
                progress = None
                if raw is not None:
                    # (Through TLS, the start is read by the clock's first look.)
                    clocked = fd is None and _acked_known(raw)
                    progress = _Progress(raw, trio.current_time(), later=clocked)
                if clocked:
                    assert progress is not None
                    self._tls_writes[to] = progress
                    self._start_stall_clock()
                    with trio.move_on_after(limit + limit / 4) as waited:
                        progress.scope = waited
                        while view:
                            await stream.send_all(view[:STALL_PIECE])
                            view = view[STALL_PIECE:]
                    if waited.cancelled_caught:
                        self._stalled(to, limit)
                        return
                while view:
                    with trio.move_on_after(limit) as waited:
                        if fd is None:
                            await stream.send_all(view[:STALL_PIECE])
                            view = view[STALL_PIECE:]
                        else:
                            await trio.lowlevel.wait_writable(fd)
                            with contextlib.suppress(BlockingIOError):
                                written = os.write(fd, view)
                                view = view[written:]
                    if waited.cancelled_caught:
                        if progress is not None and progress.moved(trio.current_time()):
                            continue  # slow, not dead
                        self._stalled(to, limit)
                        return
            finally:
                if clocked:
                    del self._tls_writes[to]
                lock.release()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._lost(to, exc)
        finally:
            self._waiting[to] -= 1

    @property
    def _stall(self) -> float:
        """How long a write may make no progress before its peer counts as
        dead: two keepalive intervals, as long as a silent lookup client is
        kept (and a Pulsar broker keeps a client that answers no ping)."""
        return 2 * self.timing.keepalive_interval

    def _stalled(self, to: Peer, seconds: float) -> None:
        """A peer took nothing in for ``seconds`` (a hung consumer, its
        window full and its host still acknowledging; a broker that stopped
        reading): the connection ends, freeing its other side."""
        if not self._closing:
            side = "client" if to is Peer.CLIENT else "broker"
            log.info("%s: the %s took nothing in for %gs, closing", self.conn.name, side, seconds)
            self._stalled_peer = to
            self._stop("idle")

    def _start_stall_clock(self) -> None:
        """In the trio thread: the clock of the relay thread's waiting
        writes, from the first one on (it then ticks until the end)."""
        if self._stall_watching:
            return
        nursery = self._nursery
        if nursery is None or self._closing:
            self._stall_clock = False  # parked: ``run`` starts it
            return
        self._stall_watching = True
        nursery.start_soon(self._watch_stalls)

    async def _watch_stalls(self) -> None:
        """End the connection when a write the relay thread waits to
        finish, or one of trio's through TLS, has made no progress for the
        stall bound (trio's plain waits bound themselves: ``_send``; a
        TLS write ends by its own deadline, which this pushes on while the
        peer takes bytes in). Looked at every quarter of it. Started by
        the relay thread's first waiting write, it ticks until the end; by
        a TLS write, until a tick finds none in progress (the next TLS
        write starts it again: an idle TLS connection keeps no clock)."""
        limit = self._stall
        try:
            while not self._closing:
                await trio.sleep(limit / 4)
                now = trio.current_time()
                writes: list[tuple[Peer, _Progress]] = [
                    *self._thread_writes.items(), *self._tls_writes.items()
                ]  # fmt: skip
                for to, pending in writes:
                    scope = pending.scope
                    if pending.moved(now):  # the peer took some in: slow, not dead
                        if scope is not None:  # (a TLS write: ``_send``)
                            scope.deadline = now + limit + limit / 4
                        continue
                    if scope is None and now - pending.since >= limit:
                        self._stalled(to, now - pending.since)
                        return
                if not (self._stall_clock or self._thread_writes or self._tls_writes):
                    return
        finally:
            self._stall_watching = False

    def _lost(self, to: Peer, exc: BaseException) -> None:
        side = "client" if to is Peer.CLIENT else "broker"
        log.info("%s: connection to %s lost: %s", self.conn.name, side, exc.__cause__ or exc)
        self._stop("lost")

    async def _open_upstream(self, action: OpenUpstream) -> None:
        dialling, self._dialling = self._dialling, None
        stream: trio.abc.Stream
        try:
            if dialling is not None and dialling[0] is action:  # begun while parked
                stream = await finish_dial(dialling[1], action.address,
                                           self.timing.connect_timeout)  # fmt: skip
            else:
                stream = await self._dial(action.address, action.tls, self.timing.connect_timeout)
        except OSError as exc:
            message = f"cannot reach broker {action.address}: {exc}"
            await self._do(self.core.upstream_failed(message, trio.current_time()))
            return
        self._broker = stream
        self._descriptors[Peer.BROKER] = _descriptor(stream)
        self._handshake.deadline = trio.current_time() + self.timing.handshake_timeout
        if action.hello:
            await self._do([Send(Peer.BROKER, action.hello)])
        # A protocol without a handshake of its own (Cursus) relays what the
        # client sent meanwhile now that there is somewhere to send it.
        actions = self.core.upstream_ready(trio.current_time())
        done, rest = self._do_now(actions)
        if done < len(actions) and not self._closing:
            # A write that must wait: the broker is read meanwhile, by a
            # task of its own (its answers could otherwise hold up the write).
            assert self._nursery is not None
            self._nursery.start_soon(self._pump_broker)
            await self._finish(actions, done, rest, False)
            return
        self._established()
        # This task reads the broker from now on.
        await self._pump_broker()

    async def _answer(self, action: Ask) -> None:
        answer = await self._ask(action.address, action.request)
        actions = self.core.answered(action.token, answer, trio.current_time())
        done, rest = self._do_now(actions)
        if done == len(actions) or self._closing:
            self._established()
            return
        # A write that must wait (the peer reads slowly, or not at all):
        # counted, so that the reading stops while too many wait.
        self._answers_waiting += 1
        try:
            await self._finish(actions, done, rest, False)
        finally:
            self._answers_waiting -= 1
            room = self._answer_room
            if room is not None and self._answers_waiting < ANSWERS_WAITING:
                self._answer_room = None
                room.set()

    # --- clocks --------------------------------------------------------------------

    async def _clocks(self) -> None:
        """The handshake's deadline, then keepalive ticks (nothing to do
        before the handshake: the cores keep alive established connections)."""
        await self._watch_handshake()
        if not self._closing and getattr(self.core, "keeps_alive", True):
            await self._keepalive()

    async def _watch_handshake(self) -> None:
        with self._handshake:
            await trio.sleep_forever()
        # Cancelled once the core got past its handshake, which it may have
        # ended since (a last ERROR still being written): only a deadline
        # that passed is a timeout.
        if self.core.established or self._closing:
            return
        if trio.current_time() < self._handshake.deadline:
            return
        timeout = self.timing.handshake_timeout
        if not self.core.upstream_pending:
            self._tap.event(self.conn, Rejected("handshake_timeout"))
            log.info("%s: no CONNECT within %gs, closing", self.conn.name, timeout)
            self._stop("handshake_timeout")
            return
        message = f"broker did not complete the handshake within {timeout:g}s"
        await self._do(self.core.upstream_failed(message, trio.current_time()))

    async def _keepalive(self) -> None:
        # Ticks at half the interval: a ping goes out between 1 and 1.5
        # intervals of silence, however the silence lines up with the ticks.
        interval = self.timing.keepalive_interval
        while True:
            await trio.sleep(interval / 2)
            actions = self.core.keepalive(trio.current_time(), interval)
            if actions:
                # What the keepalive writes (a PING, a refresh's
                # AUTH_CHALLENGE) waits behind what is being written to the
                # peer, as long as that write goes on: a peer taking a large
                # MESSAGE in at a slow link's pace is alive. A peer that
                # takes nothing in (a hung client: its window full, its host
                # still acknowledging) holds it no longer than the stall
                # bound: the write ahead, or this one, then ends the
                # connection as ``idle`` (``_send``, ``_watch_stalls``). The
                # next tick comes after the write, so the peer that was
                # slow to get it has time to answer.
                await self._do(actions)

    def _failed(self, exc: BaseException) -> str:
        """Say, in one line, why a connection ended badly; the reason, for the recording."""
        reason = "error"
        for leaf in leaves(exc):
            reason = type(leaf).__name__
            log.error("%s: internal error, connection closed: %r", self.conn.name, leaf,
                      exc_info=leaf)  # fmt: skip
        return reason


def _reraise(exc: BaseException) -> Awaitable[bool]:
    raise exc


async def _ends() -> bool:
    """A direction that ended, its end done: nothing more to read."""
    return False


def _as_error(exc: BaseException, what: str) -> Exception:
    """``exc``, raised on the relay thread, as an Exception for trio. A
    panic of compiled code (PyO3's PanicException) is no Exception: raised
    as it is, it would go past ``run``'s handling of a connection's errors
    (and, left to the thread's loop, the connection hung, never handed
    back)."""
    if isinstance(exc, Exception):
        return exc
    error = RuntimeError(f"{what} panicked: {exc}")
    error.__cause__ = exc
    return error


def _acked(fd: int) -> int | None:
    """How many bytes socket ``fd``'s peer has acknowledged so far
    (TCP_INFO's ``tcpi_bytes_acked``, Linux 4.1 and later; a peer whose
    window is shut acknowledges nothing more); None where the system does
    not say. The same whatever is written over the socket (TLS records
    included), so it tells progress under TLS too."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:  # (closed already)
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return None
    finally:
        sock.detach()
    if len(info) < _BYTES_ACKED + 8:
        return None
    return int(struct.unpack_from("=Q", info, _BYTES_ACKED)[0])


def _acked_known(fd: int) -> bool:
    """Whether ``_acked`` says what the peer took in on this system (asked
    of socket ``fd`` until it does once: then known for the process)."""
    global _ACKED_KNOWN
    if not _ACKED_KNOWN:
        _ACKED_KNOWN = _acked(fd) is not None
    return _ACKED_KNOWN


_ACKED_KNOWN = False

# struct tcp_info (linux/tcp.h): ``tcpi_bytes_acked``, a __u64 after 8
# bytes of __u8 fields, 24 __u32 and 2 __u64.
# Linux's layout: elsewhere (FreeBSD's tcp_info) the offset holds another
# field, so TCP_INFO is asked only on Linux (-1: an option no system has).
_TCP_INFO: int = getattr(socket, "TCP_INFO", -1) if sys.platform == "linux" else -1
_BYTES_ACKED = 120
_TCP_INFO_SIZE = _BYTES_ACKED + 8


def _reset(stream: trio.abc.Stream) -> None:
    """Have closing ``stream`` reset its TCP connection (SO_LINGER 0)."""
    fd = stream_descriptor(stream)
    if fd is None:
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # closed already: nothing to reset
    finally:
        sock.detach()


def _tls_failure(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, ssl.SSLError)
