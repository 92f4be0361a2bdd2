"""A ``--snapshot-on`` rule firing many times a second (a trigger storm):
one snapshot per interval, its first firing logged, then at most one line
per ``STORM_LOG_EVERY`` seconds summing up the firings not saved, whose
counts add up to every firing."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from sluice.recording.triggers import STORM_LOG_EVERY, Trigger

SAID = re.compile(
    r"snapshot rule storm fired again (once|(\d+) times) in the last (\d+) s: "
    r"not saved \(at most one snapshot per 60 s\)"
)


def _count(line: str) -> int:
    found = SAID.fullmatch(line)
    assert found, line
    return 1 if found[1] == "once" else int(found[2])


def _storm(
    trigger: Trigger, start: float, seconds: float, per_second: int
) -> Iterator[tuple[float, bool, str | None]]:
    """Fire ``trigger`` ``per_second`` times a second: (time, saved, line) of each."""
    n = int(seconds * per_second)
    for i in range(n):
        now = start + i / per_second
        saved, line = trigger.fire(now)
        yield now, saved, line


def test_a_storm_is_one_line_per_period_and_every_firing_is_counted() -> None:
    trigger = Trigger(id="storm", on="error", interval=60.0)
    fired = list(_storm(trigger, 1000.0, 35.0, 100))  # 3,500 firings in 35 s
    assert fired[0][1:] == (True, None)  # the first saves (and its saver logs it)
    assert [saved for _, saved, _ in fired].count(True) == 1
    lines = [(now, line) for now, _, line in fired if line is not None]
    # At most one line per period, none sooner than a period after the last.
    assert 1 <= len(lines) <= 35 / STORM_LOG_EVERY
    times = [1000.0] + [now for now, _ in lines]
    assert all(b - a >= STORM_LOG_EVERY for a, b in itertools.pairwise(times))
    # The storm over: what it left unsaid is said once due, and only then.
    end = fired[-1][0]
    due = trigger.summary_due()
    assert due is not None and due > end
    assert trigger.summary(due - 0.1) is None
    last = trigger.summary(due)
    assert last is not None and trigger.summary_due() is None
    counts = [_count(line) for _, line in lines] + [_count(last)]
    assert sum(counts) == 3_499 == trigger.fired - 1
    assert trigger.summary(due + 100) is None  # nothing said twice


def test_a_storm_longer_than_the_interval_saves_once_per_interval() -> None:
    trigger = Trigger(id="storm", on="error", interval=60.0)
    fired = list(_storm(trigger, 0.0, 130.0, 50))
    saved = [now for now, was, _ in fired if was]
    assert saved == [0.0, 60.0, 120.0]
    lines = [line for _, _, line in fired if line is not None]
    assert len(lines) <= 130 / STORM_LOG_EVERY + 1
    rest = trigger.summary(fired[-1][0], force=True)  # on closing: at once
    counts = [_count(line) for line in [*lines, *([rest] if rest else [])]]
    assert sum(counts) == len(fired) - 3


def test_one_firing_again_is_said_once() -> None:
    trigger = Trigger(id="storm", on="error", interval=60.0)
    assert trigger.fire(5.0) == (True, None)
    assert trigger.fire(6.0) == (False, None)
    assert trigger.summary(7.0) is None
    line = trigger.summary(15.0)
    assert line is not None and _count(line) == 1 and "in the last 10 s" in line
