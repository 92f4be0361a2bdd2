"""Which filters run where: ``--filter`` and ``[[filters]]``, checked at start.

A filter's configuration names the filter (a name of entry point group
``sluice.filters``, or ``module:attr``), the topics it applies to (glob
patterns), the direction (``produce``, ``deliver`` or ``both``), the roles
(glob patterns over the verified role; none: every client), what happens
when it raises (``on-error``: ``closed`` refuses the message, ``open``
passes it on), and its own ``settings``.

On the command line: ``--filter NAME`` or ``--filter 'NAME:{JSON}'``, the
JSON object holding the same keys as a ``[[filters]]`` table. Every mistake
is one line (``FilterConfigError``), never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import importlib
import json
import re
import types
import typing
from collections import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from sluice.filters.api import Filter

ENTRY_POINT_GROUP = "sluice.filters"
# The built-in filters, found without an installed distribution (a checkout
# run in place); pyproject.toml names the same ones as entry points.
BUILTIN = {
    "schema": "sluice.filters.schema:SchemaValidation",
    "encrypt": "sluice.filters.encryption:Encryption",
}
DIRECTIONS = ("produce", "deliver", "both")
ON_ERROR = ("closed", "open")
_FLAG = re.compile(r"(.*?):\s*(\{.*)\Z", re.S)
_KEYS = ("name", "topics", "direction", "roles", "on-error", "settings", "label")
# What no filter name holds: a name (entry point, or module:attr) is a word.
_NOT_A_NAME = re.compile(r"[\s{}\[\]\"']")


class FilterConfigError(ValueError):
    """Mistakes in a filter's configuration, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class FilterSpec:
    """One configured filter, as written (nothing imported yet)."""

    name: str
    topics: tuple[str, ...] = ("*",)
    direction: str = "both"
    roles: tuple[str, ...] = ()
    on_error: str = "closed"
    settings: Mapping[str, Any] = field(default_factory=dict)
    # What metrics and logs call it (default: its name).
    label: str = ""

    @property
    def id(self) -> str:
        return self.label or self.name

    def __str__(self) -> str:
        """The ``--filter`` form, which reads back as this spec."""
        table: dict[str, Any] = {}
        if self.topics != ("*",):
            table["topics"] = list(self.topics)
        if self.direction != "both":
            table["direction"] = self.direction
        if self.roles:
            table["roles"] = list(self.roles)
        if self.on_error != "closed":
            table["on-error"] = self.on_error
        if self.settings:
            table["settings"] = dict(self.settings)
        if self.label:
            table["label"] = self.label
        return f"{self.name}:{json.dumps(table)}" if table else self.name

    def runs(self, direction: str) -> bool:
        return self.direction in (direction, "both")


def parse_table(table: Mapping[str, Any], where: str) -> FilterSpec:
    """A ``[[filters]]`` table (or ``--filter``'s JSON) as a ``FilterSpec``."""
    problems: list[str] = []
    table = {str(k).replace("_", "-"): v for k, v in table.items()}
    name = table.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}: 'name' must name the filter (entry point or module:attr)")
        name = "?"
    where = f"{where} ({name})" if name != "?" else where
    for key in sorted(set(table) - set(_KEYS)):
        # (In TOML, a key written below a [[filters]] header is that table's.)
        problems.append(f"{where}: unknown key {key!r} (known: {', '.join(_KEYS)})")
    topics = _strings(table.get("topics", ["*"]), f"{where}: topics", problems)
    for pattern in topics:
        # Names are matched as the broker completes them (tenant/namespace/
        # topic): a pattern with neither '/' nor '*' can match none.
        local = pattern.partition("://")[2] if "://" in pattern else pattern
        if "/" not in local and "*" not in local:
            problems.append(
                f"{where}: topics: {pattern!r} matches no topic: names are matched as the "
                f"broker completes them; write 'persistent://public/default/{local}' or a "
                "pattern with its tenant and namespace"
            )
    roles = _strings(table.get("roles", []), f"{where}: roles", problems)
    direction = table.get("direction", "both")
    if direction not in DIRECTIONS:
        problems.append(f"{where}: direction must be one of {', '.join(DIRECTIONS)}, "
                        f"not {direction!r}")  # fmt: skip
    on_error = table.get("on-error", "closed")
    if on_error not in ON_ERROR:
        problems.append(f"{where}: on-error must be one of {', '.join(ON_ERROR)}, "
                        f"not {on_error!r}")  # fmt: skip
    settings = table.get("settings", {})
    if not isinstance(settings, Mapping):
        problems.append(f"{where}: settings must be a table, not {settings!r}")
        settings = {}
    label = table.get("label", "")
    if not isinstance(label, str):
        problems.append(f"{where}: label must be a string")
        label = ""
    if problems:
        raise FilterConfigError(problems)
    return FilterSpec(name, topics, str(direction), roles, str(on_error), dict(settings), label)


def parse_flag(text: str) -> FilterSpec:
    """``--filter NAME`` or ``--filter 'NAME:{JSON}'`` (a NAME may be
    ``module:attr``: the settings start at the first colon before a brace)."""
    found = _FLAG.match(text)
    name, rest = (found[1], found[2]) if found else (text, "")
    if _NOT_A_NAME.search(name):
        # 'mod:Cls {"settings": …}' (no colon before the brace) or 'mod:Cls:[…]'
        # would otherwise be taken for a name and fail later as no such class.
        raise FilterConfigError(
            [
                f"--filter {text.strip()[:60]!r}: {name.strip()[:40]!r} is not a filter name; "
                "write NAME or NAME:{JSON object}, a colon between the name and the object"
            ]
        )
    table: dict[str, Any] = {}
    if rest:
        try:
            loaded = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise FilterConfigError(
                [
                    f"--filter {name}: what follows {name + ':'!r} is not a JSON object: "
                    f"{exc.msg} (at character {exc.pos + 1} of it, {_near(rest, exc.pos)})"
                ]
            ) from None
        if not isinstance(loaded, dict):
            raise FilterConfigError([f"--filter {name}: settings must be a JSON object"])
        table = loaded
    table.setdefault("name", name)
    return parse_table(table, "--filter")


class FilterArgument:
    """``--filter``'s type: a flag's text, or (``from_table``) a
    ``[[filters]]`` table of the TOML file."""

    __name__ = "filter"

    def __call__(self, text: str) -> FilterSpec:
        try:
            return parse_flag(text)
        except FilterConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def from_table(self, table: Mapping[str, Any], where: str) -> FilterSpec:
        try:
            return parse_table(table, where)
        except FilterConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def _near(text: str, pos: int) -> str:
    """Where in ``text`` a JSON mistake is, said by what comes before it."""
    if pos == 0:
        return "at its start"
    start = max(0, pos - 24)
    return f"after {('...' if start else '') + text[start:pos]!r}"


def _strings(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: expected a list of patterns, not {value!r}")
        return ()
    return tuple(value)


# --- loading -------------------------------------------------------------------------


def load_class(name: str) -> type[Filter[Any]]:
    """The filter class ``name`` stands for (entry point, built-in, or
    ``module:attr``), or a one-line ``FilterConfigError``."""
    reference = name if ":" in name else None
    if reference is None:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if found:
            reference = found[0].value
        elif name in BUILTIN:
            reference = BUILTIN[name]
        else:
            known = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(BUILTIN))
            raise FilterConfigError(
                [
                    f"filter {name!r}: no such filter (known: {', '.join(known)}; "
                    f"or give module:attr)"
                ]
            )
    module_name, _, attr = reference.partition(":")
    if not module_name.strip() or not attr.strip():
        raise FilterConfigError(
            [f"filter {name!r}: give module:attr, the module and the class in it both named"]
        )
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # anything an import can raise, said in one line
        raise FilterConfigError(
            [f"filter {name!r}: cannot import {module_name}: {type(exc).__name__}: {_line(exc)}"]
        ) from None
    target: Any = module
    for part in attr.split("."):
        inside = target
        target = getattr(inside, part, None)
        if target is None:
            raise FilterConfigError(
                [f"filter {name!r}: {module_name} has no {attr!r}{_did_you_mean(part, inside)}"]
            )
    if not (isinstance(target, type) and issubclass(target, Filter)):
        raise FilterConfigError(
            [f"filter {name!r}: {reference} is not a sluice.filters.Filter subclass"]
        )
    return target


def _did_you_mean(wanted: str, inside: Any) -> str:
    """`` (did you mean 'X'?)`` for the Filter subclass in ``inside`` named
    most like ``wanted`` (a typo in a class name), or nothing."""
    classes = [
        k
        for k, v in getattr(inside, "__dict__", {}).items()
        if isinstance(v, type) and issubclass(v, Filter) and v is not Filter
    ]
    close = difflib.get_close_matches(wanted, classes, n=1)
    if not close:
        close = [k for k in classes if k.lower() == wanted.lower()]
    return f" (did you mean {close[0]!r}?)" if close else ""


def build_settings(cls: type[Filter[Any]], given: Mapping[str, Any], where: str) -> Any:
    """``cls.Settings`` made from ``given``, every field's type checked."""
    record = cls.Settings
    if not dataclasses.is_dataclass(record):
        raise FilterConfigError([f"{where}: {cls.__name__}.Settings must be a dataclass"])
    hints = typing.get_type_hints(record)
    fields = {f.name: f for f in dataclasses.fields(record)}
    problems: list[str] = []
    values: dict[str, Any] = {}
    normalized = {str(k).replace("-", "_"): v for k, v in given.items()}
    for key in sorted(set(normalized) - set(fields)):
        known = ", ".join(fields) or "none"
        problems.append(f"{where}: unknown setting {key!r} (known: {known})")
    for name, f in fields.items():
        if name not in normalized:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{where}: setting {name!r} is required")
            continue
        value = normalized[name]
        hint = hints.get(name, Any)
        if not _fillable(hint):
            # The filter's own mistake, not the user's: no value would do.
            problems.append(
                f"{where}: setting {name!r} cannot be given: {cls.__name__}.Settings types it "
                f"{_spelt(hint)}, which is no type a setting has (str, int, float, bool, "
                f"list[...], tuple[..., ...], dict[str, ...], Literal[...], and these | None)"
            )
            continue
        converted = _typed(value, hint)
        if converted is _WRONG:
            problems.append(
                f"{where}: setting {name!r} must be {_describe(hints.get(name, Any))}, "
                f"not {value!r}"
            )
        else:
            values[name] = converted
    if problems:
        raise FilterConfigError(problems)
    try:
        return record(**values)
    except (TypeError, ValueError) as exc:  # the record's own __post_init__ checks
        raise FilterConfigError([f"{where}: {_line(exc)}"]) from None


def _line(exc: BaseException) -> str:
    """An exception's text as one line (a mistake is one line, whatever
    the filter's code or its libraries wrote)."""
    return " ".join(str(exc).split())


_WRONG = object()
# What TOML and JSON values are (TOML's dates and times included): a field
# typed as one of these takes it as it is.
_VALUE_TYPES = (str, int, float, bool, list, tuple, dict, datetime.datetime, datetime.date,
                datetime.time, type(None))  # fmt: skip
_CONTAINERS = (list, tuple, dict, set, frozenset, abc.Sequence, abc.Mapping, abc.Set)


def _fillable(hint: Any) -> bool:
    """Whether a setting typed ``hint`` can be given at all (``set[str]``,
    ``Path`` or a dataclass of its own cannot: TOML and JSON have no such
    values, and Sluice converts none)."""
    if hint is Any or hint is object or typing.get_origin(hint) is typing.Literal:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return all(_fillable(a) for a in args)
    if origin in _CONTAINERS:
        return all(_fillable(a) for a in args if a is not Ellipsis)
    return isinstance(hint, type) and issubclass(hint, _VALUE_TYPES + _CONTAINERS)


def _spelt(hint: Any) -> str:
    """A type as its code writes it (``set[str]``, ``Path | None``)."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


def _typed(value: Any, hint: Any) -> Any:
    """``value`` as ``hint`` wants it, or ``_WRONG``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            converted = _typed(value, arg)
            if converted is not _WRONG:
                return converted
        return _WRONG
    if origin is typing.Literal:  # one of the values named (True is not 1)
        return value if any(type(value) is type(a) and value == a for a in args) else _WRONG
    if hint is bool:
        return value if isinstance(value, bool) else _WRONG
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _WRONG
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else _WRONG
    if hint is str:
        return value if isinstance(value, str) else _WRONG
    if origin in (list, tuple, abc.Sequence, set, frozenset, abc.Set):
        item = args[0] if args else Any
        if not isinstance(value, list | tuple):
            return _WRONG
        items = [_typed(v, item) for v in value]
        if any(i is _WRONG for i in items):
            return _WRONG
        if origin in (set, frozenset, abc.Set):  # a TOML or JSON list, made a set
            return set(items) if origin is set else frozenset(items)
        return tuple(items) if origin is tuple else items
    if origin in (dict, abc.Mapping):
        key_hint, value_hint = args if args else (Any, Any)
        if not isinstance(value, Mapping):
            return _WRONG
        out = {}
        for k, v in value.items():
            kk, vv = _typed(k, key_hint), _typed(v, value_hint)
            if kk is _WRONG or vv is _WRONG:
                return _WRONG
            out[kk] = vv
        return out
    return value if isinstance(hint, type) and isinstance(value, hint) else _WRONG


def _describe(hint: Any) -> str:
    """A type as someone writing TOML or JSON reads it."""
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("nothing" if a is type(None) else _describe(a) for a in args)
    if origin in (list, tuple, abc.Sequence, set, frozenset, abc.Set):
        item = _describe(args[0]) if args else "anything"
        return f"a list of {_plural(item)}"
    if origin in (dict, abc.Mapping):
        value = args[1] if len(args) == 2 else Any
        return "a table" if value is Any else f"a table of {_plural(_describe(value))}"
    return str(getattr(hint, "__name__", hint))


def _plural(described: str) -> str:
    """``a string`` as ``strings``, ``a list of integers`` as ``lists of
    integers``; other descriptions (``true or false``) as they are."""
    article, _, rest = described.partition(" ")
    noun, space, tail = rest.partition(" ")
    if article in ("a", "an") and noun in ("string", "integer", "number", "list", "table"):
        return f"{noun}s{space}{tail}"
    return described


@dataclass(frozen=True)
class Loaded:
    """A configured filter, made: its spec and its instance."""

    spec: FilterSpec
    filter: Filter[Any]


def load(specs: list[FilterSpec] | tuple[FilterSpec, ...]) -> list[Loaded]:
    """Every configured filter made, or every mistake found (one line each)."""
    problems: list[str] = []
    loaded: list[Loaded] = []
    for spec in specs:
        where = f"filter {spec.id!r}"
        try:
            cls = load_class(spec.name)
            settings = build_settings(cls, spec.settings, where)
            instance = cls(settings)
        except FilterConfigError as exc:
            problems += exc.problems
            continue
        except ValueError as exc:  # a filter's own constructor refusing its settings
            problems.append(f"{where}: {_line(exc)}")
            continue
        except (Exception, SystemExit) as exc:  # or failing (or calling sys.exit)
            problems.append(f"{where}: {type(exc).__name__}: {_line(exc)}")
            continue
        loaded.append(Loaded(spec, instance))
    if problems:
        raise FilterConfigError(problems)
    return loaded
