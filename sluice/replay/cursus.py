"""``sluice replay`` and ``sluice serve`` for Cursus recordings.

A Cursus recording (header ``"protocol": "cursus"``) is read here, not by
``recording/reader.py``'s Pulsar-shaped ``load``: its frames are decoded
with the Cursus codec and grouped per connection.

Replay sends every recorded client frame to ``--broker``, on one live
connection per recorded one, in recorded order across connections (a frame
waits until its connection has had the answers it had when recorded; once
such a wait has run out, the connection is not waited on again until it
speaks: answers that never come cost one timeout, not one per frame), and
compares the broker's frames with the recorded ones connection by
connection, in order. Keepalives are left out (their number depends on
time); addresses are compared as ``<addr>`` (a live broker advertises its
own); batches by topic, partition and their payloads' digests, acks by
status. Cursus replies carry no request ids, so order is the pairing.
Replaying a multi-node recording against one broker diverges where
leadership mattered (NOT_LEADER); replay against a broker like the one
recorded. A request a fault rule dropped or answered in the broker's place
when recorded is not sent, and the answer Sluice wrote is not expected
(``Withholding``, shared with Pulsar's replay).

Serve answers a live client from the recording: each request (normalised
as above) gets the broker frames that followed the same request when
recorded, in turn (the last answer again when a request repeats more often
than recorded, as heartbeats do), with every broker address in them made
serve's own, so the client never leaves. A STREAM gets what the broker
pushed after it. A batch the recording has no exact answer for (the client
grouped messages differently) is acknowledged ``OK``; any other request
without an answer gets ``ERROR: not_in_recording`` and is listed on exit.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import ssl
from functools import partial
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address
from sluice.errors import ConfigError
from sluice.protocols.cursus.batch import Batch
from sluice.protocols.cursus.commands import Command, format_command
from sluice.protocols.cursus.decoder import FrameDecoder
from sluice.protocols.cursus.encoder import frame as framed
from sluice.protocols.cursus.encoder import own_frame
from sluice.protocols.cursus.errors import (
    DECODE_FAILED,
    INVALID_COMMAND,
    MALFORMED_INPUT,
    LocalProtocolError,
)
from sluice.protocols.cursus.frame import Frame
from sluice.protocols.cursus.replies import (
    BatchAck,
    ErrorReply,
    Keepalive,
    OkReply,
    StreamControl,
    format_reply,
)
from sluice.protocols.cursus.rewrite import rewrite_addresses
from sluice.protocols.cursus.text import encode_text
from sluice.protocols.cursus.urls import parse_cursus_url
from sluice.proxy.dial import TlsClientConfig, client_ssl_context, dial
from sluice.recording.reader import (
    RecordedConnection,
    RecordedFrame,
    Recording,
    load,
)
from sluice.replay.common import (
    Listening,
    Outbound,
    Pace,
    Withheld,
    Withholding,
    announce,
    cannot_reach,
    close_due,
    nothing_to_replay,
    parse_speed,
    until_signalled,
)
from sluice.replay.outcome import (
    Outcome,
    Report,
    broker_only,
    incomplete_notes,
    is_broker_only,
    not_replayable_transcript,
)

READ_SIZE = 256 * 1024
PROTOCOL = "cursus"


def _masked(host: str, port: int) -> tuple[str, int]:
    return "addr", 0


def normalise(frame: Frame) -> str:
    """What must match between a recorded frame and a live one (never raises)."""
    try:
        return _normalised(frame)
    except LocalProtocolError:  # words that would not read back as written: the bytes
        body = bytes(frame.body)
        masked = rewrite_addresses(body, _masked)
        return f"{frame.name} {(masked or body)[:200]!r}"


def _normalised(frame: Frame) -> str:
    message: Any = frame.message
    if frame.error is not None:
        return f"INVALID {frame.error.problem.value}"
    if isinstance(message, Batch):
        digests = ",".join(hashlib.sha256(m.payload).hexdigest()[:12] for m in message.messages)
        return f"BATCH {message.topic}[{message.partition}] acks={message.acks} [{digests}]"
    if isinstance(message, BatchAck):
        error = message.error
        if error:  # a NOT_LEADER LEADER_IS in it names the broker: masked
            masked = rewrite_addresses(encode_text(error), _masked)
            error = masked.decode(errors="replace") if masked is not None else error
        return f"ACK {message.status}" + (f" {error}" if error else "")
    if isinstance(message, Keepalive):
        return "KEEPALIVE"
    if isinstance(message, OkReply | ErrorReply | StreamControl):
        body = encode_text(format_reply(message))
        masked = rewrite_addresses(body, _masked)
        return (masked or body).decode(errors="replace")
    if isinstance(message, Command):
        return format_command(message)
    return f"{frame.name} {bytes(frame.body)[:200]!r}"


def _is_reply(frame: Frame) -> bool:
    return not isinstance(frame.message, Keepalive)


def _answers(frames: list[RecordedFrame], withheld: Withheld) -> list[RecordedFrame]:
    """The broker frames a live broker is expected to send: keepalives (their
    number depends on time) and answers Sluice injected when recorded aside."""
    return [
        f
        for f in frames
        if not f.from_client and _is_reply(f.frame) and f.index not in withheld.injected
    ]


def withheld_of(conn: RecordedConnection) -> Withheld:
    """The requests fault rules kept from the broker on ``conn``, and the
    answers they wrote (Cursus replies carry no ids: a rule's answer is
    the reply recorded right after it)."""
    found = Withholding(conn, lambda request, reply: _is_reply(reply), _is_reply).faults()
    # What Sluice wrote itself (recorded ``own``) no broker sent. A refusal
    # among them answered an invalid frame Sluice kept from the broker
    # (--on-invalid reject): the earliest one before it not yet paired.
    refusable = [rf for rf in conn.frames if rf.from_client and rf.index not in found.held
                 and rf.summary.get("invalid") not in (None, "unknown_type")]  # fmt: skip
    for rf in conn.frames:
        if rf.from_client or not rf.summary.get("own") or rf.index in found.injected:
            continue
        found.injected.add(rf.index)
        if rf.summary.get("error") in _REFUSALS:
            refused = next((c for c in refusable if c.index < rf.index), None)
            if refused is not None:
                refusable.remove(refused)
                found.held.add(refused.index)
    return found.done()


# The codes of the ERROR: lines Sluice refuses invalid frames with.
_REFUSALS = frozenset({DECODE_FAILED, MALFORMED_INPUT, INVALID_COMMAND})


# --- replay ---------------------------------------------------------------------------


class _Live:
    def __init__(
        self, recorded: RecordedConnection, stream: trio.abc.Stream, withheld: Withheld
    ) -> None:
        self.recorded = recorded
        self.withheld = withheld
        self.expected = len(_answers(recorded.frames, withheld))
        self.stream = stream
        # Sending on it and closing it, bounded by --timeout.
        self.out = Outbound(stream.send_all, stream.aclose)
        self.got: list[Frame] = []
        self.changed = trio.Event()
        self.ended = False  # the broker closed it (or it broke): nothing more will come
        # A wait on it ran out, and it has said nothing since: what it owes
        # is not waited for again (one timeout, not one per client frame).
        self.quiet = False

    async def read(self) -> None:
        decoder = FrameDecoder(from_client=False)
        try:
            while True:
                data = await self.stream.receive_some(READ_SIZE)
                decoder.receive_data(data)
                for frame in decoder.frames():
                    if not isinstance(frame.message, Keepalive):
                        self.got.append(frame)
                        self.quiet = False
                if not data:
                    return
                self.changed.set()
                self.changed = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError, Exception):
            pass
        finally:
            self.ended = True
            self.changed.set()

    async def close_when_answered(self, timeout: float) -> None:
        """Close it where the recording shows it closed, once what it was
        answered has come (or a wait for it ran out)."""
        await self.wait_for(self.expected, timeout)
        await self.out.close(timeout)

    async def wait_for(self, count: int, timeout: float) -> bool:
        """Wait up to ``timeout`` until ``count`` answers have come, less if
        the connection ends first, not at all while it is quiet; whether
        they have. A wait that runs out makes it quiet."""
        if not self.quiet:
            with trio.move_on_after(timeout):
                while len(self.got) < count and not self.ended:
                    await self.changed.wait()
            self.quiet = len(self.got) < count and not self.ended
        return len(self.got) >= count


async def replay(recording: Recording, broker: Address, *, timeout: float, say: Any,
                 tls: ssl.SSLContext | None = None,
                 speed: float = 0.0) -> tuple[Outcome, list[str]]:  # fmt: skip
    """``speed``: 0 as fast as the broker answers, else client frames paced
    by the time between them when recorded, divided by it."""
    outcome = Outcome.of(recording)
    lives: dict[tuple[str, int], _Live] = {}
    withheld = {conn.key: withheld_of(conn) for conn in recording.connections}
    # How many answers each connection had from the broker before each of
    # its client frames.
    expected_before: dict[int, int] = {}
    for conn in recording.connections:
        answered = 0
        for rf in conn.frames:
            if rf.from_client:
                expected_before[rf.index] = answered
            elif _is_reply(rf.frame) and rf.index not in withheld[conn.key].injected:
                answered += 1
    client_frames = sorted(((c, rf) for c in recording.connections for rf in c.frames
                            if rf.from_client), key=lambda item: item[1].index)  # fmt: skip
    say(f"replaying {len(recording.connections)} Cursus connections, {len(client_frames)} "
        f"client frames against {broker}")  # fmt: skip
    # Connections the recording shows closed, closed where it does, once
    # what was answered on them before has come (or a wait for it ran out).
    closes = sorted(
        (conn.closed_at, conn.key) for conn in recording.connections if conn.closed_at is not None
    )
    closed = 0
    closing = partial(_Live.close_when_answered, timeout=timeout)
    pace = Pace(speed)
    async with trio.open_nursery() as nursery:
        for conn, rf in client_frames:
            closed = await close_due(closes, closed, rf.index, lives, closing)
            live = lives.get(conn.key)
            if live is None:
                try:
                    stream = await dial(broker, timeout=timeout, tls=tls)
                except OSError as exc:
                    raise cannot_reach(broker, exc) from None
                live = lives[conn.key] = _Live(conn, stream, withheld[conn.key])
                nursery.start_soon(live.read)
            was_quiet = live.quiet
            await live.wait_for(expected_before[rf.index], timeout)
            if live.quiet and not was_quiet:  # this wait ran out
                outcome.waits_timed_out += 1
            await pace.next(rf.wall_ns)
            if rf.index in live.withheld.held:
                outcome.withheld += 1  # a fault rule kept it from the broker when recorded
                continue
            failed = await live.out.send(rf.frame.raw, timeout)
            if failed:
                say(f"{conn.name}: {failed}")
            if failed is None:
                outcome.sent += 1
        # What is still to come on each connection, waited for side by side:
        # answers that never come cost one timeout in all, not one each.
        async with trio.open_nursery() as waits:
            for live in lives.values():
                waits.start_soon(live.wait_for, live.expected, timeout)
        await trio.sleep(0.2)
        for live in lives.values():
            await live.out.close(timeout)
        nursery.cancel_scope.cancel()
    return outcome, compare(recording, lives, outcome, withheld)


async def replay_run(args: argparse.Namespace, say: Any) -> tuple[Outcome, list[str]]:
    """``sluice replay`` of a Cursus recording (the registry's ``replay``)."""
    url = parse_cursus_url(args.broker, what="--broker")
    tls = client_ssl_context(TlsClientConfig(ca=args.broker_tls_ca)) if url.tls else None
    recording = load(args.recording)
    if not any(rf.from_client for conn in recording.connections for rf in conn.frames):
        raise nothing_to_replay(args.recording, (), recording.http, recording.ws,
                                broker_only(recording))  # fmt: skip
    return await replay(recording, url.address, timeout=args.timeout, say=say, tls=tls,
                        speed=parse_speed(args.speed))  # fmt: skip


def compare(recording: Recording, lives: dict[tuple[str, int], _Live], outcome: Outcome,
            withheld: dict[tuple[str, int], Withheld] | None = None) -> list[str]:  # fmt: skip
    transcript: list[str] = []
    for conn in recording.connections:
        outcome.faults += len(conn.faults)
        if is_broker_only(conn):
            # Nothing was sent on it, so nothing came: not compared, and said.
            transcript += not_replayable_transcript(recording, conn, normalise)
            continue
        live = lives.get(conn.key)
        got = live.got if live is not None else []
        kept = (withheld or {}).get(conn.key) or Withheld()
        faults = list(conn.faults)
        answers = iter(got)
        notes = incomplete_notes(recording, conn)
        for rf in conn.frames:
            # Injected when recorded: next to the frames they touched, so
            # their anomalies are not taken for the broker's.
            while faults and faults[0].index <= rf.index + 1:
                transcript.append(f"{conn.name} ~~~ {faults.pop(0).describe()} (when recorded)")
            while notes and notes[0][0] <= rf.index:
                transcript.append(notes.pop(0)[1])
            if rf.index in kept.held:
                transcript.append(f"{conn.name} C→B NOT SENT (a fault rule kept it from the "
                                  f"broker when recorded) {normalise(rf.frame)}")  # fmt: skip
                continue
            if rf.from_client:
                transcript.append(f"{conn.name} C→B {normalise(rf.frame)}")
                continue
            if not _is_reply(rf.frame):
                continue
            if rf.index in kept.injected:
                transcript.append(f"{conn.name} B→C INJECTED WHEN RECORDED (not expected from "
                                  f"the broker) {normalise(rf.frame)}")  # fmt: skip
                continue
            live_frame = next(answers, None)
            recorded_text = normalise(rf.frame)
            why = recording.incomplete(conn, rf.index)
            if live_frame is None:
                outcome.differs(why, conn.name, recorded_text, None)
                transcript.append(f"{conn.name} B→C MISSING {recorded_text}")
                continue
            live_text = normalise(live_frame)
            transcript.append(f"{conn.name} B→C {live_text}")
            if live_text == recorded_text:
                outcome.matched += 1
            else:
                outcome.differs(why, conn.name, recorded_text, live_text, rf.frame.name)
        transcript += [f"{conn.name} ~~~ {fault.describe()} (when recorded)" for fault in faults]
        transcript += [line for _, line in notes]
        why = recording.incomplete(conn)
        for extra in answers:
            outcome.differs(why, conn.name, None, normalise(extra))
            transcript.append(f"{conn.name} B→C UNEXPECTED {normalise(extra)}")
    return transcript


# --- serve ----------------------------------------------------------------------------


class CursusStub:
    """Answers live Cursus clients from a recording, as the broker did."""

    def __init__(self, recording: Recording, here: Address) -> None:
        self.here = here
        self.report = Report()
        self.answers: dict[str, collections.deque[list[Frame]]] = collections.defaultdict(
            collections.deque
        )
        self.last: dict[str, list[Frame]] = {}
        for conn in recording.connections:
            current: str | None = None
            replies: list[Frame] = []
            for rf in conn.frames:
                if rf.from_client:
                    if current is not None:
                        self.answers[current].append(replies)
                    current, replies = normalise(rf.frame), []
                elif current is not None:
                    replies.append(rf.frame)
            if current is not None:
                self.answers[current].append(replies)

    def _ours(self, host: str, port: int) -> tuple[str, int]:
        return self.here.host, self.here.port

    def reply_to(self, request: Frame) -> list[bytes]:
        """The frames to send for one live request."""
        self.report.requests += 1
        key = normalise(request)
        queue = self.answers.get(key)
        if queue:
            replies = queue.popleft()
            self.last[key] = replies
        elif key in self.last:
            replies = self.last[key]
        else:
            message: Any = request.message
            if isinstance(message, Batch):
                ack = BatchAck(status="OK", last_offset=len(message.messages),
                               seq_start=message.seq_start, seq_end=message.seq_end)  # fmt: skip
                return [own_frame(ack).raw]
            self.report.unmatched.append(key)
            error = ErrorReply.of("not_in_recording", reason='"sluice serve has no answer"')
            return [own_frame(error).raw]
        out = []
        for reply in replies:
            if isinstance(reply.message, Keepalive):
                continue
            body = rewrite_addresses(bytes(reply.body), self._ours)
            out.append(framed(body) if body is not None else reply.raw)
            if isinstance(reply.message, Batch):
                self.report.pushed += len(reply.message.messages)
        return out

    async def handle(self, stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder(from_client=True)
        try:
            while True:
                data = await stream.receive_some(READ_SIZE)
                decoder.receive_data(data)
                for request in decoder.frames():
                    if isinstance(request.message, Keepalive):
                        continue
                    out = self.reply_to(request)
                    if out:
                        await stream.send_all(b"".join(out))
                if not data:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except Exception:  # a stream that is not Cursus: hang up, as the broker would
            return
        finally:
            await trio.aclose_forcefully(stream)


async def serve(target: Path, listening: Listening) -> Report:
    """Answer Cursus clients from ``target`` on one listener until SIGINT or
    SIGTERM (the registry's ``serve``)."""
    if listening.plain and listening.tls:
        raise ConfigError("a Cursus recording is served on one listener: --listen or --listen-tls")
    recording = load(target)
    listeners, plain, tls = await listening.open()
    here = plain or tls
    assert here is not None
    stub = CursusStub(recording, here)
    announce(f"a Cursus broker on {here}{' (TLS)' if tls else ''}", target, recording.truncated)
    await until_signalled(stub.handle, listeners)
    return stub.report
