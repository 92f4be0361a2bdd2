"""Every command-line flag, also from the environment and a TOML file; and
the value types options share (the end of this module).

Precedence: command-line flag > ``SLUICE_<FLAG>`` environment variable >
``--config FILE`` (TOML) > ``SLUICE_DEFAULTS`` file (TOML) > built-in default.
The ``SLUICE_DEFAULTS`` file is a deployment's own defaults, read as a
``--config`` file is but below it: the container image names one that
listens on all interfaces, and a user's ``--config`` file or flags still
set those settings (the environment would override the user's file).
``--max-connections`` is
``SLUICE_MAX_CONNECTIONS`` in the environment and ``max-connections`` (or
``max_connections``) in the file, at the top level or in a table named after
the command (``[proxy]``). Repeatable flags take a TOML list, or a
comma-separated environment value (a comma inside an item's JSON, braces or
brackets, is the item's own). Switches take true/false, yes/no, 1/0.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "SLUICE_"
# Names a TOML file of defaults, read below the --config file (the image's).
DEFAULTS_ENV = f"{ENV_PREFIX}DEFAULTS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_SECRET = re.compile(r"password|token|secret|credential", re.I)
# Flags that are not settings.
_NOT_SETTINGS = {"help", "version", "config", "print_config"}


class SettingsError(ValueError):
    """A bad setting; the message (one line) names where it came from."""


@dataclass
class Settings:
    """Where each effective value came from, for --print-config."""

    sources: dict[str, str] = field(default_factory=dict)
    # The text (or TOML value) each setting given was read from: printed
    # again for a value whose parsed form no flag reads (--record-ring's).
    given: dict[str, Any] = field(default_factory=dict)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions  # argparse keeps no public list
        if a.option_strings and a.dest not in _NOT_SETTINGS
    ]


def _flag(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _convert(action: argparse.Action, raw: Any, source: str) -> Any:
    """Turn an environment string or TOML value into what argparse would store."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, bool):
            value = raw
        elif str(raw).strip().lower() in _TRUE:
            value = True
        elif str(raw).strip().lower() in _FALSE:
            value = False
        else:
            raise SettingsError(f"{source}: expected true or false, not {raw!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._AppendAction):
        if isinstance(raw, dict):  # [proxy.filters] for [[proxy.filters]], {...} for [...]
            name = source.rsplit(": ", 1)[-1]
            tables = f" (or [[{name}]] tables, one each)" if _takes_tables(action) else ""
            raise SettingsError(f"{source}: expected a list{tables}, not a table")
        items = raw if isinstance(raw, list) else [x for x in _items(str(raw)) if x.strip()]
        values, problems = [], []
        for item in items:  # every item's mistakes, not only the first's
            try:
                values.append(_one(action, item, source))
            except SettingsError as exc:
                problems.append(str(exc))
        if problems:
            raise SettingsError("\n".join(problems))
        return values
    return _one(action, raw, source)


def _takes_tables(action: argparse.Action) -> bool:
    """Whether the setting's items may be TOML tables ([[filters]])."""
    return getattr(action.type, "from_table", None) is not None


def _items(text: str) -> list[str]:
    """A comma-separated environment value's items; a comma inside JSON (a
    filter's ``NAME:{...}``: braces, brackets, a quoted string) is the
    item's own."""
    items, start, depth, quoted, escaped = [], 0, 0, False, False
    for i, char in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"' and depth:
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]" and depth:
            depth -= 1
        elif char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth or quoted:  # unbalanced: no JSON to keep whole, every comma splits
        return text.split(",")
    items.append(text[start:])
    return items


def _one(action: argparse.Action, raw: Any, source: str) -> Any:
    table = getattr(action.type, "from_table", None)
    if isinstance(raw, dict) and table is not None:
        # A setting a TOML table spells out ([[filters]]), read by its own parser.
        try:
            return table(raw, source)
        except argparse.ArgumentTypeError as exc:
            raise SettingsError(str(exc)) from None
    if isinstance(raw, list | dict):
        raise SettingsError(f"{source}: expected one value, not {raw!r}")
    text = raw if isinstance(raw, str) else str(raw)
    try:
        value = action.type(text) if callable(action.type) else text
    except argparse.ArgumentTypeError as exc:
        raise SettingsError(f"{source}: {exc}") from None
    except (TypeError, ValueError):
        kind = getattr(action.type, "__name__", "value")
        raise SettingsError(f"{source}: invalid {kind} value {raw!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise SettingsError(f"{source}: {raw!r} is not one of {choices}")
    return value


def load_file(
    path: Path, command: str, commands: Collection[str] = (), name: str = "--config"
) -> dict[str, Any]:
    """The settings of ``command`` in the TOML file: those at the top level,
    then its own table's. The tables of other ``commands`` are theirs; any
    other table is read as a setting (a misspelt ``[proxi]`` is an unknown
    setting, ``connect-timeout = {...}`` a value of the wrong kind), never
    left out without a word."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise SettingsError(f"{name} {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{name} {path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{name} {path}: not valid TOML: not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise SettingsError(f"{name} {path}: not valid TOML: nested too deep") from None
    section = data.get(command, {})
    if not isinstance(section, dict):
        raise SettingsError(f"{name} {path}: [{command}] must be a table")
    top = {
        k: v
        for k, v in data.items()
        if k != command and not (isinstance(v, dict) and k in commands)
    }
    # The command's own table over the top level; within one table, both
    # spellings of a setting (max-connections, max_connections) are refused,
    # as one of them would be dropped without a word.
    flat: dict[str, Any] = {}
    for where, table in (("", top), (f" [{command}]", section)):
        seen: dict[str, str] = {}
        for key, value in table.items():
            dest = key.replace("-", "_")
            if dest in seen:
                raise SettingsError(
                    f"{name} {path}{where}: {seen[dest]!r} and {key!r} are one setting: give one"
                )
            seen[dest] = key
            flat[dest] = value
    return flat


def apply(
    parser: argparse.ArgumentParser,
    command: str,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    commands: Collection[str] = (),
) -> Settings:
    """Set ``parser``'s defaults from the file and the environment.

    Call before ``parser.parse_args(argv)``: flags given on the command line
    still win. Required options supplied by the file or environment stop
    being required on the command line.
    """
    environ = os.environ if environ is None else environ
    settings = Settings()
    actions = {a.dest: a for a in _options(parser)}
    for dest in actions:
        settings.sources[dest] = "default"
    file = config_path(argv)
    if file == "":  # (not taken for none given: SLUICE_CONFIG would win over the flag)
        raise SettingsError("--config names no file: give --config FILE")
    if file is None:
        file = environ.get(f"{ENV_PREFIX}CONFIG")
    layers: list[tuple[str, dict[str, Any]]] = []
    path = defaults_path(environ)
    if path is not None:  # below the --config file: the deployment's defaults
        values = load_file(path, command, commands, DEFAULTS_ENV)
        values = _known(values, actions, f"{DEFAULTS_ENV} {path}")
        layers.append((f"defaults {environ[DEFAULTS_ENV]}", values))
    if file:
        file_values = _known(load_file(Path(file), command, commands), actions, f"--config {file}")
        layers.append((f"file {file}", file_values))
    env_values = {
        dest: environ[f"{ENV_PREFIX}{dest.upper()}"]
        for dest in actions
        if f"{ENV_PREFIX}{dest.upper()}" in environ
    }
    layers.append(("environment", env_values))
    defaults: dict[str, Any] = {}
    mistakes: list[str] = []  # every value that does not convert, one line each
    given = {action.dest for action in actions.values() if _given(action, argv)}
    for origin, values in layers:
        for dest, raw in values.items():
            if dest in given:
                # The flag wins, and must replace (not extend) a list setting.
                actions[dest].required = False
                continue
            action = actions[dest]
            where = (
                f"{ENV_PREFIX}{dest.upper()}"
                if origin == "environment"
                else f"{origin}: {dest.replace('_', '-')}"
            )
            try:
                defaults[dest] = _convert(action, raw, where)
            except SettingsError as exc:
                mistakes.append(str(exc))
                continue
            settings.sources[dest] = origin
            settings.given[dest] = raw
            action.required = False
    if mistakes:
        raise SettingsError("\n".join(mistakes))
    parser.set_defaults(**defaults)
    for dest in given:
        settings.sources[dest] = "flag"
        settings.given[dest] = _flag_value(actions[dest], argv)
    return settings


def _known(
    values: dict[str, Any], actions: Mapping[str, argparse.Action], where: str
) -> dict[str, Any]:
    """A file's ``values``, each a setting of ``actions``; SettingsError,
    one line each, for the names that are none."""
    unknown = sorted(set(values) - set(actions))
    if unknown:  # one line each, the known ones said once
        known = ", ".join(sorted(k.replace("_", "-") for k in actions))
        lines = [f"{where}: unknown setting {u.replace('_', '-')!r}" for u in unknown]
        lines[-1] += f" (known: {known})"
        raise SettingsError("\n".join(lines))
    return values


def defaults_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``SLUICE_DEFAULTS`` file of ``environ`` (None: this process's
    environment), read below the ``--config`` file; None when none is named."""
    text = (os.environ if environ is None else environ).get(DEFAULTS_ENV)
    return Path(text) if text else None


def config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _flag_value(action: argparse.Action, argv: Sequence[str]) -> str | None:
    """The text the last of ``action``'s flags in ``argv`` gave (None: a switch)."""
    text = None
    for i, arg in enumerate(argv):
        for option in action.option_strings:
            if arg == option and action.nargs != 0 and i + 1 < len(argv):
                text = argv[i + 1]
            elif arg.startswith(option + "="):
                text = arg.split("=", 1)[1]
    return text


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(
        arg == option or arg.startswith(option + "=")
        for arg in argv
        for option in action.option_strings
    )


def render(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings) -> str:
    """The effective settings as TOML, with where each came from; secrets masked."""
    lines = ["# effective configuration: value  # source"]
    for action in _options(parser):
        value = getattr(args, action.dest, None)
        if value is None:
            continue
        if _SECRET.search(action.dest.rsplit("_", 1)[-1]) and not isinstance(value, Path):
            # A value that is the secret itself; a path only says where one
            # is, and a token's claim or audience is not one.
            shown = '"***"'
        elif isinstance(value, bool | int | float):
            shown = str(value).lower() if isinstance(value, bool) else str(value)
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            shown = _quote(",".join(value))  # a comma list's value (URL,...): its text again
        elif isinstance(value, tuple) and isinstance(given := settings.given.get(action.dest),
                                                     str | int | float):  # fmt: skip
            # A value parsed into parts (--record-ring's size or time): what
            # was given, which reads back as the same value.
            shown = _quote(given) if isinstance(given, str) else str(given)
        elif isinstance(value, list):
            shown = "[" + ", ".join(_quote(str(v)) for v in value) + "]"
        else:
            shown = _quote(str(value))
        name = _flag(action).lstrip("-")
        lines.append(f"{name} = {shown}  # {settings.sources.get(action.dest, 'default')}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def default(record: type[Any], name: str) -> Any:
    """The default a settings record states for ``name`` (for the command line)."""
    for f in dataclasses.fields(record):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise KeyError(f"{record.__name__} has no default for {name}")


# --- option values ------------------------------------------------------------------
# Types that commands' options share, checked as argparse reads them (flags,
# the environment and the TOML file alike): a mistake is one usage line, not
# a traceback or a proxy that fails at its first connection. Python's float
# takes "nan" and "inf"; none of these does, as no timeout, offset or chance
# means either.


def _finite(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def seconds(text: str) -> float:
    """A length of time in seconds: a positive, finite number."""
    return _time(text, zero=False)


def seconds_or_zero(text: str) -> float:
    """A time in seconds that may be none at all (an offset from a start, a
    leeway): a finite number, not negative."""
    return _time(text, zero=True)


def _time(text: str, *, zero: bool) -> float:
    value = _finite(text, "a number of seconds")
    if value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a time must {'not be negative' if zero else 'be positive'}"
        )
    return value


def count(text: str) -> int:
    """How many of something: a whole number, not negative."""
    rule = "a count must not be negative" if text.strip().startswith("-") else "too large a count"
    return _whole(text, "a whole number", range(0, 2**63), rule)


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535, or 0 for a free one."""
    return _whole(text, "a port number", range(0, 65536), "a port is 1 to 65535 (0: a free one)")


def _whole(text: str, what: str, allowed: range, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if value not in allowed:
        raise argparse.ArgumentTypeError(f"{text!r}: {rule}")
    return value


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where Sluice keeps what it fetches or makes once (Apache Pulsar's
    jars, the analysis JVM's class cache): ``$SLUICE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sluice``, else ``~/.cache/sluice`` (of ``env``, by
    default this process's environment)."""
    env = os.environ if env is None else env
    if env.get("SLUICE_CACHE_DIR"):
        return Path(env["SLUICE_CACHE_DIR"])
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sluice"
