"""Cursus's flavour of the neutral protocol errors.

A Cursus broker refuses bad input with an ``ERROR:`` text line, and for some
problems hangs up afterwards. Every error the Cursus codec raises carries
what the broker would do about it: ``code`` (the word after ``ERROR:``),
``reason`` (its ``reason=`` field) and ``closes``. ``refusal()`` turns that
into the exact reply; protocol-neutral code still catches the base classes of
``sluice.protocols.errors`` and reads ``problem``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.protocols import errors as neutral
from sluice.protocols.errors import Problem

__all__ = [
    "DECODE_FAILED",
    "INVALID_COMMAND",
    "MALFORMED_INPUT",
    "MISSING_TOPIC_OR_PAYLOAD",
    "LocalProtocolError",
    "Problem",
    "ProtocolError",
    "Refusal",
    "RemoteProtocolError",
    "refusal",
]

# Seen on the wire: a body that is neither batch, command nor envelope.
MALFORMED_INPUT = "malformed_input"
MISSING_TOPIC_OR_PAYLOAD = "missing_topic_or_payload"
# Seen on the wire: a body the broker could not decode (e.g. a bad topic length).
DECODE_FAILED = "decode_failed"
# Not seen: what we answer for a known command with unusable fields.
INVALID_COMMAND = "invalid_command"


def _default_code(problem: Problem) -> str:
    if problem is Problem.MISSING_FIELD:
        return INVALID_COMMAND
    return DECODE_FAILED


class ProtocolError(neutral.ProtocolError):
    """A violation of the Cursus wire protocol, with the broker's answer to it."""

    def __init__(
        self,
        problem: Problem,
        message: str,
        *,
        fatal: bool = False,
        code: str | None = None,
        reason: str | None = None,
        closes: bool | None = None,
    ) -> None:
        super().__init__(problem, message, fatal=fatal)
        self.code = code if code is not None else _default_code(problem)
        self.reason = reason if reason is not None else message
        # Lost framing always ends the connection.
        self.closes = fatal if closes is None else (closes or fatal)


class RemoteProtocolError(ProtocolError, neutral.RemoteProtocolError):
    """The peer sent bytes that break the Cursus protocol."""


class LocalProtocolError(ProtocolError, neutral.LocalProtocolError):
    """We were asked to emit something that would break the Cursus protocol."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """How the broker refuses a frame: the ``ERROR:`` line it answers with
    (``None``: it answers nothing) and whether it then closes."""

    text: str | None
    close: bool

    @property
    def body(self) -> bytes | None:
        return None if self.text is None else self.text.encode()


def refusal(error: ProtocolError) -> Refusal:
    """What the broker answers to the problem ``error`` describes.

    Lost framing (an oversize frame, a stream cut short) gets no answer: the
    broker closes at once. Bodies it cannot
    classify get ``ERROR: malformed_input reason=missing_topic_or_payload`` and
    a close; bodies it cannot decode get ``ERROR: decode_failed reason="…"``
    (the reason quoted, as the broker writes it) on a connection that stays up.
    """
    if error.fatal:
        return Refusal(None, True)
    if error.code == MALFORMED_INPUT:
        return Refusal(f"ERROR: {MALFORMED_INPUT} reason={error.reason}", error.closes)
    return Refusal(f"ERROR: {error.code} reason={quote(error.reason)}", error.closes)


def quote(text: str) -> str:
    """A double-quoted value with backslash escapes, as Go's ``%q`` writes ASCII text."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
