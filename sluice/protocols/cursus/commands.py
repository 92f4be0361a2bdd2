"""Text commands a client sends, as typed values.

A command is its name and ``key=value`` words, in the form the real client
writes (``CONSUME topic=t partition=0 offset=5 member=m group=g generation=1``),
or a positional form the written spec describes (``CREATE t 4``, ``CONSUME t
0 5``: ``POSITIONAL``), which decodes to the same command. Each known command
is a frozen dataclass whose fields are its keys, in the client's order; keys
a class does not know are kept in ``extra`` and bare words in ``args``, so
nothing in a command is lost. ``message=`` takes the rest of the line.
``format_command`` always writes the ``key=value`` form (a proxy relays the
bytes a client sent, never a command written again).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from sluice.protocols.cursus.errors import (
    INVALID_COMMAND,
    LocalProtocolError,
    Problem,
    RemoteProtocolError,
)
from sluice.protocols.cursus.text import REST_OF_LINE, is_word, to_int, tokens

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """Base of every command: what no typed field holds."""

    NAME: ClassVar[str] = ""
    extra: Pairs = ()  # key=value words this command's fields do not name, in order
    args: tuple[str, ...] = ()  # bare words

    @property
    def name(self) -> str:
        return self.NAME


@dataclass(frozen=True, slots=True, kw_only=True)
class Create(Command):
    NAME: ClassVar[str] = "CREATE"
    topic: str
    partitions: int | None = None
    event_sourcing: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Command):
    NAME: ClassVar[str] = "DELETE"
    topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class List(Command):
    NAME: ClassVar[str] = "LIST"


@dataclass(frozen=True, slots=True, kw_only=True)
class Metadata(Command):
    NAME: ClassVar[str] = "METADATA"
    topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FindCoordinator(Command):
    NAME: ClassVar[str] = "FIND_COORDINATOR"
    group: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Command):
    NAME: ClassVar[str] = "PUBLISH"
    topic: str
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Consume(Command):
    NAME: ClassVar[str] = "CONSUME"
    topic: str
    partition: int
    offset: int
    member: str | None = None
    group: str | None = None
    generation: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Stream(Command):
    NAME: ClassVar[str] = "STREAM"
    topic: str
    partition: int
    group: str | None = None
    member: str | None = None
    generation: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroup(Command):
    NAME: ClassVar[str] = "JOIN_GROUP"
    topic: str
    group: str
    member: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroup(Command):
    NAME: ClassVar[str] = "SYNC_GROUP"
    topic: str
    group: str
    member: str
    generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Command):
    NAME: ClassVar[str] = "HEARTBEAT"
    topic: str
    group: str
    member: str
    generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroup(Command):
    NAME: ClassVar[str] = "LEAVE_GROUP"
    topic: str
    group: str
    member: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffset(Command):
    NAME: ClassVar[str] = "COMMIT_OFFSET"
    topic: str
    partition: int
    group: str
    offset: int
    generation: int | None = None
    member: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchCommit(Command):
    """``offsets`` is the bare word ``P0:5,P1:7`` (partition: next offset)."""

    NAME: ClassVar[str] = "BATCH_COMMIT"
    topic: str
    group: str
    member: str
    generation: int
    offsets: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchOffset(Command):
    NAME: ClassVar[str] = "FETCH_OFFSET"
    topic: str
    partition: int
    group: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherCommand(Command):
    """A command with no typed class: the event-store commands the broker
    knows, and (with ``known=False``) any other upper-case word inside an
    envelope, which only the broker can judge."""

    command: str
    known: bool = True

    @property
    def name(self) -> str:
        return self.command


TYPED: dict[str, type[Command]] = {
    cls.NAME: cls
    for cls in (
        Create,
        Delete,
        List,
        Metadata,
        FindCoordinator,
        Publish,
        Consume,
        Stream,
        JoinGroup,
        SyncGroup,
        Heartbeat,
        LeaveGroup,
        CommitOffset,
        BatchCommit,
        FetchOffset,
    )
}
# Commands the broker knows that have no typed class here (event store).
OTHER = frozenset(
    {"APPEND_STREAM", "READ_STREAM", "SAVE_SNAPSHOT", "READ_SNAPSHOT", "STREAM_VERSION"}
)
KNOWN = frozenset(TYPED) | OTHER

# The written spec's positional forms (``CREATE <topic> <partitions>``): the
# field each bare word is, in order, when a command has no key=value word.
# None: a word the spec has and these classes do not (HEARTBEAT's consumer
# id before its member id), kept as a bare word. BATCH_COMMIT's offsets
# (``P0:5,P1:7``) follow its words, as in its key=value form.
POSITIONAL: dict[type[Command], tuple[str | None, ...]] = {
    Create: ("topic", "partitions"),
    Delete: ("topic",),
    Consume: ("topic", "partition", "offset"),
    Stream: ("topic", "partition", "offset"),
    JoinGroup: ("topic", "group", "member"),
    LeaveGroup: ("topic", "group", "member"),
    SyncGroup: ("topic", "group", "member", "generation"),
    Heartbeat: ("topic", "group", None, "member", "generation"),
    BatchCommit: ("topic", "group", "member", "generation"),
}

_COMMAND_WORD = re.compile(r"[A-Z][A-Z0-9_]*")
_OFFSET = re.compile(r"P(-?[0-9]+):(-?[0-9]+)")
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
_BASE = frozenset({"extra", "args", "command", "known", "offsets"})


def _typed_fields(cls: type[Command]) -> list[tuple[str, str, bool]]:
    """(name, type, required) of a class's keys, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in _BASE:
            continue
        required = f.default is dataclasses.MISSING
        out.append((f.name, str(f.type), required))
    return out


_FIELDS: dict[type[Command], list[tuple[str, str, bool]]] = {
    cls: _typed_fields(cls) for cls in TYPED.values()
}
# Each command's field types by name (parse_command looks every key up).
_TYPES: dict[type[Command], dict[str, str]] = {
    cls: {name: type_ for name, type_, _ in spec} for cls, spec in _FIELDS.items()
}


def first_word(text: str) -> str:
    """The command word of a text line (up to the first whitespace)."""
    parts = text.split(None, 1)
    return parts[0] if parts else ""


def looks_like_command(text: str) -> bool:
    """An upper-case word first: a command, known to us or not."""
    return _COMMAND_WORD.fullmatch(first_word(text)) is not None


def parse_command(text: str) -> Command:
    """A text line as a typed command. Raises ``RemoteProtocolError``:
    ``UNKNOWN_TYPE`` for a word that is no command we know (an ``OtherCommand``
    is returned instead when the word at least looks like one and ``known`` is
    false), ``MISSING_FIELD``/``PARSE`` for unusable fields."""
    name, pairs, args = _fields(text)
    cls = TYPED.get(name)
    if cls is None:
        if name in OTHER or _COMMAND_WORD.fullmatch(name):
            return OtherCommand(
                command=name, known=name in OTHER, extra=tuple(pairs), args=tuple(args)
            )
        raise RemoteProtocolError(Problem.UNKNOWN_TYPE, f"unknown command {name[:40]!r}")
    types = _TYPES[cls]
    values: dict[str, object] = {}
    extra: list[tuple[str, str]] = []
    form = POSITIONAL.get(cls)
    if form is not None and not pairs and args:
        # The spec's positional form: every word of it, or it is no command.
        if len(args) < len(form):
            words = " ".join(f"<{key or 'id'}>" for key in form)
            raise _invalid(Problem.MISSING_FIELD, f"{name} needs {words} (or key=value words)")
        kept: list[str] = []
        for key, value in zip(form, args, strict=False):
            if key is None:
                kept.append(value)
            else:
                values[key] = _convert(name, key, value, types[key])
        args = kept + args[len(form) :]
    for key, value in pairs:
        type_ = types.get(key)
        if type_ is not None and key not in values:
            values[key] = _convert(name, key, value, type_)
        else:
            extra.append((key, value))
    for key, _, required in _FIELDS[cls]:
        if required and key not in values:
            raise _invalid(Problem.MISSING_FIELD, f"{name} needs {key}=")
    if cls is BatchCommit:
        offsets, args = _offsets(args)
        values["offsets"] = offsets
    return cls(extra=tuple(extra), args=tuple(args), **values)


def _fields(text: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """A command line's word, its ``key=value`` pairs and its bare words,
    in order (as ``tokens`` reads them). Raises ``UNKNOWN_TYPE`` where no
    command word comes first."""
    pairs: list[tuple[str, str]] = []
    args: list[str] = []
    if not any(key in text for key in _REST_OF_LINE_KEYS):
        # Nearly every command: no value runs to the end of the line, so
        # its words are str.split()'s (the whitespace of tokens' \s+ runs),
        # taken without a Token each (a third of a commit's parse).
        words = text.split()
        if not words or words[0].find("=", 1) >= 0:
            raise RemoteProtocolError(Problem.UNKNOWN_TYPE, "text does not start with a command")
        for word in words[1:]:
            equals = word.find("=", 1)
            if equals < 0:
                args.append(word)
            else:
                pairs.append((word[:equals], word[equals + 1 :]))
        return words[0], pairs, args
    found = tokens(text, rest_of_line=REST_OF_LINE)
    if not found or found[0].key is not None:
        raise RemoteProtocolError(Problem.UNKNOWN_TYPE, "text does not start with a command")
    for w in found[1:]:
        if w.key is None:
            args.append(w.raw(text))
        else:
            pairs.append((w.key, w.value(text)))
    return found[0].raw(text), pairs, args


# What a word whose value runs to the end of the line starts with.
_REST_OF_LINE_KEYS = tuple(f"{key}=" for key in REST_OF_LINE)


def _convert(command: str, key: str, value: str, type_: str) -> object:
    if type_.startswith("int"):
        number = to_int(value)
        if number is None:
            raise _invalid(Problem.PARSE, f"{command} {key}={value[:40]!r} is not a 64-bit integer")
        return number
    if type_.startswith("bool"):
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise _invalid(Problem.PARSE, f"{command} {key}={value[:40]!r} is not a bool")
    return value


def _offsets(args: list[str]) -> tuple[tuple[tuple[int, int], ...], list[str]]:
    """The ``P0:5,P1:7`` word of a BATCH_COMMIT, and the bare words left."""
    rest: list[str] = []
    found: tuple[tuple[int, int], ...] | None = None
    for arg in args:
        if found is None:
            parts = arg.split(",")
            matches = [_OFFSET.fullmatch(p) for p in parts]
            if all(matches):
                pairs = [(to_int(m[1]), to_int(m[2])) for m in matches if m]
                good = [(p, o) for p, o in pairs if p is not None and o is not None]
                if len(good) != len(pairs):
                    raise _invalid(Problem.PARSE, f"BATCH_COMMIT offsets {arg[:40]!r} out of range")
                found = tuple(good)
                continue
        rest.append(arg)
    if found is None:
        raise _invalid(Problem.MISSING_FIELD, "BATCH_COMMIT needs offsets P<n>:<offset>")
    return found, rest


def format_command(cmd: Command) -> str:
    """The text line for ``cmd``. Raises ``LocalProtocolError`` for values that
    would not read back as written (whitespace, empty keys)."""
    name = cmd.name
    if not is_word(name) or "=" in name:
        raise LocalProtocolError(Problem.UNKNOWN_TYPE, f"bad command name {name!r}")
    words = [name]
    last: list[str] = []
    spec = _FIELDS.get(type(cmd), [])
    for key, _, _ in spec:
        value = getattr(cmd, key)
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        _add(words, last, key, text)
    for key, text in cmd.extra:
        _add(words, last, key, text)
    if isinstance(cmd, BatchCommit):
        if not cmd.offsets:
            raise LocalProtocolError(Problem.MISSING_FIELD, "BATCH_COMMIT needs offsets")
        words.append(",".join(f"P{p}:{o}" for p, o in cmd.offsets))
    for arg in cmd.args:
        if not is_word(arg) or arg.find("=") > 0:
            raise LocalProtocolError(Problem.PARSE, f"bare word {arg!r} would not read back")
        if isinstance(cmd, BatchCommit) and all(_OFFSET.fullmatch(p) for p in arg.split(",")):
            raise LocalProtocolError(Problem.PARSE, f"bare word {arg!r} reads as offsets")
        words.append(arg)
    if len(last) > 1:
        raise LocalProtocolError(Problem.PARSE, "only one value may run to the end of the line")
    words += last
    return " ".join(words)


def _add(words: list[str], last: list[str], key: str, value: str) -> None:
    if not is_word(key) or "=" in key:
        raise LocalProtocolError(Problem.PARSE, f"bad key {key!r}")
    if key in REST_OF_LINE:
        last.append(f"{key}={value}")
        return
    if value and not is_word(value):
        raise LocalProtocolError(Problem.PARSE, f"{key}={value!r} holds whitespace")
    words.append(f"{key}={value}")


def _invalid(problem: Problem, message: str) -> RemoteProtocolError:
    return RemoteProtocolError(problem, message, code=INVALID_COMMAND)
