"""The HTTP listener's traffic in the capture (``--record`` with ``--http-listen``).

``HttpRelay`` (``sluice/proxy/http.py``) tells its ``watch`` what each client
connection's h11 connection read and wrote; ``HttpRecording`` makes of it
one ``http`` record per request/response pair, written when the client has
had the whole answer (or the exchange broke off), and, after a ``101``, one
``ws`` record per WebSocket frame (``Session``'s ``tap``) and a ``ws_end``
when the session ends. The layout is in docs/recording-format.md; what is
left out for credentials (query values, headers, body fields) is decided by
``sluice.protocols.http.recorded``; bodies and frame payloads follow
``--record-payloads`` as binary frames' payloads do. Without ``--record``
the relay's ``watch`` is an ``HttpWatch``, which does nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from typing import Any

import h11

from sluice.protocols.http import Hop, request_kind
from sluice.protocols.http.recorded import (
    MARKER,
    content_encoding,
    content_type,
    decoded,
    redact_body,
    redact_headers,
    redact_target,
)
from sluice.protocols.http.websocket import Seen
from sluice.recording.format import BROKER_TO_CLIENT, CLIENT_TO_BROKER, PayloadPolicy, Record
from sluice.recording.writer import Recorder

log = logging.getLogger("sluice.recorder")

# With ``full`` payloads, the most records of a fragmented WebSocket message
# (its fragments and the control frames between them) held back until it
# ends: past them, its records are written by their digests as they come.
# Fragments may be empty, so the body limit alone does not bound them.
MAX_PENDING = 1024


class HttpWatch:
    """What the HTTP listener says about its traffic, here ignored (no
    ``--record``). ``conn``: the h11 connection toward one client."""

    def opened(self, conn: h11.Connection, client: str) -> None:
        """A client connection from ``client`` (``ip:port``)."""

    def received(self, conn: h11.Connection, event: h11.Event) -> None:
        """An event read from the client (a request's head, its body)."""

    def sent(self, conn: h11.Connection, event: h11.Event) -> None:
        """An event written to the client (the answer's head, its body)."""

    def redirected(self, conn: h11.Connection, hop: Hop) -> None:
        """The request was sent on to ``hop``, after a broker's redirect."""

    def refused(self, conn: h11.Connection, reason: str) -> None:
        """Sluice answers (or ends) the exchange itself, for ``reason``."""

    def closed(self, conn: h11.Connection) -> None:
        """The client connection is over."""

    def session(self, conn: h11.Connection) -> Any:
        """What watches the WebSocket session after a 101 (None: nothing)."""
        return None


class Body:
    """One body as a recording keeps it: its size, and its bytes (``full``,
    up to ``limit``; past it, or where it cannot be checked for credentials,
    as ``hash``), its SHA-256 (``hash``) or its size alone (``none``). A
    compressed body (``Content-Encoding``) is checked decompressed: kept as
    it came without credentials, by its digest with them."""

    def __init__(self, payloads: PayloadPolicy, limit: int) -> None:
        self.payloads = payloads
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] | None = [] if payloads is PayloadPolicy.FULL else None
        self.digest = hashlib.sha256() if payloads is not PayloadPolicy.NONE else None

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.digest is not None:
            self.digest.update(data)
        if self.parts is not None:
            if self.size <= self.limit:
                self.parts.append(data)
            else:
                self.parts = None  # too large to keep: its digest instead

    def record(self, headers: list[tuple[bytes, bytes]]) -> tuple[Record, bool]:
        """``{"h": headers, "n": size, "raw" | "p": ...}``, and whether
        credentials were replaced in it."""
        shown = redact_headers(headers)
        redacted = any(MARKER in value for _, value in shown)
        out: Record = {"h": shown, "n": self.size}
        if not self.size:
            return out, redacted
        if self.parts is not None:
            whole = b"".join(self.parts)
            codings = content_encoding(headers)
            # A compressed body (gzip …) is checked decompressed: kept as it
            # came if it holds no credential, else by its digest.
            checked = decoded(whole, codings, self.limit) if codings else whole
            raw, replaced = (
                redact_body(checked, content_type(headers))
                if checked is not None
                else (None, False)
            )
            if raw is not None and not codings:
                out["raw"] = raw
                return out, redacted or replaced
            if raw is not None and not replaced:
                out["raw"] = whole
                return out, redacted
            redacted = redacted or replaced
            # Not to be checked for credentials (or compressed with one):
            # its digest, as past the limit.
        out["p"] = [self.size, *([self.digest.digest()] if self.digest is not None else [])]
        return out, redacted


class Exchange:
    """One request and its answer, as the client saw them."""

    def __init__(self, number: int, recording: HttpRecording) -> None:
        self.number = number
        self.t = time.monotonic_ns()
        self.w = time.time_ns()
        self.method = ""
        self.target = ""
        self.kind = "other"
        self.request_headers: list[tuple[bytes, bytes]] = []
        self.request = recording.body()
        self.response = recording.body()
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.answered_ns = 0
        self.hops: list[list[str]] = []
        self.refused = ""

    def record(self, conn: int, client: str, ended: str = "") -> Record:
        request, req_redacted = self.request.record(self.request_headers)
        response, res_redacted = self.response.record(self.response_headers)
        record: Record = {
            "k": "http",
            "h": conn,
            "x": self.number,
            "t": self.t,
            "w": self.w,
            "client": client,
            "method": self.method,
            "path": self.target,
            "kind": self.kind,
            "status": self.status,
            "te": time.monotonic_ns(),
            "req": request,
            "res": response,
        }
        if self.answered_ns:
            record["ta"] = self.answered_ns
        if self.hops:
            record["hops"] = self.hops
        if self.refused:
            record["refused"] = self.refused
        if ended:
            record["ended"] = ended
        if req_redacted or res_redacted or MARKER in self.target:
            record["redacted"] = True
        return record


class Connection:
    def __init__(self, id: int, client: str) -> None:
        self.id = id
        self.client = client
        self.exchanges = 0
        self.current: Exchange | None = None


class HttpRecording(HttpWatch):
    """The HTTP listener's exchanges and WebSocket frames, to ``recorder``."""

    def __init__(self, recorder: Recorder, payloads: PayloadPolicy, body_limit: int) -> None:
        self.recorder = recorder
        self.payloads = PayloadPolicy(payloads)
        self.body_limit = body_limit
        self._ids = itertools.count(1)
        self._conns: dict[h11.Connection, Connection] = {}

    def body(self) -> Body:
        return Body(self.payloads, self.body_limit)

    def opened(self, conn: h11.Connection, client: str) -> None:
        self._conns[conn] = Connection(next(self._ids), client)

    def _exchange(self, conn: h11.Connection) -> tuple[Connection, Exchange] | None:
        """The connection's exchange in progress, begun now if none is."""
        connection = self._conns.get(conn)
        if connection is None:
            return None
        if connection.current is None:
            connection.exchanges += 1
            connection.current = Exchange(connection.exchanges, self)
        return connection, connection.current

    def received(self, conn: h11.Connection, event: h11.Event) -> None:
        if isinstance(event, h11.Request):
            connection = self._conns.get(conn)
            if connection is not None and connection.current is not None:
                self._done(connection, "broken")  # not answered whole: the next began
            found = self._exchange(conn)
            if found is None:
                return
            exchange = found[1]
            exchange.method = event.method.decode("latin-1")
            exchange.target = redact_target(event.target)
            exchange.kind = request_kind(event.target)
            exchange.request_headers = list(event.headers)
        elif isinstance(event, h11.Data):
            found = self._exchange(conn)
            if found is not None:
                found[1].request.add(bytes(event.data))

    def sent(self, conn: h11.Connection, event: h11.Event) -> None:
        if isinstance(event, h11.Response | h11.InformationalResponse):
            found = self._exchange(conn)
            if found is None:
                return
            connection, exchange = found
            exchange.status = event.status_code
            exchange.answered_ns = time.monotonic_ns()
            exchange.response_headers = list(event.headers)
            if event.status_code == 101:  # WebSocket from here on: the exchange is done
                self._done(connection)
        elif isinstance(event, h11.Data):
            found = self._exchange(conn)
            if found is not None:
                found[1].response.add(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            ending = self._conns.get(conn)
            if ending is not None and ending.current is not None:
                self._done(ending)

    def redirected(self, conn: h11.Connection, hop: Hop) -> None:
        found = self._exchange(conn)
        if found is not None:
            found[1].hops.append([str(hop.url), redact_target(hop.target)])

    def refused(self, conn: h11.Connection, reason: str) -> None:
        found = self._exchange(conn)
        if found is not None:
            found[1].refused = reason

    def closed(self, conn: h11.Connection) -> None:
        connection = self._conns.pop(conn, None)
        if connection is not None and connection.current is not None:
            self._done(connection, "broken")

    def _done(self, connection: Connection, ended: str = "") -> None:
        exchange, connection.current = connection.current, None
        assert exchange is not None
        try:
            record = exchange.record(connection.id, connection.client, ended)
        except Exception as exc:  # a recording bug must never break traffic
            _bug(exc)
            return
        self.recorder.note(record)

    def session(self, conn: h11.Connection) -> WebSocketRecording | None:
        connection = self._conns.get(conn)
        if connection is None:
            return None
        return WebSocketRecording(self, connection.id)


class WebSocketRecording:
    """One WebSocket session's frames, as ``ws`` records of HTTP connection
    ``conn``; its end as a ``ws_end`` record.

    With ``full`` payloads a data message is redacted whole: the records of
    a message sent in fragments (and of control frames between them) wait
    until its last fragment came; then its fragments are kept as they came
    if the whole held no credential, else by their digests (as a message
    that ended before its last fragment, or grew past the body limit, or
    came in more than ``MAX_PENDING`` records: those are written as they
    come from there on)."""

    def __init__(self, recording: HttpRecording, conn: int) -> None:
        self.recorder = recording.recorder
        self.payloads = recording.payloads
        self.limit = recording.body_limit
        self.conn = conn
        # By direction: the records of a message not yet whole, each data
        # fragment's with its payload (None for a control frame's, done).
        self._pending: dict[int, list[tuple[Record, bytes | None]]] = {}
        # The directions whose message in progress went past MAX_PENDING
        # records: the rest of it is written as it comes, by digests.
        self._spilled: set[int] = set()

    def frames(self, to_client: bool, seen: Seen) -> None:
        try:
            self._frames(to_client, seen)
        except Exception as exc:  # a recording bug must never break traffic
            _bug(exc)

    def _frames(self, to_client: bool, seen: Seen) -> None:
        mono, wall = time.monotonic_ns(), time.time_ns()
        direction = BROKER_TO_CLIENT if to_client else CLIENT_TO_BROKER
        for opcode, payload, final in zip(seen.frames, seen.payloads, seen.finals, strict=True):
            record: Record = {"k": "ws", "h": self.conn, "d": direction, "t": mono, "w": wall,
                              "op": opcode, "n": len(payload)}  # fmt: skip
            if opcode == "close" and seen.close is not None:
                record["close"] = seen.close[0]
            pending = self._pending.get(direction)
            data = opcode in ("text", "binary")
            if direction in self._spilled and data:
                # A message past MAX_PENDING records: the rest by digests.
                if payload:
                    record["p"] = [len(payload), hashlib.sha256(payload).digest()]
                self.recorder.note(record)
                if final:
                    self._spilled.discard(direction)
                continue
            if self.payloads is PayloadPolicy.FULL and data and (pending is not None or not final):
                pending = self._pending.setdefault(direction, [])
                pending.append((record, payload))
                if final:
                    self._message_done(direction, whole=True)
                elif len(pending) >= MAX_PENDING:
                    self._message_done(direction, whole=False)
                    self._spilled.add(direction)
                continue
            if payload:
                self._payload(record, payload)
            if pending is not None:  # a control frame amid a message's fragments
                pending.append((record, None))
                if len(pending) >= MAX_PENDING:
                    self._message_done(direction, whole=False)
                    self._spilled.add(direction)
            else:
                self.recorder.note(record)

    def _payload(self, record: Record, payload: bytes) -> None:
        """A frame's payload in its record under the policy (with ``full``,
        redacted)."""
        raw, redacted = (
            redact_body(payload) if self.payloads is PayloadPolicy.FULL else (None, False)
        )
        if raw is not None:
            record["raw"] = raw
            if redacted:
                record["redacted"] = True
        elif self.payloads is not PayloadPolicy.NONE:  # (or not to be checked)
            record["p"] = [len(payload), hashlib.sha256(payload).digest()]
        else:
            record["p"] = [len(payload)]

    def _message_done(self, direction: int, *, whole: bool) -> None:
        """The fragments of ``direction``'s message (and the control frames
        between them) written: as they came if the message, ``whole`` and
        within the body limit, holds no credential; by their digests
        otherwise."""
        pending = self._pending.pop(direction, [])
        parts = [payload for _, payload in pending if payload is not None]
        kept, redacted = False, False
        if whole and sum(map(len, parts)) <= self.limit:
            raw, redacted = redact_body(b"".join(parts))
            kept = raw is not None and not redacted
        for record, payload in pending:
            if payload and kept:
                record["raw"] = payload
            elif payload:
                record["p"] = [len(payload), hashlib.sha256(payload).digest()]
                if redacted:
                    record["redacted"] = True
            self.recorder.note(record)

    def ended(self, how: str) -> None:
        try:
            for direction in list(self._pending):  # a message its last fragment never ended
                self._message_done(direction, whole=False)
        except Exception as exc:  # a recording bug must never break traffic
            _bug(exc)
        self.recorder.note({"k": "ws_end", "h": self.conn, "t": time.monotonic_ns(),
                            "w": time.time_ns(), "reason": how})  # fmt: skip


def _bug(exc: Exception) -> None:
    log.error("HTTP recording: internal error: %r (not recorded)", exc, exc_info=exc)
