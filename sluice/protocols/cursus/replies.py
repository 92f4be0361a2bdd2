"""What a broker sends back, as typed values.

- ``OkReply``: ``OK`` and words, mostly ``key=value`` (``OK`` alone answers a
  batch sent with acks=0);
- ``ErrorReply``: ``ERROR: <code>`` and words (``NOT_LEADER LEADER_IS h:p``,
  ``NOT_COORDINATOR host=h port=p``, ``decode_failed reason="…"``);
- ``StreamControl``: ``STREAM_CONTROL type=CLOSE reason=… offset=N``, the
  last frame of a STREAM;
- ``BatchAck``: the JSON a broker answers a batch with (acks 1 or -1);
- ``Keepalive``: a zero-length frame (every 5 s on a STREAM).

Batches (CONSUME answers, STREAM pushes) are ``batch.Batch``. Replies keep
their words as written, so a decoded reply encodes back to the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluice.protocols.cursus.errors import LocalProtocolError, Problem, RemoteProtocolError
from sluice.protocols.cursus.text import is_word, to_int, tokens, unquote

OK = "OK"
ERROR = "ERROR:"
STREAM_CONTROL = "STREAM_CONTROL"


@dataclass(frozen=True, slots=True)
class Keepalive:
    """A zero-length frame."""

    name = "KEEPALIVE"


def _fields(words: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in words:
        key, sep, value = w.partition("=")
        if sep and key and key not in out:
            out[key] = unquote(value)
    return out


@dataclass(frozen=True, slots=True)
class OkReply:
    """``OK`` followed by ``words``."""

    words: tuple[str, ...] = ()
    name = "OK"

    @classmethod
    def of(cls, *args: str, **fields: object) -> OkReply:
        """``OkReply.of(topic="t", partitions=4)`` → ``OK topic=t partitions=4``."""
        return cls((*args, *(f"{k}={v}" for k, v in fields.items())))

    @property
    def fields(self) -> dict[str, str]:
        """The ``key=value`` words (the first of each key; quotes undone)."""
        return _fields(self.words)

    def get(self, key: str) -> str | None:
        return self.fields.get(key)

    @property
    def assignments(self) -> list[int] | None:
        """Partitions of an ``assignments=[0 1]`` (or ``[0,1]``) word."""
        value = self.get("assignments")
        if value is None:
            return None
        inner = value.strip("[]").replace(",", " ").split()
        numbers = (to_int(p) for p in inner)
        return [n for n in numbers if n is not None]

    @property
    def text(self) -> str:
        return " ".join((OK, *self.words))


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``ERROR: <code>`` followed by ``words``."""

    code: str
    words: tuple[str, ...] = ()
    name = "ERROR"

    @classmethod
    def of(cls, code: str, *args: str, **fields: object) -> ErrorReply:
        return cls(code, (*args, *(f"{k}={v}" for k, v in fields.items())))

    @property
    def fields(self) -> dict[str, str]:
        return _fields(self.words)

    def get(self, key: str) -> str | None:
        return self.fields.get(key)

    @property
    def leader_is(self) -> str | None:
        """The address of a ``NOT_LEADER LEADER_IS <addr>``."""
        return leader_is((self.code, *self.words))

    @property
    def text(self) -> str:
        return " ".join((ERROR, self.code, *self.words)) if self.code else ERROR


def leader_is(words: tuple[str, ...] | list[str]) -> str | None:
    for i, w in enumerate(words[:-1]):
        if w == "LEADER_IS" and i > 0 and words[i - 1] == "NOT_LEADER":
            return words[i + 1]
    return None


@dataclass(frozen=True, slots=True)
class StreamControl:
    """The broker ending (or steering) a STREAM. ``reason`` is one of
    stopped, replaced, removed, timeout, error, offset_out_of_range."""

    type: str = "CLOSE"
    reason: str = ""
    offset: int | None = None
    requested: int | None = None
    earliest: int | None = None
    latest: int | None = None
    extra: tuple[tuple[str, str], ...] = ()
    name = "STREAM_CONTROL"

    @property
    def text(self) -> str:
        words = [STREAM_CONTROL, f"type={self.type}"]
        if self.reason:
            words.append(f"reason={self.reason}")
        for key in ("offset", "requested", "earliest", "latest"):
            value = getattr(self, key)
            if value is not None:
                words.append(f"{key}={value}")
        words += [f"{k}={v}" for k, v in self.extra]
        return " ".join(words)


_ACK_INTS = ("last_offset", "producer_epoch", "seq_start", "seq_end")


@dataclass(frozen=True, slots=True)
class BatchAck:
    """The JSON answer to a batch. ``leader`` (a Raft address, cluster mode
    only) and ``error`` are left out of the JSON when ``None``."""

    status: str = "OK"
    last_offset: int = 0
    producer_epoch: int = 0
    producer_id: str = ""
    seq_start: int = 0
    seq_end: int = 0
    leader: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    name = "ACK"

    @property
    def text(self) -> str:
        obj: dict[str, Any] = {
            "status": self.status,
            "last_offset": self.last_offset,
            "producer_epoch": self.producer_epoch,
            "producer_id": self.producer_id,
            "seq_start": self.seq_start,
            "seq_end": self.seq_end,
        }
        if self.leader is not None:
            obj["leader"] = self.leader
        if self.error is not None:
            obj["error"] = self.error
        for k, v in self.extra.items():
            if k in obj:
                raise LocalProtocolError(Problem.PARSE, f"ack field {k!r} given twice")
            obj[k] = v
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


Reply = OkReply | ErrorReply | StreamControl | BatchAck


def parse_reply_text(text: str) -> Reply:
    """A text (or JSON) reply as a typed value. Raises ``RemoteProtocolError``."""
    if text.startswith("{"):
        return _parse_ack(text)
    if '"' not in text and "[" not in text:
        # Nearly every reply: its words are str.split()'s, as tokens'
        # (no quoted value), taken without a Token each.
        plain = text.split()
        if plain and plain[0] != STREAM_CONTROL:
            return _reply_of(plain[0], tuple(plain[1:]))
    words = tokens(text, quoted=True)
    if not words:
        raise RemoteProtocolError(Problem.UNKNOWN_TYPE, "blank reply")
    first = words[0].raw(text)
    if first == STREAM_CONTROL:
        return _parse_stream_control(words[1:], text)
    return _reply_of(first, tuple(w.raw(text) for w in words[1:]))


def _reply_of(first: str, rest: tuple[str, ...]) -> Reply:
    """A reply from its words: the first, and the rest (not STREAM_CONTROL's)."""
    if first == OK:
        return OkReply(rest)
    if first == ERROR:
        if not rest:
            return ErrorReply("")
        return ErrorReply(rest[0], rest[1:])
    if first.startswith(ERROR):
        # "ERROR:code" with no space: the client still sees an error.
        return ErrorReply(first[len(ERROR) :], rest)
    raise RemoteProtocolError(Problem.UNKNOWN_TYPE, f"unknown reply {first[:40]!r}")


def _parse_stream_control(words: list[Any], text: str) -> StreamControl:
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for w in words:
        key, value = w.key, w.value(text)
        if key in ("type", "reason") and key not in values:
            values[key] = value
        elif key in ("offset", "requested", "earliest", "latest") and key not in values:
            number = to_int(value)
            if number is None:
                raise RemoteProtocolError(
                    Problem.PARSE, f"STREAM_CONTROL {key}={value[:40]!r} is not an integer"
                )
            values[key] = number
        elif key is not None:
            extra.append((key, value))
        else:
            raise RemoteProtocolError(
                Problem.PARSE, f"STREAM_CONTROL has a bare word {w.raw(text)[:40]!r}"
            )
    if "type" not in values:
        raise RemoteProtocolError(Problem.MISSING_FIELD, "STREAM_CONTROL without type=")
    return StreamControl(**values, extra=tuple(extra))


def _parse_ack(text: str) -> BatchAck:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError(Problem.PARSE, f"batch ack is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(Problem.PARSE, "batch ack is not a JSON object")
    values: dict[str, Any] = {}
    for key in ("status", "producer_id", "leader", "error"):
        if key in obj:
            if not isinstance(obj[key], str):
                raise RemoteProtocolError(Problem.PARSE, f"batch ack {key} is not a string")
            values[key] = obj.pop(key)
    for key in _ACK_INTS:
        if key in obj:
            value = obj.pop(key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise RemoteProtocolError(Problem.PARSE, f"batch ack {key} is not an integer")
            values[key] = value
    if "status" not in values:
        raise RemoteProtocolError(Problem.MISSING_FIELD, "batch ack without status")
    return BatchAck(**values, extra=obj)


def format_reply(reply: Reply) -> str:
    """The text of ``reply``. Raises ``LocalProtocolError`` for words that
    would not read back as written."""
    if isinstance(reply, OkReply | ErrorReply):
        words = reply.words if isinstance(reply, OkReply) else (reply.code, *reply.words)
        if isinstance(reply, ErrorReply) and not reply.code and reply.words:
            raise LocalProtocolError(Problem.PARSE, "an ERROR: with words needs a code")
        for w in words:
            if not _reads_back(w):
                raise LocalProtocolError(Problem.PARSE, f"reply word {w!r} would not read back")
    elif isinstance(reply, StreamControl):
        for key, value in (("type", reply.type), ("reason", reply.reason), *reply.extra):
            if (value and not is_word(value)) or not is_word(key) or "=" in key:
                raise LocalProtocolError(Problem.PARSE, f"{key}={value!r} would not read back")
        if not reply.type:
            raise LocalProtocolError(Problem.MISSING_FIELD, "STREAM_CONTROL needs a type")
    return reply.text


def _reads_back(word: str) -> bool:
    if not word:
        return False
    found = tokens(word, quoted=True)
    return len(found) == 1 and found[0].start == 0 and found[0].end == len(word)
