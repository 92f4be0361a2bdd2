"""What ``sluice replay`` and ``sluice serve`` tell, whatever the protocol:
a replay's ``Outcome`` (and its ``report``), a serve's ``Report``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    truncated: list[Path] = field(default_factory=list)  # files cut mid-record (writer killed)

    @property
    def equivalent(self) -> bool:
        return not (self.diverged or self.missing or self.unexpected)


def report(outcome: Outcome, out: Any) -> None:
    for conn, name, recorded, live in outcome.diverged:
        out.write(f"DIVERGED {conn} {name}\n  recorded: {recorded}\n  live:     {live}\n")
    for conn, recorded in outcome.missing:
        out.write(f"MISSING  {conn} {recorded}\n")
    for conn, live in outcome.unexpected:
        out.write(f"UNEXPECTED {conn} {live}\n")
    if outcome.faults:
        out.write(
            f"note: the recording holds {outcome.faults} faults injected while recording "
            "(see the transcript's FAULT lines): differences next to them were made on "
            "purpose, not by the broker\n"
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
    out.write(
        f"\n{verdict}: {outcome.sent} client frames sent; broker frames: {outcome.matched} "
        f"matched, {len(outcome.diverged)} diverged, {len(outcome.missing)} missing, "
        f"{len(outcome.unexpected)} unexpected\n"
    )


@dataclass
class Report:
    requests: int = 0
    unmatched: list[str] = field(default_factory=list)
    pushed: int = 0
