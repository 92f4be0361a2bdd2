"""A WebSocket session through the HTTP listener, after the upgrade.

``sluice/proxy/http.py`` relays the upgrade request and the broker's ``101``
(h11 on both sides); then both connections carry WebSocket frames, and a
``Session`` relays them here: each read is parsed by its direction's
``FrameReader`` (wsproto, ``sluice.protocols.http.websocket``), counted,
and passed on as it came (masking and all), so what each side gets is
exactly what the other sent.

Sluice ends a session itself on a malformed frame (1002, or 1007 for text
that is not UTF-8), a message larger than ``--http-max-body`` (1009), no
frame either way within ``--http-request-timeout`` (1001), or shutdown
(1001): a CLOSE frame with that code goes to each side whose direction is
between frames (a frame of Sluice's cannot be put in the middle of one),
then both connections are closed. The read that held a bad frame is not
passed on, nor is anything a side sends after its own CLOSE frame.

When a side hangs up (or can take nothing more), the other direction
still passes on what its source sends, up to its end, for ``CLOSE_GRACE``
at most: a broker's last frames and CLOSE reach a client that reads slowly
although the broker has gone. A direction that has carried its side's
CLOSE frame has nothing more to pass on: once the other is over too, the
session ends at once (over TLS, which cannot be half-closed, the side
still there learns of the end only when its connection is closed). Once
a CLOSE frame has gone each way (the closing handshake is done) and
neither side hangs up, the session ends ``CLOSE_GRACE`` later: RFC 6455
has the server close the TCP connection then, and a peer that does not
is not left holding it until the idle timeout.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from sluice.logs import LogLimit
from sluice.protocols.http.websocket import (
    GOING_AWAY,
    FrameReader,
    Seen,
    WebSocketError,
    close_frame,
)
from sluice.proxy.metrics import BROKER_TO_CLIENT, CLIENT_TO_BROKER, HttpMetrics

log = logging.getLogger("sluice.http")
# Sessions ended for a peer's broken frames: anyone may open one after
# another, so each kind is logged once a minute, the rest at debug.
_broken = LogLimit()

CHUNK = 65536
# Time for Sluice's own CLOSE frames to go out before the connections close;
# and for a direction to pass on what its source still sends once the other
# direction is over.
CLOSE_GRACE = 2.0
_LOST = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class FrameTap(Protocol):
    """What watches a session's frames (the recording's, --record): each
    read's, with their payloads, once parsed; and how the session ended."""

    def frames(self, to_client: bool, seen: Seen) -> None: ...

    def ended(self, how: str) -> None: ...


class Session:
    """One WebSocket session: the client's stream and the broker's, and what
    each already sent past the handshake (``client_early``, ``broker_early``)."""

    def __init__(
        self,
        client: trio.abc.Stream,
        broker: trio.abc.Stream,
        metrics: HttpMetrics,
        *,
        max_message: int,
        idle_timeout: float,
        what: str,
        tap: FrameTap | None = None,
    ) -> None:
        self.streams = {CLIENT_TO_BROKER: (client, broker), BROKER_TO_CLIENT: (broker, client)}
        keep = tap is not None
        self.readers = {
            CLIENT_TO_BROKER: FrameReader(from_client=True, max_message=max_message, keep=keep),
            BROKER_TO_CLIENT: FrameReader(from_client=False, max_message=max_message, keep=keep),
        }
        self.tap = tap
        self.metrics = metrics
        self.idle_timeout = idle_timeout
        self.what = what
        self.ending: str | None = None
        # Sluice's own CLOSE: the code and why (None: the session ended by itself).
        self.closing: tuple[int, str] | None = None
        self._last = trio.current_time()
        self._sending = {CLIENT_TO_BROKER: False, BROKER_TO_CLIENT: False}
        self._finished: set[str] = set()  # the directions over
        self._said: set[str] = set()  # the directions that carried their side's CLOSE
        # When a side first hung up: whether a CLOSE frame had gone by.
        self._hung_up: bool | None = None
        self._scope = trio.CancelScope()

    @property
    def handshake_done(self) -> bool:
        """The closing handshake is done: a CLOSE frame has gone each way."""
        return len(self._said) == 2

    def shut_down(self) -> None:
        """Sluice is stopping: the session ends with 1001 (going away)."""
        self._end("shutdown", GOING_AWAY, "Sluice is shutting down")

    def _end(self, ending: str, code: int | None = None, why: str = "") -> None:
        # After the closing handshake (a CLOSE each way) the session has
        # ended by itself, whatever ends its grace (a short idle timeout,
        # shutdown): nothing more is to be said either way.
        if self.ending is None and not self.handshake_done:
            self.ending = ending
            if code is not None:
                self.closing = (code, why)
        self._scope.cancel()

    async def run(self, client_early: bytes, broker_early: bytes) -> None:
        self.metrics.ws_sessions.inc()
        self.metrics.ws_active.inc()
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, CLIENT_TO_BROKER, client_early)
                    nursery.start_soon(self._pump, BROKER_TO_CLIENT, broker_early)
                    nursery.start_soon(self._watch_idle)
            if self.closing is not None:
                await self._send_closes(*self.closing)
            elif self.ending is None:
                # A side hung up: after a CLOSE frame either way, the
                # session's normal end; before, a hang-up.
                said = self._hung_up
                if said is None:  # no side hung up, only sends failed
                    said = any(r.closed is not None for r in self.readers.values())
                self.ending = "closed" if said else "hangup"
        finally:
            self.metrics.ws_active.dec()
            self.metrics.ws_ended.labels(self.ending or "hangup").inc()
            if self.tap is not None:
                self.tap.ended(self.ending or "hangup")

    async def _pump(self, direction: str, early: bytes) -> None:
        source, sink = self.streams[direction]
        reader = self.readers[direction]
        data = early
        # The client's early bytes came with the upgrade request's reads,
        # counted in sluice_http_bytes_total already.
        read_here = direction == BROKER_TO_CLIENT
        while True:
            if data:
                try:
                    seen = reader.feed(data)
                except WebSocketError as exc:
                    side = "client" if direction == CLIENT_TO_BROKER else "broker"
                    said = _broken.level((side, exc.ending), trio.current_time())
                    log.log(min(said, logging.INFO), "WebSocket %s: the %s's %s; session closed",
                            self.what, side, exc)  # fmt: skip
                    self._end(exc.ending, exc.code, f"Sluice: {exc}")
                    return
                if seen.frames:  # idle: no whole frame either way (bytes of one are not)
                    self._last = trio.current_time()
                if seen.passed is not None:  # nothing past this side's CLOSE frame
                    data = data[: seen.passed]
                self._count(direction, data, seen.frames, seen.messages, read_here)
                if self.tap is not None and seen.frames:
                    self.tap.frames(direction == BROKER_TO_CLIENT, seen)
            if data:
                self._sending[direction] = True
                try:
                    await sink.send_all(data)
                except _LOST:
                    self._over(direction)  # nowhere to pass it on: at once
                    return
                self._sending[direction] = False
                if reader.closed is not None and direction not in self._said:
                    # Its CLOSE went on: nothing more goes this way.
                    self._said.add(direction)
                    other = self._other(direction)
                    if other in self._finished:
                        self._scope.cancel()  # nor the other way: the end
                        return
                    if other in self._said:
                        # The closing handshake is done: the peers may
                        # hang up themselves (the broker first, as RFC 6455
                        # has a server do) within the grace; then Sluice
                        # closes both connections.
                        self._scope.deadline = min(
                            self._scope.deadline, trio.current_time() + CLOSE_GRACE
                        )
            read_here = True
            try:
                data = bytes(await source.receive_some(CHUNK))
            except _LOST:
                data = b""
            if not data:
                if self._hung_up is None:  # the first side to hang up decides
                    self._hung_up = any(r.closed is not None for r in self.readers.values())
                # The source hung up: its sink is told (where a stream can
                # be half-closed), so that it hangs up too.
                if isinstance(sink, trio.abc.HalfCloseableStream):
                    try:
                        await sink.send_eof()
                    except (*_LOST, trio.BusyResourceError):
                        pass
                self._over(direction)
                return

    @staticmethod
    def _other(direction: str) -> str:
        return BROKER_TO_CLIENT if direction == CLIENT_TO_BROKER else CLIENT_TO_BROKER

    def _over(self, direction: str) -> None:
        """A direction is over (its source hung up, or its sink can take
        nothing more): the other one passes on what its source still sends,
        up to its end, for ``CLOSE_GRACE`` at most; then the session ends.
        At once where the other has carried its side's CLOSE already (all
        it could still pass on)."""
        self._finished.add(direction)
        other = self._other(direction)
        if other in self._finished or other in self._said:
            self._scope.cancel()
        else:
            self._scope.deadline = min(self._scope.deadline, trio.current_time() + CLOSE_GRACE)

    def _count(
        self, direction: str, data: bytes, frames: list[str], messages: int, http: bool
    ) -> None:
        m = self.metrics
        m.ws_bytes.labels(direction).inc(len(data))
        if http:  # the HTTP connection's own bytes too: the client's side of the session
            (m.bytes_in if direction == CLIENT_TO_BROKER else m.bytes_out).inc(len(data))
        for opcode in frames:
            m.ws_frames.labels(direction, opcode).inc()
        if messages:
            m.ws_messages.labels(direction).inc(messages)

    async def _watch_idle(self) -> None:
        while True:
            await trio.sleep_until(self._last + self.idle_timeout)
            if trio.current_time() >= self._last + self.idle_timeout:
                self._end(
                    "idle_timeout",
                    GOING_AWAY,
                    f"Sluice: no frame within {self.idle_timeout:g}s (--http-request-timeout)",
                )
                return

    async def _send_closes(self, code: int, why: str) -> None:
        """Sluice's CLOSE to each side whose direction is between frames
        and has carried no CLOSE yet."""
        with trio.move_on_after(CLOSE_GRACE) as grace:
            grace.shield = True
            for direction in (BROKER_TO_CLIENT, CLIENT_TO_BROKER):
                reader = self.readers[direction]
                if self._sending[direction] or reader.closed or not reader.between_frames:
                    continue  # mid-frame, or a CLOSE went that way already
                frame = close_frame(code, why, to_client=direction == BROKER_TO_CLIENT)
                try:
                    await self.streams[direction][1].send_all(frame)
                except _LOST:
                    continue
                if direction == BROKER_TO_CLIENT:
                    self.metrics.bytes_out.inc(len(frame))
