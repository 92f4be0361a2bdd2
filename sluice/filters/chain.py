"""Filters put to work: which run for a topic, in order, and what a raise does.

``Filters`` is a proxy process's set of configured filters: a protocol core
asks it for the ``FilterChain`` of a topic, direction and role (worked out
once per combination, then looked up), and keeps the schemas the filters
were given. A ``FilterChain`` runs its filters in configuration order: a
``Replace`` feeds the next filter the changed message, the first ``Reject``
ends it. A filter that raises, or answers anything but a verdict, is
counted (the core reports it), logged at most once per ``LOG_EVERY``
seconds per filter, and then fails open (the message goes on as the filter
got it) or closed (refused, reason ``filter_error``) as configured. It never
ends the connection, let alone another one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from collections.abc import Iterable

from sluice.errors import ConfigError
from sluice.filters.api import Filter
from sluice.filters.config import FilterConfigError, FilterSpec, Loaded, load
from sluice.protocols.filtering import (
    DELIVER,
    PASS,
    PRODUCE,
    UNKNOWN,
    Direction,
    Message,
    Outcome,
    Pass,
    Reject,
    Replace,
    Schema,
    Sealer,
    Unknown,
    canonical,
    schema_topic,
    topic_of,
)
from sluice.protocols.registry import ProtocolSpec

log = logging.getLogger("sluice.filters")

LOG_EVERY = 10.0  # seconds between two logged failures of one filter
# Schemas: the latest of a topic is asked for again after this long; a
# numbered version is kept until a producer opens on the topic (which may
# register a new version, or follow the topic's deletion, after which its
# numbers stand for other schemas). Bounded: past the limit, the cache
# starts over.
LATEST_FOR = 30.0
FORGET_AFTER = 1.0  # a schema learned this recently is kept when a producer opens
MAX_SCHEMAS = 10_000

# Messages each filter's hook ran on (passed, changed or refused), by filter
# id and direction: one tally for every ``Filters`` a process makes (a
# reload's too), which the metrics read (sluice_filter_messages_total). A
# filter whose topics or roles match nothing stays at zero there.
Seen = dict[tuple[str, str], int]


class FilterChain:
    """The filters one topic's messages go through in one direction."""

    def __init__(
        self,
        direction: Direction,
        filters: list[Loaded],
        topic: str = "",
        seen: Seen | None = None,
    ) -> None:
        self.direction = direction
        self._filters = filters
        self._seen: Seen = {} if seen is None else seen
        self._hooks = [
            (
                f.spec.id,
                f.spec.on_error == "open",
                f.filter.on_produce if direction == PRODUCE else f.filter.on_deliver,
                (f.spec.id, direction),
            )
            for f in filters
            if _hooks(f, direction)
        ]
        for *_, key in self._hooks:
            self._seen.setdefault(key, 0)
        self._wants_schema = any(f.filter.wants_schema for f in filters)
        self._names = tuple(f.spec.id for f in filters)
        # The first filter that seals entries in this direction (one at most
        # acts: an entry is encrypted once).
        sealers = [(f.spec.id, s) for f in filters if (s := f.filter.sealer(direction))]
        self._sealer: tuple[str, Sealer] | None = sealers[0] if sealers else None
        if len(sealers) > 1:  # said once per chain (chains are made once per topic)
            what = "encrypt what is produced to" if direction == PRODUCE else "decrypt on"
            log.warning(
                "filters %s all %s %s; only %r acts on it: put every key in one filter",
                ", ".join(repr(name) for name, _ in sealers), what, topic, sealers[0][0],
            )  # fmt: skip

    @property
    def hooked(self) -> bool:
        return bool(self._hooks)

    @property
    def sealer(self) -> tuple[str, Sealer] | None:
        return self._sealer

    @property
    def wants_schema(self) -> bool:
        return self._wants_schema

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def run(self, message: Message) -> Outcome:
        current = message
        changed_by: list[str] = []
        errors: list[str] = []
        # The parts some filter set (payload, properties, key): only those go
        # on changed. The others stay None, so that what the client sent of
        # them stays as it was (a tombstone's missing value, a key of bytes).
        touched = [False, False, False]
        seen = self._seen
        for name, fails_open, hook, key in self._hooks:
            seen[key] += 1
            try:
                verdict = hook(current)
                if isinstance(verdict, Replace):
                    changed = _replaced(current, verdict)
                elif isinstance(verdict, Reject):
                    _check_reject(verdict)
                elif not isinstance(verdict, Pass):
                    hint = " (a hook must return PASS when it lets a message by)"
                    raise TypeError(
                        f"returned {verdict!r}, not PASS, Replace or Reject"
                        + (hint if verdict is None else "")
                    )
            # A filter's bug must not break traffic; nor its sys.exit (argparse
            # calls it on input it refuses), which would end the process.
            except (Exception, SystemExit) as exc:
                errors.append(name)
                _log_failure(name, message, exc)
                if fails_open:
                    continue
                refused = Reject("filter_error", f"filter {name} failed")
                return Outcome(refused, name, tuple(errors))
            if isinstance(verdict, Reject):
                return Outcome(verdict, name, tuple(errors))
            if isinstance(verdict, Replace):
                current = changed
                changed_by.append(name)
                for i, part in enumerate((verdict.payload, verdict.properties, verdict.key)):
                    touched[i] = touched[i] or part is not None
        if not changed_by:
            return Outcome(PASS, None, tuple(errors))
        replaced = Replace(
            current.payload if touched[0] else None,
            current.properties if touched[1] else None,
            current.key if touched[2] else None,
        )
        return Outcome(replaced, changed_by[-1], tuple(errors), tuple(changed_by))


def _replaced(message: Message, replace: Replace) -> Message:
    """``message`` as ``replace`` changes it; TypeError for parts of the wrong type."""
    payload, properties, key = replace.payload, replace.properties, replace.key
    if payload is not None and not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"Replace(payload=...) must be bytes, not {type(payload).__name__}")
    if properties is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in dict(properties).items()
    ):
        raise TypeError("Replace(properties=...) must map str to str")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"Replace(key=...) must be a str, not {type(key).__name__}")
    return dataclasses.replace(
        message,
        payload=message.payload if payload is None else bytes(payload),
        properties=message.properties if properties is None else dict(properties),
        key=message.key if key is None else key,
        key_is_base64=message.key_is_base64 if key is None else False,
    )


def _check_reject(reject: Reject) -> None:
    """TypeError for a ``Reject`` whose parts are not text (the core puts
    them in the client's error and in metric labels)."""
    if not isinstance(reject.reason, str):
        raise TypeError(f"Reject(reason=...) must be a str, not {reject.reason!r}")
    if not isinstance(reject.message, str):
        raise TypeError(f"Reject(message=...) must be a str, not {type(reject.message).__name__}")
    if reject.error is not None and not isinstance(reject.error, str):
        raise TypeError(f"Reject(error=...) must be a str or None, not {reject.error!r}")


_last_logged: dict[str, tuple[float, int]] = {}


def _log_failure(name: str, message: Message, exc: BaseException) -> None:
    now = time.monotonic()
    last, hidden = _last_logged.get(name, (-LOG_EVERY, 0))
    if now - last < LOG_EVERY:
        _last_logged[name] = (last, hidden + 1)
        return
    _last_logged[name] = (now, 0)
    more = f" ({hidden} more since the last one logged)" if hidden else ""
    log.warning(
        "filter %s raised on a message %s to %s: %s: %s%s",
        name, "produced" if message.direction == PRODUCE else "delivered",
        message.topic, type(exc).__name__, exc, more,
    )  # fmt: skip


class Filters:
    """Every configured filter of one proxy process (``Filtering``)."""

    def __init__(self, loaded: list[Loaded], seen: Seen | None = None) -> None:
        self.loaded = loaded
        self.seen: Seen = {} if seen is None else seen
        for f in loaded:  # present at zero from the start: a filter that sees nothing shows
            for direction in (PRODUCE, DELIVER):
                if f.spec.runs(direction) and _hooks(f, direction):
                    self.seen.setdefault((f.spec.id, direction), 0)
        self._chains: dict[tuple[str, str, str | None], FilterChain | None] = {}
        self._schemas: dict[tuple[str, bytes | None], tuple[Schema | None, float]] = {}

    def __bool__(self) -> bool:
        return bool(self.loaded)

    def chain(self, topic: str, direction: Direction, role: str | None) -> FilterChain | None:
        key = (topic, direction, role)
        try:
            return self._chains[key]
        except KeyError:
            pass
        wanted = [
            f
            for f in self.loaded
            if f.spec.runs(direction) and _acts(f, direction) and _applies(f, topic, role)
        ]
        chain = FilterChain(direction, wanted, topic, self.seen) if wanted else None
        if len(self._chains) > MAX_SCHEMAS:
            self._chains.clear()
        self._chains[key] = chain
        return chain

    def schema(self, topic: str, version: bytes | None, now: float) -> Schema | Unknown | None:
        known = self._schemas.get((schema_topic(topic), version))
        if known is None:
            return UNKNOWN
        schema, since = known
        if version is None and now - since > LATEST_FOR:
            return UNKNOWN
        return schema

    def learn_schema(
        self, topic: str, version: bytes | None, schema: Schema | None, now: float
    ) -> None:
        if len(self._schemas) >= MAX_SCHEMAS:
            self._schemas.clear()
        # By the topic the broker reads the schema of: a name that only
        # looks like a partition has its own (``schema_topic``).
        key = schema_topic(topic)
        self._schemas[(key, version)] = (schema, now)
        if version is None and schema is not None and schema.version is not None:
            self._schemas[(key, schema.version)] = (schema, now)

    def forget_schemas(self, topic: str, now: float) -> None:
        # Every name that may share the schema (``topic_of``: a broker of
        # any version may take a look-alike for a partition): more asked
        # again than needed, never less.
        base = topic_of(topic)
        schemas = self._schemas
        for key in [
            key
            for key in schemas
            if key[0] == base or (key[0].startswith(base) and topic_of(key[0]) == base)
        ]:
            # Not one just learned: a client opening producers over and
            # over would have every producer of the topic, on every
            # connection, wait for the broker's schema at each SEND.
            if now - schemas[key][1] >= FORGET_AFTER:
                del schemas[key]


def _hooks(loaded: Loaded, direction: Direction) -> bool:
    """Whether the filter has a hook of its own for ``direction`` (one
    that only passes costs the unpacking of every message for nothing)."""
    hook = "on_produce" if direction == PRODUCE else "on_deliver"
    return getattr(type(loaded.filter), hook) is not getattr(Filter, hook)


def _acts(loaded: Loaded, direction: Direction) -> bool:
    """Whether the filter does anything to messages in ``direction``."""
    return _hooks(loaded, direction) or loaded.filter.sealer(direction) is not None


def covering(
    filters: Iterable[Loaded | FilterSpec],
    topic: str | None,
    direction: Direction,
    role: str | None,
) -> list[str]:
    """The ids of the filters that would act on ``topic``'s messages in
    ``direction`` for ``role``, for a request that carries messages past
    the binary protocol (the HTTP listener's WebSocket and REST paths):
    the filters ``Filters.chain`` picks, and, failing closed, more where
    less is known. ``role`` None is a role Sluice does not know (the
    binary side's None is "no role", in passthrough, where a filter that
    names roles is refused at start): a filter that names roles counts.
    ``topic`` None: any topic (a pattern). A ``FilterSpec`` (not made, so
    its hooks are unknown) counts for every direction it runs in."""
    found = []
    for f in filters:
        spec = f if isinstance(f, FilterSpec) else f.spec
        if not spec.runs(direction):
            continue
        if isinstance(f, Loaded) and not _acts(f, direction):
            continue
        if spec.roles and role is not None and not _role_matches(spec, role):
            continue
        if topic is not None and not _topic_matches(spec, topic):
            continue
        found.append(spec.id)
    return found


def _role_matches(spec: FilterSpec, role: str) -> bool:
    return any(fnmatch.fnmatchcase(role, p) for p in spec.roles)


def _applies(loaded: Loaded, topic: str, role: str | None) -> bool:
    spec = loaded.spec
    if spec.roles and (role is None or not _role_matches(spec, role)):
        return False
    return _topic_matches(spec, topic)


def _topic_matches(spec: FilterSpec, topic: str) -> bool:
    # The topic as the broker names it, whatever the client's spelling
    # (``orders`` is persistent://public/default/orders), and its partition's.
    names = {canonical(topic), topic_of(topic)}
    names |= {name.partition("://")[2] for name in list(names) if "://" in name}
    return any(fnmatch.fnmatchcase(name, p) for name in names for p in spec.topics)


def make_filters(
    specs: tuple[FilterSpec, ...] | list[FilterSpec],
    protocol: ProtocolSpec,
    seen: Seen | None = None,
) -> Filters:
    """The configured filters made for a proxy of ``protocol``, or a
    ``ConfigError`` with one line per mistake; their hooks counted into
    ``seen`` (``Seen``)."""
    if not protocol.filters:
        raise ConfigError(
            f"--filter: {protocol.title} connections do not run message filters "
            "(see docs/filters.md)"
        )
    try:
        loaded = load(list(specs))
    except FilterConfigError as exc:
        raise ConfigError(str(exc)) from None
    idle = [
        f"filter {f.spec.id!r}: does nothing with direction {f.spec.direction!r} "
        "(it has no hook, or no keys, for it)"
        for f in loaded
        if not any(_acts(f, d) for d in (PRODUCE, DELIVER) if f.spec.runs(d))
    ]
    if idle:
        raise ConfigError("\n".join(idle))
    return Filters(loaded, seen)
