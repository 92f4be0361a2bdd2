"""What ``sluice replay`` and ``sluice serve`` tell, whatever the protocol:
a replay's ``Outcome`` (and its ``report``), a serve's ``Report``."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.recording.reader import RecordedConnection, Recording


@dataclass
class Outcome:
    matched: int = 0
    diverged: list[tuple[str, str, str, str]] = field(default_factory=list)  # conn, what, rec, live
    missing: list[tuple[str, str]] = field(default_factory=list)
    unexpected: list[tuple[str, str]] = field(default_factory=list)
    waits_timed_out: int = 0
    sent: int = 0
    redelivered_recorded: int = 0  # MESSAGEs the consumer had been sent before
    redelivered_live: int = 0
    faults: int = 0  # fault annotations in the recording
    # Client frames not sent: a fault rule dropped them, a fault rule or a
    # filter answered them in the broker's place, or the recording proxy
    # answered them itself when recorded: the broker never got them.
    withheld: int = 0
    answered_itself: int = 0  # of those, the recording proxy answered itself
    truncated: list[Path] = field(default_factory=list)  # files cut mid-record (writer killed)
    # Where the recording is incomplete: frames the recorder dropped (gap
    # records), connections recorded from mid-stream; and the differences
    # these explain (conn, the difference, why), not counted as divergence.
    dropped: int = 0
    late: list[str] = field(default_factory=list)
    expected: list[tuple[str, str, str]] = field(default_factory=list)
    # Connections the recording proxy refused at the handshake (no valid
    # CONNECT first): they never reached a broker, so they are not replayed.
    refused: list[str] = field(default_factory=list)
    # What the HTTP listener recorded in the capture (exchanges, WebSocket
    # frames): replay covers the binary protocol only.
    http: int = 0
    ws: int = 0
    # Connections the recording holds broker frames of only (recorded from
    # mid-stream, say: their client's frames came before the recording
    # starts): nothing is sent on them, so nothing of theirs is compared.
    # (connection, why, its broker frames)
    not_replayable: list[tuple[str, str, int]] = field(default_factory=list)

    @classmethod
    def of(cls, recording: Recording) -> Outcome:
        """An outcome to fill, knowing what the recording lacks."""
        return cls(truncated=recording.truncated,
                   dropped=sum(gap.dropped for gap in recording.gaps),
                   late=[conn.name for conn in recording.connections if conn.late],
                   http=recording.http, ws=recording.ws,
                   not_replayable=broker_only(recording))  # fmt: skip

    @property
    def equivalent(self) -> bool:
        return not (self.diverged or self.missing or self.unexpected)

    def differs(self, why: str | None, conn: str, recorded: str | None, live: str | None,
                name: str = "") -> None:  # fmt: skip
        """A broker frame that does not match its recorded counterpart:
        diverged (both), missing (no live one) or unexpected (no recorded
        one); expected instead when ``why`` says the recording is
        incomplete there."""
        if why is not None:
            what = (f"DIVERGED {name}\n  recorded: {recorded}\n  live:     {live}"
                    if recorded is not None and live is not None
                    else f"MISSING {recorded}" if recorded is not None
                    else f"UNEXPECTED {live}")  # fmt: skip
            self.expected.append((conn, what, why))
        elif recorded is not None and live is not None:
            self.diverged.append((conn, name, recorded, live))
        elif recorded is not None:
            self.missing.append((conn, recorded))
        elif live is not None:
            self.unexpected.append((conn, live))


def broker_only(recording: Recording) -> list[tuple[str, str, int]]:
    """The connections of ``recording`` with broker frames and no client
    frame: (connection, why, how many broker frames)."""
    return [
        (conn.name, recording.incomplete(conn) or "no client frame recorded", len(conn.frames))
        for conn in recording.connections
        if conn.frames and not any(rf.from_client for rf in conn.frames)
    ]


def is_broker_only(conn: RecordedConnection) -> bool:
    """Whether ``conn`` is one of ``broker_only``'s."""
    return bool(conn.frames) and not any(rf.from_client for rf in conn.frames)


def broker_only_said(items: list[tuple[str, str, int]]) -> list[tuple[str, int, int]]:
    """``c2, c5 hold only broker frames (why)``, one per reason, in order
    first met, with how many connections and broker frames each covers."""
    by_why: dict[str, list[tuple[str, int]]] = {}
    for name, why, frames in items:
        by_why.setdefault(why, []).append((name, frames))
    said = []
    for why, conns in by_why.items():
        verb = "holds" if len(conns) == 1 else "hold"
        names = ", ".join(name for name, _ in conns)
        said.append((f"{names} {verb} only broker frames ({why})", len(conns),
                     sum(frames for _, frames in conns)))  # fmt: skip
    return said


def not_replayable_transcript(recording: Recording, conn: RecordedConnection,
                              normalise: Any) -> list[str]:  # fmt: skip
    """The transcript of a connection of broker frames only: a note, then
    its frames, each ``NOT REPLAYED``."""
    why = recording.incomplete(conn) or "no client frame recorded"
    return [f"{conn.name} ~~~ NOT REPLAYABLE: only broker frames recorded ({why}): nothing "
            "to send on it, nothing of it compared"] + [
        f"{conn.name} B→C NOT REPLAYED {normalise(rf.frame)}" for rf in conn.frames
    ]  # fmt: skip


def incomplete_notes(recording: Recording, conn: RecordedConnection) -> list[tuple[int, str]]:
    """Where the recording of ``conn`` is incomplete, for the transcript:
    (the index of the frame the line goes before, the line), in order."""
    notes = [(-1, f"{conn.name} ~~~ RECORDED FROM MID-STREAM (what came before is not in "
                  "the recording)")] if conn.late else []  # fmt: skip
    notes += [
        (gap.index, f"{conn.name} ~~~ GAP {gap.dropped} frames not recorded here "
                    "(on this or another open connection)")
        for gap in recording.gaps
        if conn.key in gap.open
    ]  # fmt: skip
    return notes


def web_left_out(http: int, ws: int) -> str:
    """``2 HTTP exchanges and 3 WebSocket frames``, leaving out a kind of none."""
    parts = []
    if http:
        parts.append(f"{http} HTTP exchange{'s' if http != 1 else ''}")
    if ws:
        parts.append(f"{ws} WebSocket frame{'s' if ws != 1 else ''}")
    return " and ".join(parts)


def report(outcome: Outcome, out: Any) -> None:
    for conn, name, recorded, live in outcome.diverged:
        out.write(f"DIVERGED {conn} {name}\n  recorded: {recorded}\n  live:     {live}\n")
    for conn, recorded in outcome.missing:
        out.write(f"MISSING  {conn} {recorded}\n")
    for conn, live in outcome.unexpected:
        out.write(f"UNEXPECTED {conn} {live}\n")
    for conn, what, why in outcome.expected:
        out.write(f"EXPECTED {conn} ({why}) {what}\n")
    if outcome.dropped or outcome.late:
        parts = []
        if outcome.dropped:
            parts.append(f"{outcome.dropped} frames were not recorded (gap records)")
        if outcome.late:
            parts.append(f"{', '.join(outcome.late)} recorded from mid-stream (opened before "
                         "the recording starts)")  # fmt: skip
        out.write(
            f"note: the recording is incomplete: {'; '.join(parts)}. Differences on those "
            f"connections after that point ({len(outcome.expected)}) are listed as EXPECTED, "
            "not counted as divergence; other connections may differ because of it too\n"
        )
    if outcome.refused:
        out.write(
            f"note: {', '.join(outcome.refused)} were refused by the recording proxy at the "
            "handshake (their first frame was no valid CONNECT): they never reached a broker, "
            "so they are not replayed\n"
        )
    for said, conns, frames in broker_only_said(outcome.not_replayable):
        them = "it" if conns == 1 else "them"
        were = "was" if frames == 1 else "were"
        plural = "s" if frames != 1 else ""
        out.write(f"note: {said}: nothing could be sent on {them}, so {frames} broker "
                  f"frame{plural} {were} not replayed nor compared\n")  # fmt: skip
    if outcome.http or outcome.ws:
        verb = "was" if outcome.http + outcome.ws == 1 else "were"
        out.write(f"note: {web_left_out(outcome.http, outcome.ws)} in the capture {verb} not "
                  "replayed: replay covers the binary protocol (Pulsar's or Cursus's), not the "
                  "HTTP listener's traffic\n")  # fmt: skip
    if outcome.faults:
        out.write(
            f"note: the recording holds {outcome.faults} faults injected while recording "
            "(see the transcript's FAULT lines): differences next to them were made on "
            "purpose, not by the broker\n"
        )
    if outcome.withheld:
        by_rules = outcome.withheld - outcome.answered_itself
        reasons: list[str] = []
        if by_rules:
            reasons.append(f"{by_rules} a fault rule dropped, or a fault rule or filter "
                           "answered in the broker's place")  # fmt: skip
        if outcome.answered_itself:
            reasons.append(f"{outcome.answered_itself} the recording proxy answered itself")
        out.write(
            f"note: {outcome.withheld} client frames were not sent: {' and '.join(reasons)} when "
            "recorded, so the broker never got them (their injected answers are not expected: "
            "the transcript's NOT SENT and INJECTED WHEN RECORDED lines)\n"
        )
    if outcome.redelivered_recorded or outcome.redelivered_live:
        out.write(
            "note: redeliveries (a MESSAGE its consumer had been sent before): "
            f"{outcome.redelivered_recorded} recorded, {outcome.redelivered_live} live; "
            "whether a broker redelivers depends on its timing, so they are counted, "
            "not compared\n"
        )
    if outcome.waits_timed_out:
        out.write(
            f"note: {outcome.waits_timed_out} waits for a broker frame ran out (--timeout): "
            "the client frames after them were sent without it\n"
        )
    for path in outcome.truncated:
        out.write(
            f"note: {path} ends with an incomplete record (the writer was stopped): "
            "replayed up to it\n"
        )
    verdict = "equivalent" if outcome.equivalent else "DIVERGED"
    if outcome.equivalent and outcome.expected:
        verdict = "equivalent where the recording is complete"
    out.write(
        f"\n{verdict}: {outcome.sent} client frames sent; broker frames: {outcome.matched} "
        f"matched, {len(outcome.diverged)} diverged, {len(outcome.missing)} missing, "
        f"{len(outcome.unexpected)} unexpected"
        + (f", {len(outcome.expected)} expected (recording incomplete)" if outcome.expected else "")
        + _not_replayable_count(len(outcome.not_replayable))
        + "\n"
    )


def _not_replayable_count(count: int) -> str:
    """The verdict line's ``; 2 connections not replayable (…)``, if any."""
    if not count:
        return ""
    return f"; {count} connection{'s' if count != 1 else ''} not replayable (broker frames only)"


@dataclass
class Report:
    requests: int = 0
    unmatched: list[str] = field(default_factory=list)
    pushed: int = 0

    def lines(self) -> list[str]:
        """What serve prints when it stops: the totals, then each request
        without a recorded answer once, in the order first asked, with how
        many times it was (a client retrying one request is one line)."""
        out = [f"served {self.requests} requests, pushed {self.pushed} messages, "
               f"{len(self.unmatched)} without a recorded answer"]  # fmt: skip
        for what, times in collections.Counter(self.unmatched).items():
            out.append(f"  no recorded answer: {what}" + (f" ({times} times)" if times > 1 else ""))
        return out
