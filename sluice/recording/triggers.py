"""``--snapshot-on``: rules that make the flight recorder save a snapshot by
itself when something goes wrong.

A rule is JSON, with the match fields of fault rules::

    {"id": "send-errors", "on": "error", "match": {"command": "SEND"},
     "codes": ["PersistenceError"], "before": 30, "after": 5, "interval": 60}

- ``on``: ``error`` (a request answered with an error: ERROR, SEND_ERROR
  or Cursus ``ERROR:``, the broker's or one a fault rule made; ``codes``
  narrows it), ``invalid`` (a frame failed validation), ``fault`` (a fault
  rule acted), ``slow`` (a request answered after more than
  ``slower_than_ms``), ``broker_closed`` (the broker hung up on a relayed
  connection).
- ``match``: ``protocol``, ``command``, ``topic`` (glob), ``direction``, as
  in fault rules; each optional. ``error`` and ``slow`` match the request's
  command (SEND for a SEND_ERROR). ``invalid`` matches by protocol and
  direction only, ``broker_closed`` by protocol only: other fields are
  refused at start.
- ``before``/``after``: seconds of traffic before the trigger and after it
  (default 30 and 5); the snapshot is written ``after`` seconds after it.
- ``interval``: at most one snapshot per rule this often (default 60 s);
  triggers meanwhile are counted, not saved, and said in the log at most
  once per ``STORM_LOG_EVERY`` seconds (``Trigger.fire``, ``Trigger.summary``):
  a rule firing many times a second logs its first firing, then a line
  such as ``snapshot rule X fired again 250 times in the last 10 s``.

Each snapshot holds a ``snapshot`` record naming the rule and the frame
that fired it, and is logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.protocols.core import (
    Answered,
    AnsweredMany,
    Closed,
    Event,
    FaultInjected,
    Invalid,
)
from sluice.protocols.faults import (
    Direction,
    FaultError,
    ProtocolFaults,
    parse_match,
    topic_matches,
)

# The longest before/after/interval a rule may ask for (a day).
MAX_SECONDS = 24 * 3600.0
# A rule's firings within its interval (not saved) are summed up in the log
# at most once this often (seconds), rather than a line each.
STORM_LOG_EVERY = 10.0
KINDS = ("error", "invalid", "fault", "slow", "broker_closed")
_KEYS = {"id", "on", "match", "codes", "slower_than_ms", "before", "after", "interval"}
_MATCH_KEYS = frozenset({"protocol", "command", "topic", "direction"})
# The match fields each kind of event can be told apart by: an invalid
# frame has no trustworthy command or topic, a broker hanging up neither
# nor a direction. A field outside these would make a rule that never fires
# (or, ignored, one that fires on everything): refused at start.
_MATCH_BY_KIND = {
    "error": _MATCH_KEYS,
    "slow": _MATCH_KEYS,
    "fault": _MATCH_KEYS,
    "invalid": frozenset({"protocol", "direction"}),
    "broker_closed": frozenset({"protocol"}),
}


class TriggerError(ValueError):
    """A rule that does not parse; the message says what is wrong."""


@dataclass
class Trigger:
    id: str
    on: str
    protocol: str | None = None
    command: str | None = None
    topic: str | None = None
    direction: Direction | None = None
    codes: frozenset[str] | None = None
    slower_than: float | None = None  # seconds
    before: float = 30.0
    after: float = 5.0
    interval: float = 60.0
    fired: int = 0  # times its condition held
    saved: int = 0  # snapshots it caused
    last_saved: float | None = field(default=None, repr=False)
    # Firings within the interval (not saved) that no log line has said yet,
    # and when the last line about this rule was logged (monotonic seconds).
    unsaid: int = field(default=0, repr=False)
    said_at: float | None = field(default=None, repr=False)

    def fire(self, now: float) -> tuple[bool, str | None]:
        """Count a firing at ``now`` (monotonic seconds): whether to save a
        snapshot for it (at most one per ``interval``; its caller logs that
        one), and a line to log, when one is due, summing up the firings
        before it that were not saved: at most one per ``STORM_LOG_EVERY``
        seconds (``summary`` says the rest later; no firing goes uncounted)."""
        self.fired += 1
        if self.last_saved is None or now - self.last_saved >= self.interval:
            line = self.summary(now, force=True)  # the storm before it, said first
            self.last_saved = self.said_at = now
            return True, line
        self.unsaid += 1
        return False, self.summary(now)

    def summary(self, now: float, *, force: bool = False) -> str | None:
        """The line summing up the firings not saved and not said yet, if
        there are any and one is due (``STORM_LOG_EVERY`` seconds after the
        last line about this rule; ``force``: at once, e.g. on closing).
        Whoever fires the rule asks this now and then (``summary_due``),
        so that a storm's last firings are said once it is over."""
        if not self.unsaid:
            return None
        since = self.said_at if self.said_at is not None else now
        if not force and now - since < STORM_LOG_EVERY:
            return None
        count, self.unsaid, self.said_at = self.unsaid, 0, now
        times = "once" if count == 1 else f"{count} times"
        return (
            f"snapshot rule {self.id} fired again {times} in the last {now - since:.0f} s: "
            f"not saved (at most one snapshot per {self.interval:g} s)"
        )

    def summary_due(self) -> float | None:
        """When (monotonic seconds) ``summary`` has a line to give; None:
        nothing unsaid."""
        if not self.unsaid:
            return None
        return (self.said_at or 0.0) + STORM_LOG_EVERY

    def fires(self, protocol: str, event: Event) -> dict[str, Any] | None:
        """What fired, if this event fires the rule (a dict for the record)."""
        if self.protocol is not None and self.protocol != protocol:
            return None
        on = self.on
        kind = type(event)
        if on in ("error", "slow") and kind is Answered:
            assert isinstance(event, Answered)
            if on == "error" and (
                event.error is None or (self.codes is not None and event.error not in self.codes)
            ):
                return None
            if on == "slow" and event.seconds <= (self.slower_than or 0):
                return None
            if not self._request(event.request, event.topic, Direction.TO_BROKER):
                return None
            found: dict[str, Any] = {"cmd": event.request, "seconds": round(event.seconds, 6)}
            if event.error is not None:
                found["error"] = event.error
            if event.topic:
                found["topic"] = event.topic
            return found
        if on == "slow" and kind is AnsweredMany:
            assert isinstance(event, AnsweredMany)
            slowest = max(event.seconds, default=0.0)
            if slowest <= (self.slower_than or 0):
                return None
            if not self._request(event.request, event.topic, Direction.TO_BROKER):
                return None
            return {"cmd": event.request, "seconds": round(slowest, 6), "topic": event.topic}
        if on == "invalid" and kind is Invalid:
            assert isinstance(event, Invalid)
            direction = Direction.TO_BROKER if event.from_client else Direction.TO_CLIENT
            if self.direction is not None and self.direction is not direction:
                return None
            if self.command is not None or self.topic is not None:
                return None  # an invalid frame has no trustworthy command or topic
            return {"problem": event.problem, "message": event.message}
        if on == "fault" and kind is FaultInjected:
            assert isinstance(event, FaultInjected)
            direction = Direction.TO_BROKER if event.from_client else Direction.TO_CLIENT
            if not self._request(event.command, event.topic, direction):
                return None
            return {"cmd": event.command, "fault": event.rule, "action": event.action}
        if on == "broker_closed" and kind is Closed:
            assert isinstance(event, Closed)
            return {"closed": event.reason} if event.reason == "broker_closed" else None
        return None

    def _request(self, command: str, topic: str | None, direction: Direction) -> bool:
        if self.command is not None and self.command != command:
            return False
        if self.direction is not None and self.direction is not direction:
            return False
        return self.topic is None or topic_matches(self.topic, topic)

    def to_json(self) -> dict[str, Any]:
        match = {k: str(v) for k in ("protocol", "command", "topic", "direction")
                 if (v := getattr(self, k)) is not None}  # fmt: skip
        out: dict[str, Any] = {"id": self.id, "on": self.on, "match": match,
                               "before": self.before, "after": self.after,
                               "interval": self.interval}  # fmt: skip
        if self.codes is not None:
            out["codes"] = sorted(self.codes)
        if self.slower_than is not None:
            out["slower_than_ms"] = self.slower_than * 1000
        return out


def parse_trigger(data: object, protocols: Mapping[str, ProtocolFaults], number: int) -> Trigger:
    if not isinstance(data, dict):
        raise TriggerError("a rule is a JSON object")
    unknown = set(data) - _KEYS
    if unknown:
        raise TriggerError(f"unknown field(s): {', '.join(sorted(unknown))} "
                           f"(known: {', '.join(sorted(_KEYS))})")  # fmt: skip
    on = data.get("on")
    if on not in KINDS:
        raise TriggerError(f"'on' is one of {', '.join(KINDS)}")
    match = parse_match(data.get("match", {}), protocols, _MATCH_KEYS)
    usable = _MATCH_BY_KIND[on]
    if unusable := sorted(
        k for k, v in data.get("match", {}).items() if v is not None and k not in usable
    ):
        raise TriggerError(f"match.{unusable[0]} cannot be told for 'on': '{on}' "
                           f"(it matches by {', '.join(sorted(usable))})")  # fmt: skip
    if on in ("error", "slow") and match.direction is Direction.TO_CLIENT:
        raise TriggerError(f"'on': '{on}' matches the request, which goes to_broker")
    trigger = Trigger(
        id=str(data.get("id") or f"t{number}"),
        on=on,
        protocol=match.protocol,
        command=match.command,
        topic=match.topic,
        direction=match.direction,
        before=_seconds(data, "before", 30.0),
        after=_seconds(data, "after", 5.0, minimum=0.0),
        interval=_seconds(data, "interval", 60.0, minimum=1.0),
    )
    codes = data.get("codes")
    if codes is not None:
        if (
            on != "error"
            or not isinstance(codes, list)
            or not all(isinstance(c, str) for c in codes)
        ):
            raise TriggerError("codes is a list of error code names, for 'on': 'error'")
        trigger.codes = frozenset(codes)
    if on == "slow":
        trigger.slower_than = _seconds(data, "slower_than_ms", None, scale=1000)
    elif "slower_than_ms" in data:
        raise TriggerError("slower_than_ms is for 'on': 'slow'")
    if trigger.id and not trigger.id.replace("-", "").replace("_", "").isalnum():
        raise TriggerError("id is letters, digits, '-' and '_'")
    return trigger


def load_triggers(text: str, protocols: Mapping[str, ProtocolFaults]) -> list[Trigger]:
    """Rules from ``--snapshot-on``: a JSON file's path, or the JSON itself
    (a rule or a list of rules). TriggerError: one line saying what is wrong."""
    source = text
    if not text.lstrip().startswith(("[", "{")):
        try:
            source = Path(text).read_text()
        except OSError as exc:
            raise TriggerError(f"{text}: {exc.strerror or exc}") from None
    try:
        data = json.loads(source)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TriggerError(f"not JSON: {exc}") from None
    items = data if isinstance(data, list) else [data]
    triggers = []
    for number, item in enumerate(items, 1):
        try:
            triggers.append(parse_trigger(item, protocols, number))
        except (TriggerError, FaultError) as exc:
            raise TriggerError(f"rule {number}: {exc}") from None
    ids = [t.id for t in triggers]
    if len(set(ids)) != len(ids):
        raise TriggerError("two rules have the same id")
    return triggers


def _seconds(
    data: dict[str, Any], key: str, default: float | None, *, minimum: float = 0.001,
    scale: float = 1.0,
) -> float:  # fmt: skip
    value = data.get(key, default)
    if value is None:
        raise TriggerError(f"{key} is needed")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not minimum <= value / scale <= MAX_SECONDS
    ):
        raise TriggerError(f"{key} is a number from {minimum * scale:g} to {MAX_SECONDS * scale:g}")
    return float(value) / scale
