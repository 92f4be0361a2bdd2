"""Protocol-level fault injection: rules, and which frame a rule hits.

A *rule* says which frames to pick (``match``: protocol, command name,
topic glob, direction, client address glob — every field optional) and what
to do to them (``action``): hold them back (``delay``), make them vanish
(``drop``), break their checksum (``corrupt``), hang up after them
(``disconnect``), answer a request in place of the broker with the
protocol's own error (``error``), or pace a connection (``throttle``).
``probability``, ``after`` and ``times`` bound how often it fires. Every rule
has an id and counts its hits.

This module is sans-I/O and protocol-neutral: it parses and validates rules
(against the command and error names a protocol gives it) and decides, frame
by frame, whether a rule fires. Each protocol core carries the decision out
on its own frames, and reports it to the taps as ``FaultInjected``.
"""

from __future__ import annotations

import enum
import fnmatch
import itertools
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sluice.errors import ConfigError
from sluice.protocols.core import Hold

E = TypeVar("E", bound=enum.StrEnum)


# The longest a delay rule holds a frame (delay_ms, and jitter_ms): one hour.
# (Removing rules lets go of what they hold: Faults.epoch.)
MAX_DELAY_MS = 3_600_000.0
# The largest count (after, times) or rate a rule may give: past a float's
# range, a number could not be compared with the others (OverflowError).
MAX_COUNT = 10**18
# The longest glob (match.topic, match.client): fnmatch compiles one on its
# first use, on the event loop, in a time growing with the square of its
# length at worst (unclosed '['): 1024 characters take a few hundredths of
# a second, 60 KiB a minute.
MAX_GLOB = 1024
# The most rules the admin endpoint lets a proxy hold, and a --faults file
# give: every frame is checked against each (a script adding rules in a
# loop would slow every connection without end).
MAX_RULES = 1000
# What no topic, path or address holds, and a log line must not.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class FaultError(ConfigError):
    """A rule that cannot be used; the message says why, for users."""


class FaultAction(enum.StrEnum):
    DELAY = "delay"
    DROP = "drop"
    CORRUPT = "corrupt"
    DISCONNECT = "disconnect"
    ERROR = "error"
    THROTTLE = "throttle"


class Direction(enum.StrEnum):
    TO_BROKER = "to_broker"
    TO_CLIENT = "to_client"


@dataclass(frozen=True)
class ProtocolFaults:
    """What a protocol lets rules name: its commands, and the error codes
    an ``error`` rule may answer with (the first is the default)."""

    name: str
    commands: frozenset[str]
    errors: tuple[str, ...]
    # The actions its rules may take (None: all); rules for it must name it
    # (``match.protocol``) when ``named_only``: a rule naming no protocol
    # keeps to the protocols it always meant.
    actions: frozenset[FaultAction] | None = None
    named_only: bool = False
    # The directions its rules may match (None: both).
    directions: frozenset[Direction] | None = None
    # The commands an ``error`` rule can answer in the broker's place (None:
    # any it names): one naming another would be accepted and never fire.
    requests: frozenset[str] | None = None


@dataclass(frozen=True)
class Match:
    protocol: str | None = None
    command: str | None = None
    topic: str | None = None  # glob; a bare name also matches persistent://*/*/name
    direction: Direction | None = None
    client: str | None = None  # glob over "ip:port" or "ip"

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) for k, v in vars(self).items() if v is not None}


@dataclass
class Rule:
    match: Match
    action: FaultAction
    id: str = ""
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    rate: int = 0  # throttle: bytes per second
    error: str = ""  # error: the protocol's error code name
    message: str = "injected by sluice"
    probability: float = 1.0
    after: int = 0  # let this many matching frames pass first
    times: int | None = None  # fire at most this often (None: no limit)
    hits: int = 0
    seen: int = 0  # frames that matched, hit or not

    def definition(self) -> dict[str, Any]:
        """``to_json`` less what it has done (hits, seen): two rules alike
        here are the same rule, whatever each has counted."""
        return {k: v for k, v in self.to_json().items() if k not in ("hits", "seen")}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "match": self.match.to_json(),
                               "action": str(self.action)}  # fmt: skip
        if self.action is FaultAction.DELAY:
            out["delay_ms"] = self.delay_ms
            out["jitter_ms"] = self.jitter_ms
        elif self.action is FaultAction.THROTTLE:
            out["rate"] = self.rate
        elif self.action is FaultAction.ERROR:
            out["error"] = self.error or None  # None: each protocol's default
            out["message"] = self.message
        out.update(probability=self.probability, after=self.after, times=self.times,
                   hits=self.hits, seen=self.seen)  # fmt: skip
        return out

    def code(self, errors: Sequence[str]) -> str | None:
        """The error code an ``error`` rule answers with on a protocol whose
        codes are ``errors`` (its default first); None: one it does not know."""
        if not self.error:
            return errors[0] if errors else None
        return self.error if self.error in errors else None

    def describe(self) -> str:
        what = {
            FaultAction.DELAY: f"delay {self.delay_ms:g}ms",
            FaultAction.THROTTLE: f"throttle {self.rate} B/s",
            FaultAction.ERROR: f"error {self.error or '(the protocol default)'}",
        }.get(self.action, str(self.action))
        where = " ".join(f"{k}={v}" for k, v in self.match.to_json().items()) or "every frame"
        return f"{self.id}: {what} on {where}"


_RULE_KEYS = {"id", "match", "action", "delay_ms", "jitter_ms", "rate", "error", "message",
              "probability", "after", "times"}  # fmt: skip
_MATCH_KEYS = frozenset({"protocol", "command", "topic", "direction", "client"})
# Fields only one action takes.
_ACTION_FIELDS = {
    "delay_ms": FaultAction.DELAY,
    "jitter_ms": FaultAction.DELAY,
    "rate": FaultAction.THROTTLE,
    "error": FaultAction.ERROR,
    "message": FaultAction.ERROR,
}


def parse_match(
    raw: object, protocols: Mapping[str, ProtocolFaults], keys: frozenset[str] = _MATCH_KEYS
) -> Match:
    """A rule's ``match`` (fault rules, snapshot rules); FaultError says what
    is wrong. ``keys``: the fields this kind of rule may use."""
    if not isinstance(raw, dict):
        raise FaultError("match is a JSON object")
    unknown = set(raw) - keys
    if unknown:
        raise FaultError(f"unknown match field(s): {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(keys))})")  # fmt: skip
    for key, value in raw.items():
        if value is not None and not isinstance(value, str):
            raise FaultError(f"match.{key} is a string")
        if value is not None and len(value) > MAX_GLOB:
            raise FaultError(f"match.{key} is at most {MAX_GLOB} characters")
        if value is not None and _CONTROL.search(value):  # (logged as it is)
            raise FaultError(f"match.{key} holds a control character")
    protocol = raw.get("protocol")
    if protocol is not None and protocol not in protocols:
        raise FaultError(f"unknown protocol {protocol!r} (known: {', '.join(sorted(protocols))})")
    candidates = [protocols[protocol]] if protocol else _unnamed(protocols)
    command = raw.get("command")
    if command is not None:
        command = command.upper()
        if not any(command in p.commands for p in candidates):
            known = f" for {protocol}" if protocol else ""
            raise FaultError(f"unknown command {command!r}{known}")
    direction = _enum(Direction, raw.get("direction"), "match.direction")
    return Match(protocol, command, raw.get("topic"), direction, raw.get("client"))


def parse_rule(data: object, protocols: Mapping[str, ProtocolFaults]) -> Rule:
    """A rule from its JSON form; FaultError says what is wrong with it."""
    if not isinstance(data, dict):
        raise FaultError("a rule is a JSON object")
    unknown = set(data) - _RULE_KEYS
    if unknown:
        raise FaultError(f"unknown rule field(s): {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(_RULE_KEYS))})")  # fmt: skip
    match = parse_match(data.get("match", {}), protocols)
    protocol, command, direction = match.protocol, match.command, match.direction
    candidates = [protocols[protocol]] if protocol else _unnamed(protocols)
    action = _enum(FaultAction, data.get("action"), "action")
    if action is None:
        raise FaultError(f"a rule needs an action: {', '.join(a.value for a in FaultAction)}")
    for named in candidates:
        if named.actions is not None and action not in named.actions:
            raise FaultError(f"{named.name} rules may {', '.join(sorted(named.actions))}, "
                             f"not {action}")  # fmt: skip
        directions = named.directions
        if direction is not None and directions is not None and direction not in directions:
            raise FaultError(f"{named.name} rules match {', '.join(sorted(directions))}")
    rule = Rule(
        match,
        action,
        id=_rule_id(data),
        delay_ms=_number(data, "delay_ms", 0.0, minimum=0, maximum=MAX_DELAY_MS),
        jitter_ms=_number(data, "jitter_ms", 0.0, minimum=0, maximum=MAX_DELAY_MS),
        probability=_number(data, "probability", 1.0, minimum=0),
        after=int(_number(data, "after", 0, minimum=0, integer=True)),
        message=_text(data, "message", "injected by sluice"),
    )
    if rule.probability > 1:
        raise FaultError("probability is between 0 and 1")
    if data.get("times") is not None:
        rule.times = int(_number(data, "times", 0, minimum=1, integer=True))
    if action is FaultAction.DELAY and rule.delay_ms <= 0:
        raise FaultError("a delay rule needs delay_ms > 0")
    if action is FaultAction.DELAY:
        check_jitter(rule.delay_ms, rule.jitter_ms)
    # A field of another action would be dropped without a word: a "drop"
    # with a delay_ms, a "delay" with the message meant for an error.
    for key, owner in _ACTION_FIELDS.items():
        if action is not owner and data.get(key) is not None:
            raise FaultError(f"{key} goes with a{'n' if owner is FaultAction.ERROR else ''} "
                             f"{owner} rule, not {action}")  # fmt: skip
    if action is FaultAction.THROTTLE:
        rule.rate = int(_number(data, "rate", 0, minimum=1, integer=True))
    if action is FaultAction.ERROR:
        if direction is Direction.TO_CLIENT:
            raise FaultError("an error rule answers requests: its direction is to_broker")
        rule.match = Match(protocol, command, rule.match.topic, Direction.TO_BROKER,
                           rule.match.client)  # fmt: skip
        rule.error = _error_code(_text(data, "error", ""), command, candidates)
        if command is not None and not any(
            command in p.commands and (p.requests is None or command in p.requests)
            for p in candidates
        ):
            raise FaultError(f"an error rule answers requests: {command} is none (nothing "
                             "answers it, so the rule would never fire)")  # fmt: skip
    return rule


def check_jitter(
    delay_ms: float,
    jitter_ms: float,
    names: tuple[str, str] = ("delay_ms", "jitter_ms"),
    unit: str = "",
) -> None:
    """Refuse a jitter larger than its delay (``names``: how the user gave
    the two, ``unit`` after their values): the frames it drew below zero
    would all go at once, held 0ms, not spread as asked."""
    if jitter_ms > delay_ms:
        delay, jitter = names
        raise FaultError(
            f"{jitter} {jitter_ms:g}{unit} is more than {delay} {delay_ms:g}{unit}: "
            "a delay cannot go below 0 (give a jitter of at most the delay)"
        )


def _error_code(given: str, command: str | None, candidates: list[ProtocolFaults]) -> str:
    """The code an ``error`` rule answers with: ``given`` (a protocol the
    rule can act on must know it; the cores of the others pass the rule by,
    ``Faults.check(errors=...)``), or the default of the protocols it acts
    on; "" when they differ (each answers with its own, ``Rule.code``)."""
    acting = [p for p in candidates if command is None or command in p.commands] or candidates
    if not given:
        defaults = {p.errors[0] for p in acting if p.errors}
        return defaults.pop() if len(defaults) == 1 else ""
    knowing = [p for p in acting if given in p.errors]
    if not knowing:
        codes = [c for p in acting for c in p.errors]
        where = f" for {acting[0].name}" if len(acting) == 1 else ""
        raise FaultError(f"unknown error code {given!r}{where} (known: {', '.join(codes)})")
    return given


# What a rule's id may hold: it goes into URLs (DELETE /faults/ID), metric
# labels and log lines as it is.
_ID = re.compile(r"(?!\.+$)[A-Za-z0-9._-]{1,64}")  # not "." or "..": URLs drop those


def _rule_id(data: Mapping[str, object]) -> str:
    """The rule's id ("": one is assigned); FaultError for one that could
    not be named in a URL or a log line as it is."""
    rule_id = _text(data, "id", "")
    if rule_id and not _ID.fullmatch(rule_id):
        shown = ascii(rule_id[:40]) + ("..." if len(rule_id) > 40 else "")
        raise FaultError(
            f"id {shown}: an id is 1 to 64 letters, digits, '.', '_' or '-', not dots alone"
        )
    return rule_id


def _unnamed(protocols: Mapping[str, ProtocolFaults]) -> list[ProtocolFaults]:
    """What a rule that names no protocol may match."""
    return [p for p in protocols.values() if not p.named_only]


def check_room(held: int) -> None:
    """Refuse a rule past ``MAX_RULES`` (``held``: the rules there are)."""
    if held >= MAX_RULES:
        raise FaultError(f"at most {MAX_RULES} fault rules: remove some first")


def load_rules(
    path: Path, protocols: Mapping[str, ProtocolFaults], what: str = "--faults"
) -> list[Rule]:
    """The rules in a JSON file: a list of rules, or ``{"rules": [...]}``
    (what ``GET /faults`` answers, so a rule set can be saved and loaded).
    A FaultError names the file as ``what`` (the flag that gave it) and its
    path: the user knows which of their inputs is wrong."""
    where = f"{what} {path}"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise FaultError(f"{where}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FaultError(f"{where}: not JSON: {exc}") from None
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list):
        raise FaultError(f'{where}: expected a list of rules or {{"rules": [...]}}')
    if len(data) > MAX_RULES:
        raise FaultError(f"{where}: {len(data)} rules, at most {MAX_RULES}")
    rules: list[Rule] = []
    for number, item in enumerate(data, 1):
        if isinstance(item, dict):
            # Saved from GET /faults: counters start again from zero.
            item = {k: v for k, v in item.items() if k not in ("hits", "seen")}
        try:
            rule = parse_rule(item, protocols)
        except FaultError as exc:
            raise FaultError(f"{where}: rule {number}: {exc}") from None
        rules.append(rule)
    # A rule without an id is named by its place in the file, here, once:
    # the supervisor of --workers and each worker (and a reload of the same
    # file) then know it by the same name, which no rule added on /faults
    # (f1, f2, ...) takes.
    named: dict[str, int] = {}
    for number, rule in enumerate(rules, 1):
        if not rule.id:
            rule.id = f"file-{number}"
        if rule.id in named:
            raise FaultError(f"{where}: rule {number}: id {rule.id!r} is rule {named[rule.id]}'s")
        named[rule.id] = number
    return rules


def _enum(kind: type[E], value: object, what: str) -> E | None:
    if value is None:
        return None
    try:
        return kind(str(value).lower())
    except ValueError:
        raise FaultError(
            f"{what} must be one of {', '.join(m.value for m in kind)}, not {value!r}"
        ) from None


def _text(data: Mapping[str, object], key: str, default: str) -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FaultError(f"{key} is a string")
    return value


def _number(
    data: Mapping[str, object],
    key: str,
    default: float,
    *,
    minimum: float,
    maximum: float | None = None,
    integer: bool = False,
) -> float:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key} is a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise FaultError(f"{key} is a number")
    if integer and value != int(value):
        raise FaultError(f"{key} is a whole number")
    if integer and maximum is None:
        maximum = MAX_COUNT
    if value < minimum:
        raise FaultError(f"{key} must be at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise FaultError(f"{key} must be at most {maximum:.0f}")
    return value


@dataclass
class Faults:
    """The rule set of one proxy, shared by all its connections.

    ``active`` is what the hot path looks at: with no rules, a core does no
    fault work at all.
    """

    seed: int | None = None
    rules: list[Rule] = field(default_factory=list)
    # Counts removals: frames held by a rule made under an earlier epoch go
    # at once (a delay or throttle removed stops holding what it held).
    epoch: int = 0
    # Told of each removal (the relay's waits on held frames: RuleRemovals).
    _on_removal: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def add(self, rule: Rule) -> Rule:
        if not rule.id:  # the next f{n} no rule holds (rules loaded with --faults keep theirs)
            taken = {r.id for r in self.rules}
            rule.id = next(i for n in self._ids if (i := f"f{n}") not in taken)
        if any(r.id == rule.id for r in self.rules):
            raise FaultError(f"a rule with id {rule.id!r} exists already")
        self.rules.append(rule)
        return rule

    def extend(self, rules: Iterable[Rule]) -> None:
        for rule in rules:
            self.add(rule)

    def remove(self, rule_id: str) -> bool:
        before = len(self.rules)
        self.rules = [r for r in self.rules if r.id != rule_id]
        if len(self.rules) != before:
            self._removed()
        return len(self.rules) != before

    def clear(self) -> int:
        count = len(self.rules)
        self.rules = []
        if count:
            self._removed()
        return count

    def on_removal(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever rules are removed."""
        self._on_removal.append(callback)

    def _removed(self) -> None:
        self.epoch += 1
        for callback in self._on_removal:
            callback()

    def check(
        self,
        protocol: str,
        command: str,
        from_client: bool,
        client: str,
        topic: Callable[[], str | None],
        answerable: bool = True,
        named_only: bool = False,
        errors: Sequence[str] | None = None,
    ) -> Rule | None:
        """The rule that fires on this frame, if any (its hit is counted).

        ``topic`` is called only when a rule asks for one. ``answerable``
        says whether the frame is a request an ``error`` rule can answer.
        ``named_only``: only rules that name ``protocol`` apply. ``errors``:
        the protocol's error codes (default first); an ``error`` rule with a
        code not among them never fires here (``Rule.code``).
        """
        direction = Direction.TO_BROKER if from_client else Direction.TO_CLIENT
        for rule in self.rules:
            m = rule.match
            if m.command is not None and m.command != command:
                continue
            if m.direction is not None and m.direction is not direction:
                continue
            if m.protocol != protocol and (m.protocol is not None or named_only):
                continue
            if rule.action is FaultAction.ERROR and (
                not answerable or (errors is not None and rule.code(errors) is None)
            ):
                continue
            if m.client is not None and not _client_matches(m.client, client):
                continue
            if m.topic is not None and not topic_matches(m.topic, topic()):
                continue
            rule.seen += 1
            if rule.seen <= rule.after:
                continue
            if rule.times is not None and rule.hits >= rule.times:
                continue
            if rule.probability < 1 and self.random.random() >= rule.probability:
                continue
            rule.hits += 1
            return rule
        return None

    def delay(self, rule: Rule) -> float:
        """Seconds to hold a frame for a delay rule (jitter drawn uniformly)."""
        ms = rule.delay_ms
        if rule.jitter_ms:
            ms += self.random.uniform(-rule.jitter_ms, rule.jitter_ms)
        return max(ms, 0.0) / 1000


class Pacer:
    """When frames held by delay and throttle rules go, per direction of one
    connection. A delay releases each frame that long after it arrived; a
    throttle lets one go when the last one's bytes have drained at the
    rule's rate. Neither lets a frame overtake one held before it."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._free = [0.0, 0.0]  # by direction (0: from the client)
        self._epoch = faults.epoch

    def until(self, rule: Rule, from_client: bool, now: float, size: int) -> float:
        """The time (the caller's clock) to hold a frame of ``size`` bytes until."""
        if self._epoch != self.faults.epoch:  # rules removed: what they held has gone
            self._free, self._epoch = [0.0, 0.0], self.faults.epoch
        side = 0 if from_client else 1
        if rule.action is FaultAction.DELAY:
            until = max(now + self.faults.delay(rule), self._free[side])
            self._free[side] = until
        else:
            until = max(now, self._free[side])
            self._free[side] = until + size / rule.rate
        return until

    def hold(self, rule: Rule, from_client: bool, now: float, size: int) -> Hold:
        """The Hold of a frame of ``size`` bytes: until its time, or until
        rules are removed."""
        until = self.until(rule, from_client, now, size)
        epoch, faults = self.faults.epoch, self.faults
        return Hold(until, lambda: faults.epoch != epoch)


def topic_matches(pattern: str, topic: str | None) -> bool:
    """Glob over the full topic name; a pattern without ``://`` matches the
    local name (``orders-*`` matches ``persistent://public/default/orders-1``).
    A pattern starting with ``/`` is a path's (HTTP requests): the whole of it."""
    if topic is None:
        return False
    if "://" not in pattern and not pattern.startswith("/"):
        topic = topic.rsplit("/", 1)[-1]
    return fnmatch.fnmatchcase(topic, pattern)


def _client_matches(pattern: str, client: str) -> bool:
    """``pattern`` (a glob) against the client's ``IP:PORT`` and its bare IP.
    An IPv6 client (``[::1]:5000``) matches ``::1``, ``fe80::*`` or, with the
    brackets taken as they are, ``[::1]:*``."""
    if client.startswith("["):
        host, _, port = client[1:].partition("]")
        port = port.removeprefix(":")
    elif client.count(":") == 1:
        host, port = client.split(":")
    else:  # an IP alone (IPv6 without a port, too)
        host, port = client, ""
    whole = f"[{host}]:{port}" if ":" in host and port else client
    inside, bracket, rest = pattern[1:].partition("]")
    if pattern.startswith("[") and bracket and ":" in inside:  # [IPv6]...: literal brackets
        pattern = f"[[]{inside}[]]{rest}"
    if fnmatch.fnmatchcase(whole, pattern) or fnmatch.fnmatchcase(host, pattern):
        return True
    # An IPv4 client on a dual-stack listener (::ffff:10.0.0.9) is that IPv4 client.
    if host.lower().startswith("::ffff:") and "." in host:
        v4 = host[7:]
        return fnmatch.fnmatchcase(f"{v4}:{port}", pattern) or fnmatch.fnmatchcase(v4, pattern)
    return False


def flip_last_byte(raw: bytes) -> bytes:
    """``raw`` with its last byte inverted: for a frame with a payload, a
    payload byte, so that the frame's checksum no longer matches."""
    if not raw:
        return raw
    return raw[:-1] + bytes([raw[-1] ^ 0xFF])
