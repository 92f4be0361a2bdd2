"""The toy's I/O half: its backend, recorded frames, replay and serve."""

from __future__ import annotations

import argparse
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address, parse_address
from sluice.protocols.core import Conn, Tap
from sluice.proxy.backend import DirectBackend, Services
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import dial
from sluice.proxy.ports import Listeners
from sluice.recording.reader import load
from sluice.replay.common import Listening, announce, until_signalled
from sluice.replay.outcome import Outcome, Report
from tests.toy_protocol.codec import Frame, decode, encode, split
from tests.toy_protocol.core import ToyConnection
from tests.toy_protocol.spec import PROTOCOL


class ToyBackend(DirectBackend):
    name = "toy"

    def __init__(self, config: ProxyConfig, services: Services) -> None:
        super().__init__(config.broker, services, config.connect_timeout, Listeners())

    def new_core(self, conn: Conn, tap: Tap, upstream: Address | None = None) -> ToyConnection:
        return ToyConnection(conn, self.routing, tap, upstream or self.broker)


async def _exchange(stream: trio.abc.Stream, request: bytes, timeout: float) -> list[Frame]:
    await stream.send_all(request)
    buffer = bytearray()
    with trio.move_on_after(timeout):
        while not (frames := split(buffer)) and (data := await stream.receive_some(65536)):
            buffer += data
    return [decode(raw, False) for raw in frames]


def _masked(frame: Frame) -> str:
    """What must match between a recorded answer and a live one."""
    return "MOVED" if frame.name == "MOVED" else frame.text


async def replay(args: argparse.Namespace, say: Any) -> tuple[Outcome, list[str]]:
    """Each recorded request again, on a connection per recorded one, to
    ``--broker`` or (redirected ones) the broker recorded."""
    recording, broker = load(args.recording), PROTOCOL.url(args.broker, what="--broker")
    outcome, transcript = Outcome(truncated=recording.truncated), []
    main = recording.connections[0].broker if recording.connections else ""
    for conn in recording.connections:
        to = broker.address if conn.broker == main else parse_address(conn.broker)
        stream = await dial(to, timeout=args.timeout)
        answers = deque(_masked(f.frame) for f in conn.frames if not f.from_client)
        for rf in (f for f in conn.frames if f.from_client and f.frame.problem is None):
            live = [_masked(f) for f in await _exchange(stream, rf.frame.raw, args.timeout)]
            outcome.sent += 1
            transcript.append(f"{conn.name} {rf.frame.text} -> {live}")
            recorded = answers.popleft() if answers else None
            if recorded is None:
                outcome.unexpected += [(conn.name, text) for text in live]
            elif live == [recorded]:
                outcome.matched += 1
            else:
                outcome.diverged.append((conn.name, rf.frame.text, recorded, " ".join(live)))
        outcome.missing += [(conn.name, text) for text in answers]
        await stream.aclose()
    return outcome, transcript


async def serve(target: Path, listening: Listening) -> Report:
    """Answer each request with what the broker answered it while recording."""
    answers: dict[str, list[bytes]] = defaultdict(list)
    for conn in load(target).connections:
        asked = ""
        for rf in conn.frames:
            if rf.from_client:
                asked = rf.frame.text
            else:
                answers[asked].append(rf.frame.raw)
    report = Report()

    async def handle(stream: trio.abc.Stream) -> None:
        buffer = bytearray()
        while data := await stream.receive_some(65536):
            buffer += data
            for raw in split(buffer):
                report.requests += 1
                text = decode(raw, True).text
                if text not in answers:
                    report.unmatched.append(text)
                await stream.send_all(answers[text][0] if text in answers else encode("ERR none"))

    listeners, plain, _ = await listening.open()
    announce(f"a toy broker on {plain}", target)
    await until_signalled(handle, listeners)
    return report
