"""The toy's connection core: relays frames, checks them, rewrites redirects."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from sluice.addresses import Address, parse_address
from sluice.protocols import core as p
from sluice.proxy.ports import Listeners
from tests.toy_protocol.codec import MAX_FRAME, Frame, decode, encode, split

CLIENT, BROKER = p.Peer.CLIENT, p.Peer.BROKER


class ToyConnection:
    def __init__(self, conn: p.Conn, routing: Listeners, tap: p.Tap, upstream: Address) -> None:
        self.conn, self.routing, self.tap, self.upstream = conn, routing, tap, upstream
        conn.broker, conn.kind = str(self.upstream), "proxied"
        self.state = "idle"
        self._buffers = (bytearray(), bytearray())  # from the client, from the broker
        self._asked: deque[tuple[str, float]] = deque()  # requests unanswered, sent when
        self._held: deque[Frame] = deque()  # broker frames behind a redirect to rewrite
        self._tokens = itertools.count(1)

    established = property(lambda self: self.state == "relay")
    upstream_pending = property(lambda self: self.state == "dialing")
    in_flight_sends = property(lambda self: len(self._asked))

    def receive_client(self, data: bytes, now: float) -> list[p.Action]:
        self._buffers[CLIENT].extend(data)
        if self.state == "idle" and data:
            self.state = "dialing"
            self.tap.event(self.conn, p.Opened())
            return [p.OpenUpstream(self.upstream, False, b"")]
        out = self._frames(CLIENT, now) if self.state == "relay" else []
        return out + ([p.Close("closed")] if not data else [])

    def upstream_ready(self, now: float) -> list[p.Action]:
        self.state = "relay"
        return self._frames(CLIENT, now)

    def upstream_failed(self, message: str, now: float) -> list[p.Action]:
        return [p.Close("upstream", message)]

    def receive_broker(self, data: bytes, now: float) -> list[p.Action]:
        self._buffers[BROKER].extend(data)
        out = self._frames(BROKER, now)
        return out + ([p.Close("broker_closed")] if not data and not self._held else [])

    def _frames(self, peer: p.Peer, now: float) -> list[p.Action]:
        buffer = self._buffers[peer]
        if len(buffer) >= 4 and int.from_bytes(buffer[:4], "big") > MAX_FRAME:
            self.tap.event(self.conn, p.Invalid(peer is CLIENT, "size", "too large", True))
            return [p.Close("unframeable", "frame too large")]
        frames = [decode(raw, peer is CLIENT) for raw in split(buffer)]
        if frames:
            self.tap.frames(self.conn, peer is CLIENT, frames)
        if peer is BROKER:
            self._held.extend(frames)
            return self._flush(now)
        out: list[p.Action] = []
        for frame in frames:
            if frame.problem is not None:  # never reaches the broker
                self.tap.event(self.conn, p.Invalid(True, frame.problem.value, frame.text))
                out.append(p.Send(CLIENT, encode(f"ERR {frame.problem.value}")))
            else:
                self._asked.append((frame.name, now))
                out.append(p.Send(BROKER, frame.raw))
        return out

    def _flush(self, now: float) -> list[p.Action]:
        """Broker frames to the client in order; a redirect waits for the
        proxy's listener for the broker it names."""
        out: list[p.Action] = []
        while self._held:
            frame = self._held[0]
            if frame.name == "MOVED":
                target = parse_address(frame.text.partition(" ")[2], what="MOVED")
                proxy = self.routing.listener_for(target)
                if proxy is None:
                    return [*out, p.Ask(next(self._tokens), target, target)]
                frame = decode(encode(f"MOVED {proxy}"), False)
            self._held.popleft()
            if self._asked:
                request, sent = self._asked.popleft()
                error = None if frame.name == "OK" else frame.text
                self.tap.event(self.conn, p.Answered(request, now - sent, error))
            out.append(p.Send(CLIENT, frame.raw))
        return out

    def answered(self, token: int, answer: Any, now: float) -> list[p.Action]:
        if isinstance(answer, Address):
            return self._flush(now)
        return [p.Close("no_listener", f"no listener for a redirect: {answer}")]

    keeps_alive = False  # nothing to keep alive: the relay keeps no clock

    def keepalive(self, now: float, interval: float) -> list[p.Action]:
        return []

    def drain(self) -> list[p.Action]:
        return []  # a client's requests are answered before it closes

    def closed(self, reason: str) -> None:
        self.state = "closed"
        self.tap.event(self.conn, p.Closed(reason))
