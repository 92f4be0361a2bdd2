"""The relay thread: established plain-TCP connections relayed outside trio's scheduler.

A frame that crosses the proxy alone (a sidecar's usual load: tens to
thousands of messages a second) pays trio's whole round trip for one read:
re-arming the descriptor in epoll (trio registers it one-shot, so an
``epoll_ctl`` per wait), parking and waking the reading task, a pass of the
run loop. Measured, that is about 58k instructions per crossing, most of
what the crossing costs. Once a connection is established and both its
sockets are plain TCP, the relay hands each direction's socket to this
thread, which keeps it registered (level-triggered, no re-arming) and, when
it is readable, runs the relay's own read step (``Relay._carry``): the read,
the protocol core, the taps, the writes that the socket takes whole. Anything
else (an action other than a write, a write that must wait, the end of the
connection, an error) hands the direction back to trio, which finishes it
exactly as before and gives the socket back to the thread afterwards.

One rule makes this safe: Python code of the proxy runs in one thread at a
time. The trio thread holds the turn whenever it runs, and lets go of it
only while it waits for I/O (a trio instrument's ``before_io_wait`` and
``after_io_wait``); the relay thread runs its read steps only while holding
it. So the cores, taps, metrics and recorder never see two threads at once,
and nothing in them needs a lock of its own. The turn is fair: whichever
thread is waiting for it gets it next (a taker passes a gate first), so a
busy relay thread cannot starve trio's own work (handshakes, clocks, the
recorder's writer, scrapes), nor trio the relayed traffic. Where built, it
is compiled (``Turn``) and the relay thread waits for it without the GIL.

Where built, the loop itself is compiled (rust/src/carrier.rs): it waits
on epoll without the GIL and, for a direction whose ``Lane`` is armed,
calls the protocol's compiled step itself, with no Python code per read.
The relay's Python read step arms a lane when it has found everything
that lets the compiled step carry the direction's reads; the epoch moves
on (disarming every lane) whenever Python code that could change that is
about to run: trio's turn (``after_io_wait``), or a read step here doing
more than calling the compiled step (``bump``).

Should the loop itself end other than by ``stop`` (a bug: a panic in the
compiled step, an error of the loop's own), the thread logs it and the
proxy stops with an error (``RelayThreadDied``): its carried connections
would otherwise hang with nobody reading them.

What a read step may not do from this thread is touch trio's scheduler
(setting an event, cancelling a scope): ``soon`` runs such a call in the
trio thread. Code that may run in either thread tells which by
``trio.lowlevel.in_trio_run()`` (false here).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

try:  # the loop in compiled code (rust/src/carrier.rs)
    from sluice._frames import Carrier, Lane, Turn
except ImportError:  # a source tree nobody built: the loop below
    Carrier = Lane = Turn = None  # type: ignore[assignment,misc]

log = logging.getLogger("sluice.relay")


class RelayThreadDied(RuntimeError):
    """The relay thread's loop ended other than by ``stop``: a bug."""


class RelayThread(trio.abc.Instrument):
    """One thread that relays carried sockets for one trio run (a worker)."""

    def __init__(self, token: trio.lowlevel.TrioToken, clock: trio.abc.Clock) -> None:
        self._token = token
        # trio's clock, read from either thread.
        self.now: Callable[[], float] = clock.current_time
        self._offset = _monotonic_offset(clock)
        self._epoll = select.epoll()
        self._steps: dict[int, Callable[[], None]] = {}
        # What ends a step's connection when the step fails (a bug, a
        # compiled panic), by descriptor (``carry``, ``watch_writable``).
        self._on_failure: dict[int, Callable[[BaseException], None]] = {}
        # The compiled loop, where built; this class's own otherwise.
        self._carrier = Carrier() if Carrier is not None else None
        self._steps_run = 0  # by the Python loop
        # Steps of ``listen`` and ``watch_writable`` (either loop): no reads.
        self._other_runs = 0
        self.turn: Turn | _Turn = Turn() if Turn is not None else _Turn()
        self._stopping = False
        self.handed_back = 0  # directions handed back to trio (counted by the relay)
        # Connections served from their first byte (Relay.park), by where
        # they ended: here, or in trio (counted by the proxy).
        self.parked_ended = 0
        self.parked_adopted = 0
        # Carried descriptors that are no connection's reads: listening
        # sockets, and sockets watched for room to write (write_waits).
        self._others: set[int] = set()
        self.write_waits = 0  # writes the relay thread waited for itself
        # Written once to stop the thread's wait.
        self._stop_r, self._stop_w = os.pipe()
        self._epoll.register(self._stop_r, select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="sluice-relay", daemon=True)
        # What ended the loop other than ``stop`` (None: nothing), and what
        # the trio thread is told with when it does (``relay_thread``).
        self.died: BaseException | None = None
        self.on_death: Callable[[], object] | None = None

    # --- what the relay asks of it (from the trio thread, or a read step) -----------

    def carry(
        self,
        fd: int,
        step: Callable[[], None],
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Run ``step`` on this thread whenever ``fd`` is readable, until
        ``drop``; should it raise, ``fd`` is dropped and ``failed`` given
        what it raised (``_failed``)."""
        self._steps[fd] = step
        if failed is not None:
            self._on_failure[fd] = failed
        self._epoll.register(fd, select.EPOLLIN)

    def listen(
        self,
        fd: int,
        step: Callable[[], None],
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``carry`` for a listening socket (``step`` accepts)."""
        self.carry(fd, self._no_read(step), failed)
        self._others.add(fd)

    def watch_writable(
        self,
        fd: int,
        step: Callable[[], None],
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Run ``step`` on this thread whenever ``fd`` has room to write
        (or has failed), until ``drop``; ``failed`` as for ``carry``."""
        self._steps[fd] = self._no_read(step)
        if failed is not None:
            self._on_failure[fd] = failed
        self._others.add(fd)
        self._epoll.register(fd, select.EPOLLOUT)

    def _no_read(self, step: Callable[[], None]) -> Callable[[], None]:
        """``step``, counted apart from the reads (``steps_run``): both
        loops count every step they run."""

        def counted() -> None:
            self._other_runs += 1
            step()

        return counted

    def drop(self, fd: int) -> None:
        """Stop carrying ``fd`` (nothing if it is not carried)."""
        self._others.discard(fd)
        self._on_failure.pop(fd, None)
        if self._steps.pop(fd, None) is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: epoll forgot it
                self._epoll.unregister(fd)

    def forget(self, fd: int) -> None:
        """``drop`` for a descriptor closed next, with no other copy of it
        open: closing it takes it out of epoll (a system call saved)."""
        self._others.discard(fd)
        self._on_failure.pop(fd, None)
        self._steps.pop(fd, None)

    def swap(self, fd: int, step: Callable[[], None]) -> None:
        """Run ``step`` for ``fd`` from now on, instead of the one it had."""
        if fd in self._steps:
            self._steps[fd] = step

    def lane(
        self,
        step: Any,
        source: int,
        sink: int,
        from_client: bool,
        slow: Callable[[], None],
        after: Callable[[object], None],
    ) -> Any:
        """A direction the compiled loop may carry by itself while armed
        (``swap`` it in for ``slow``, its Python read step; ``arm`` it with
        ``epoch``): ``step`` is the protocol's compiled step, ``after`` what
        takes a read it did not carry whole. None without the compiled loop."""
        if self._carrier is None:
            return None
        return Lane(step, source, sink, from_client, slow, after)

    def bump(self) -> None:
        """Disarm every lane: Python code that may change what they rely
        on (a core's state, the relay's) is about to run on this thread."""
        if self._carrier is not None:
            self._carrier.bump()

    @property
    def epoch(self) -> int:
        """Moves on whenever Python code may run: lanes armed before it
        go through their Python read step once more."""
        return self._carrier.epoch if self._carrier is not None else 0

    @property
    def steps_run(self) -> int:
        """Reads of carried directions: by the compiled loop alone
        (``compiled_runs``) or through their Python read step."""
        compiled = self._carrier.steps_run if self._carrier is not None else 0
        # (Read last: a step run meanwhile makes this too low, never too high.)
        return compiled + self._steps_run - self._other_runs

    @property
    def compiled_runs(self) -> int:
        """Reads the compiled loop carried by itself (armed lanes)."""
        return self._carrier.compiled_runs if self._carrier is not None else 0

    def carried(self) -> int:
        """Connection directions carried now (listening sockets aside)."""
        return len(self._steps) - len(self._others)

    def soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the trio thread: at once there, soon from this one."""
        if trio.lowlevel.in_trio_run():
            fn()
        else:
            self._token.run_sync_soon(fn)

    # --- trio's instrument: the turn is trio's except while it waits for I/O --------

    def before_io_wait(self, timeout: float) -> None:
        self.turn.give()

    def after_io_wait(self, timeout: float) -> None:
        self.turn.take()
        if self._carrier is not None:
            self._carrier.bump()  # trio's Python code runs now

    # --- the thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a compiled step's panic is no Exception
            # The turn is given back (the loops give it back however they
            # end); trio's thread goes on, and is told to stop the proxy.
            self.died = exc
            log.error("relay thread died, the proxy stops: %r", exc)
            log.debug("relay thread died", exc_info=exc)
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._dead)

    def _dead(self) -> None:
        """In the trio thread: the loop died."""
        if self.on_death is not None:
            self.on_death()

    def _loop(self) -> None:
        if self._carrier is not None:
            assert isinstance(self.turn, Turn)
            self._carrier.run(self._epoll.fileno(), self._stop_r, self._steps, self.turn,
                              self.now, self._failed, self._offset)  # fmt: skip
            return
        poll = self._epoll.poll
        steps = self._steps
        turn = self.turn
        while True:
            try:
                events = poll()
            except InterruptedError:
                continue
            turn.take()
            try:
                if self._stopping:
                    return
                for fd, _ in events:
                    step = steps.get(fd)  # looked up now: it may have been dropped
                    if step is not None:
                        self._steps_run += 1
                        try:
                            step()
                        # A step hands its own errors back: a bug (a compiled
                        # step's panic too, as the compiled loop takes it).
                        except BaseException as exc:
                            self._failed(fd, exc)
            finally:
                turn.give()

    def _failed(self, fd: int, exc: BaseException) -> None:
        """A step raised (a bug, or a compiled panic: no Exception): its
        descriptor is dropped, and its connection, told by the step's
        ``failed``, ends as an error (a listener's, handed to trio); the
        thread goes on. Without one, the step is dropped and logged."""
        failed = self._on_failure.get(fd)
        self.drop(fd)
        if failed is None:
            log.error("relay thread: a step failed", exc_info=exc)
            return
        try:
            failed(exc)
        except BaseException as again:  # the thread goes on whatever happens
            log.error("relay thread: a failed step's connection could not be ended",
                      exc_info=again)  # fmt: skip

    def start(self) -> None:
        # The trio thread is running now, so it takes the turn first.
        self.turn.take()
        trio.lowlevel.add_instrument(self)
        self._thread.start()

    def stop(self) -> None:
        """From the trio thread, holding the turn: end the thread."""
        with contextlib.suppress(KeyError):  # trio drops an instrument whose hook raised
            trio.lowlevel.remove_instrument(self)
        self._stopping = True
        os.write(self._stop_w, b"x")
        self.turn.give()  # the thread may be waiting for it
        self._thread.join(timeout=5)
        if self._thread.is_alive():  # pragma: no cover - a step that never returns
            log.error("relay thread did not stop")
        else:
            self._epoll.close()
            os.close(self._stop_r)
            os.close(self._stop_w)
        self.turn.take()  # trio runs on, and the instrument is gone: nothing gives it back


class _Turn:
    """The turn where nothing is compiled: two locks, the gate passed first."""

    def __init__(self) -> None:
        self._turn = threading.Lock()
        self._gate = threading.Lock()

    def take(self) -> None:
        with self._gate:
            self._turn.acquire()

    def give(self) -> None:
        self._turn.release()


def _monotonic_offset(clock: trio.abc.Clock) -> float | None:
    """The offset of trio's own clock (``SystemClock``: ``time.perf_counter()``
    plus a fixed offset), which the compiled loop then reads without a Python
    call per wait; None for any other clock (tests' MockClock), or one that
    does not read as that formula says."""
    offset = getattr(clock, "offset", None)
    if type(clock).__name__ != "SystemClock" or type(offset) is not float or Carrier is None:
        return None
    if abs(Carrier.monotonic(offset) - clock.current_time()) > 0.001:
        return None
    return offset


@contextlib.asynccontextmanager
async def relay_thread(on: bool = True) -> AsyncIterator[RelayThread | None]:
    """A relay thread for this trio run while the block runs (None when off)."""
    if not on:
        yield None
        return
    thread = RelayThread(trio.lowlevel.current_trio_token(), trio.lowlevel.current_clock())
    thread.start()
    try:
        with trio.CancelScope() as scope:  # the block ends if the thread dies
            thread.on_death = scope.cancel
            yield thread
    finally:
        thread.stop()
    if thread.died is not None:
        raise RelayThreadDied(f"the relay thread died: {thread.died!r}") from thread.died


def wanted() -> bool:
    """Whether proxies run a relay thread: yes, unless SLUICE_RELAY_THREAD=0
    (for comparing the two paths in benchmarks and tests)."""
    return os.environ.get("SLUICE_RELAY_THREAD", "1") != "0"
